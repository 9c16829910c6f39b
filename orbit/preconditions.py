"""Conditional requests on mutable configuration: ``If-Match`` / ``If-None-Match``
(docs/api/conventions.md#revisions-and-conditional-requests).

A resource's ETag is its revision in quotes: ``"3"``. ``If-Match`` compares strongly: a weak
tag (``W/"3"``) never matches. Services evaluate :class:`Preconditions` inside their
transaction, against the revision of the row they locked, so check and write are atomic.
The HTTP layer parses the headers (``orbit.http.etag.preconditions``).
"""

from __future__ import annotations

from dataclasses import dataclass

from orbit.errors import PreconditionFailed


def etag(revision: int) -> str:
    """The ETag header value of ``revision``."""
    return f'"{revision}"'


def parse_tags(value: str) -> tuple[bool, frozenset[int]]:
    """(star, strong revisions) of an If-Match / If-None-Match header value."""
    star = False
    revisions: set[int] = set()
    for part in value.split(","):
        tag = part.strip()
        if tag == "*":
            star = True
        elif (
            len(tag) >= 3
            and tag[0] == tag[-1] == '"'
            and tag[1:-1].isascii()
            and tag[1:-1].isdigit()
        ):
            revisions.add(int(tag[1:-1]))
        # weak or malformed tags match nothing
    return star, frozenset(revisions)


@dataclass(frozen=True, slots=True)
class Preconditions:
    """The conditional headers of a request.

    ``if_match`` None: no If-Match header. An If-Match header whose tags are all weak or
    malformed gives an empty set, which never matches (412).
    """

    if_match: frozenset[int] | None = None
    if_match_any: bool = False
    if_none_match_any: bool = False
    if_none_match: frozenset[int] = frozenset()

    @property
    def create_only(self) -> bool:
        """``If-None-Match: *``: the request may only create."""
        return self.if_none_match_any

    def expected_revision(self) -> int | None:
        """The single revision If-Match names, when it names exactly one."""
        if self.if_match is not None and len(self.if_match) == 1:
            return next(iter(self.if_match))
        return None

    def check(self, current_revision: int | None) -> None:
        """Raise 412 unless the preconditions hold for a resource at ``current_revision``
        (None: the resource does not exist)."""
        exists = current_revision is not None
        if self.if_none_match_any and exists:
            raise PreconditionFailed(
                "the resource exists (If-None-Match: *)", current_revision=current_revision
            )
        if self.if_match_any and not exists:
            raise PreconditionFailed("the resource does not exist (If-Match: *)")
        matched = exists and current_revision in (self.if_match or ())
        if self.if_match is not None and not self.if_match_any and not matched:
            raise PreconditionFailed(
                "If-Match does not match the current revision", current_revision=current_revision
            )
