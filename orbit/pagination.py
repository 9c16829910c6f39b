"""List paging (docs/api/conventions.md#lists): ``?limit=`` (default 50, max 500) and opaque
cursors bound to their filters.

A cursor is base64url of ``{"p": <position>, "f": <filters fingerprint>}``: reusing it with
other filters, or sending a damaged one, answers 400 ``invalid_request`` (field ``cursor``).
"""

from __future__ import annotations

import base64
import binascii
from typing import Any

import msgspec

from orbit.errors import InvalidRequest
from orbit.ids import digest

DEFAULT_LIMIT = 50
MAX_LIMIT = 500
_ENC = msgspec.json.Encoder(order="sorted")


def parse_limit(raw: str | None, default: int = DEFAULT_LIMIT, maximum: int = MAX_LIMIT) -> int:
    """The ``limit`` query parameter: 1..maximum, else 400 naming ``limit``."""
    if raw is None or raw == "":
        return default
    if not (raw.isascii() and raw.isdigit()) or not 1 <= int(raw) <= maximum:
        raise InvalidRequest(f"limit must be an integer from 1 to {maximum}", field="limit")
    return int(raw)


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
