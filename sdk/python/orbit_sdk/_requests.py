"""Small request/response helpers shared by the schedule, workflow and subscription groups.

* :func:`conditional_headers` — ``If-Match`` / ``If-None-Match: *`` for conditional PUTs and
  control calls.
* :func:`utc_text` — a time as the API's RFC 3339 UTC text (naive datetimes are UTC).
* :func:`decode_resource` — decode a body and copy ``ETag`` and "was it created" onto it.
* :func:`iterate_pages` — follow ``next_cursor`` page by page.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Awaitable, Callable
from datetime import UTC, datetime
from typing import TypeVar

import httpx

from . import _json
from .types import Page

__all__ = ["conditional_headers", "decode_resource", "iterate_pages", "utc_text"]

T = TypeVar("T")


def conditional_headers(if_match: str | int | None, create_only: bool = False) -> dict[str, str]:
    """``If-Match`` (an ETag as returned, or a bare revision number) and ``If-None-Match: *``."""
    headers: dict[str, str] = {}
    if if_match is not None:
        headers["If-Match"] = f'"{if_match}"' if isinstance(if_match, int) else if_match
    if create_only:
        headers["If-None-Match"] = "*"
    return headers


def utc_text(value: datetime | str) -> str:
    """``2026-11-29T21:30:00.123456Z``. An aware datetime is converted to UTC; a naive one is
    taken as UTC (the server's convention); a string is sent as given."""
    if isinstance(value, str):
        return value
    if value.tzinfo is not None:
        value = value.astimezone(UTC).replace(tzinfo=None)
    return value.strftime("%Y-%m-%dT%H:%M:%S.%fZ")


def decode_resource(response: httpx.Response, type: type[T]) -> T:
    """Decode ``response`` as ``type``; set its ``etag`` (from the ``ETag`` header) and
    ``created`` (HTTP 201) attributes when the type has them."""
    obj = _json.decode(response.content or b"{}", type)
    fields = getattr(type, "__struct_fields__", ())
    if "etag" in fields:
        obj.etag = response.headers.get("etag")  # type: ignore[attr-defined]
    if "created" in fields:
        obj.created = response.status_code == 201  # type: ignore[attr-defined]
    return obj


async def iterate_pages(
    fetch: Callable[[str | None], Awaitable[Page[T]]],
) -> AsyncIterator[T]:
    """Every item of every page: ``fetch(cursor)`` returns one page; stops at the page whose
    ``next_cursor`` is null."""
    cursor: str | None = None
    while True:
        page = await fetch(cursor)
        for item in page.items:
            yield item
        if not page.next_cursor:
            return
        cursor = page.next_cursor
