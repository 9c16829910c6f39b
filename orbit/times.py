"""Wire format of times: RFC 3339 UTC with exactly six fractional digits and ``Z``.

Stored times are naive ``datetime`` values in UTC (``DATETIME(6)``, sessions at ``+00:00``).
"""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Annotated, Any

import msgspec

#: JSON Schema of the times :func:`parse_time` accepts: RFC 3339 with an offset, at most six
#: fractional digits, seconds 00-59.
TIME_JSON_SCHEMA: dict[str, Any] = {
    "format": "date-time",
    "pattern": r"^(?!0000)[0-9]{4}-[0-9]{2}-[0-9]{2}[Tt][0-9]{2}:[0-9]{2}:[0-5][0-9]"
    r"(\.[0-9]{1,6})?([Zz]|[+-]([01][0-9]|2[0-3]):[0-5][0-9])$",
}
#: A time field or parameter as the OpenAPI document describes it (the value is still read
#: with :func:`parse_time`, which names the field on a 400).
Time = Annotated[str, msgspec.Meta(extra_json_schema=TIME_JSON_SCHEMA)]


def format_time(value: datetime) -> str:
    """``2026-11-29T21:30:00.123456Z`` (naive values are taken as UTC)."""
    if value.tzinfo is not None:
        value = value.astimezone(UTC).replace(tzinfo=None)
    return value.strftime("%Y-%m-%dT%H:%M:%S.%fZ")


def format_opt(value: datetime | None) -> str | None:
    return None if value is None else format_time(value)


def parse_time(text: str) -> datetime:
    """Parse RFC 3339 with an offset (``Z`` or ``±hh:mm``) into a naive UTC datetime.

    Raises ValueError for text without an offset or not in RFC 3339 form. More than six
    fractional digits are rejected rather than rounded (docs/mysql-notes.md: MariaDB truncates,
    MySQL rounds).
    """
    raw = text.strip()
    if "T" not in raw and "t" not in raw:
        raise ValueError("expected RFC 3339 date-time, e.g. 2026-11-29T21:30:00.123456Z")
    if raw.endswith(("Z", "z")):
        raw = raw[:-1] + "+00:00"
    frac = raw.split(".", 1)[1] if "." in raw else ""
    digits = len(frac) - len(frac.lstrip("0123456789"))
    if digits > 6:
        raise ValueError("at most 6 fractional digits")
    value = datetime.fromisoformat(raw)
    if value.tzinfo is None:
        raise ValueError("a time zone offset is required (use Z for UTC)")
    try:
        return value.astimezone(UTC).replace(tzinfo=None)
    except OverflowError:  # the offset moves it past year 1 or 9999
        raise ValueError("the time is out of range") from None
