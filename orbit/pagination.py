"""List paging (docs/api/conventions.md#lists): ``?limit=`` (default 50, max 500), opaque
cursors bound to their filters, and a byte budget per page.

A page of items that carry stored JSON (tasks, result events) holds at most
``max_page_bytes`` (default 4 MiB) of it: the page is sized first (the keys and byte counts
of its rows), cut where the budget is reached, and only those rows are read, so a list of
large payloads costs the node one page's budget however large ``limit`` is. The first item
is always included, so a page is never empty while items remain.

A cursor is base64url of ``{"p": <position>, "f": <filters fingerprint>}``: reusing it with
other filters, or sending a damaged one, answers 400 ``invalid_request`` (field ``cursor``).
"""

from __future__ import annotations

import base64
import binascii
from collections.abc import Iterable
from typing import Any

import msgspec

from orbit.errors import InvalidRequest
from orbit.ids import digest

DEFAULT_LIMIT = 50
MAX_LIMIT = 500
#: Most bytes of stored JSON (payloads, results, errors) one list page carries, by default.
MAX_PAGE_BYTES = 4 * 1024 * 1024
_ENC = msgspec.json.Encoder(order="sorted")


def parse_limit(raw: str | None, default: int = DEFAULT_LIMIT, maximum: int = MAX_LIMIT) -> int:
    """The ``limit`` query parameter: 1..maximum, else 400 naming ``limit``."""
    if raw is None or raw == "":
        return default
    if not (raw.isascii() and raw.isdigit()) or not 1 <= int(raw) <= maximum:
        raise InvalidRequest(f"limit must be an integer from 1 to {maximum}", field="limit")
    return int(raw)


def fitting(sizes: Iterable[int], max_bytes: int) -> int:
    """How many leading items of ``sizes`` one page carries: every one while their total stays
    within ``max_bytes``, and always the first."""
    total = count = 0
    for size in sizes:
        total += size
        if count and total > max_bytes:
            break
        count += 1
    return count


def _fingerprint(filters: dict[str, Any]) -> str:
    return digest(_ENC.encode(filters)).hex()[:16]


def encode_cursor(position: dict[str, Any], filters: dict[str, Any] | None = None) -> str:
    """An opaque cursor for ``position`` (JSON-encodable), bound to ``filters``."""
    raw = _ENC.encode({"p": position, "f": _fingerprint(filters or {})})
    return base64.urlsafe_b64encode(raw).rstrip(b"=").decode()


def decode_cursor(
    cursor: str | None, filters: dict[str, Any] | None = None
) -> dict[str, Any] | None:
    """The position of ``cursor`` (None when absent); 400 when damaged or bound to other filters."""
    if cursor is None or cursor == "":
        return None
    try:
        raw = base64.urlsafe_b64decode(cursor + "=" * (-len(cursor) % 4))
        data = msgspec.json.decode(raw, type=dict[str, Any])
    except (binascii.Error, ValueError, msgspec.DecodeError):
        raise InvalidRequest("cursor is not valid", field="cursor") from None
    position = data.get("p")
    if data.get("f") != _fingerprint(filters or {}) or not isinstance(position, dict):
        raise InvalidRequest("cursor does not belong to this query", field="cursor")
    return position
