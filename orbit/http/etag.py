"""HTTP side of conditional requests: parse ``If-Match`` / ``If-None-Match`` into
:class:`orbit.preconditions.Preconditions`, and the ``ETag`` header value."""

from __future__ import annotations

from starlette.requests import HTTPConnection

from orbit.preconditions import Preconditions, etag, parse_tags

__all__ = ["Preconditions", "etag", "not_modified", "preconditions"]


def preconditions(conn: HTTPConnection) -> Preconditions:
    """Parse ``If-Match`` and ``If-None-Match``."""
    if_match: frozenset[int] | None = None
    match_any = False
    raw = conn.headers.get("if-match")
    if raw is not None:
        match_any, if_match = parse_tags(raw)
    none_any = False
    none_tags: frozenset[int] = frozenset()
    raw = conn.headers.get("if-none-match")
    if raw is not None:
        none_any, none_tags = parse_tags(raw)
    return Preconditions(if_match, match_any, none_any, none_tags)


def not_modified(conn: HTTPConnection, revision: int) -> bool:
    """True when a GET's ``If-None-Match`` names ``revision`` (answer 304)."""
    p = preconditions(conn)
    return p.if_none_match_any or revision in p.if_none_match
