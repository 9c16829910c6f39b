"""JSON values as the definition language sees them, with exact numbers.

Business JSON keeps its numbers (docs/invariants.md#10-business-json-keeps-its-numbers;
the one rule is :mod:`orbit.business_json`): non-integral numbers decode to ``Decimal``
values that remember their text and encode back exactly as written, so a value copied from
an instance input into a task payload is neither re-rounded through ``float`` nor
re-spelled.
"""

from __future__ import annotations

from decimal import Decimal
from typing import Any

from orbit import business_json


def decode(data: bytes | str) -> Any:
    """Decode JSON text; numbers exactly as written (:class:`orbit.business_json.Number`
    for non-integral ones). Raises msgspec.DecodeError."""
    return business_json.decode(data)


def encode(value: Any) -> bytes:
    """Encode a value (numbers keep their digits and their spelling)."""
    return business_json.encode(value)


def canonical(value: Any) -> bytes:
    """Canonical bytes: keys sorted, no whitespace. Used for definition digests."""
    return business_json.canonical(value)


def is_number(value: Any) -> bool:
    """JSON numbers are ints and Decimals (and floats from Python callers), never bools."""
    return isinstance(value, int | float | Decimal) and not isinstance(value, bool)


def json_equal(a: Any, b: Any) -> bool:
    """JSON equality: numbers by value (1 == 1.0), true is not 1, objects ignore key order."""
    if is_number(a) and is_number(b):
        return (
            Decimal(str(a)) == Decimal(str(b))
            if isinstance(a, float) or isinstance(b, float)
            else a == b
        )
    if isinstance(a, bool) or isinstance(b, bool):
        return isinstance(a, bool) and isinstance(b, bool) and a is b
    if a is None or b is None:
        return a is None and b is None
    if isinstance(a, str) or isinstance(b, str):
        return isinstance(a, str) and isinstance(b, str) and a == b
    if isinstance(a, list) and isinstance(b, list):
        return len(a) == len(b) and all(json_equal(x, y) for x, y in zip(a, b, strict=True))
    if isinstance(a, dict) and isinstance(b, dict):
        return a.keys() == b.keys() and all(json_equal(a[k], b[k]) for k in a)
    return False
