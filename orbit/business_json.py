"""Business JSON: one rule for payloads, results, effect results, workflow input and
output, signal payloads and the details of errors a worker reports.

* **Accepted**: any JSON text (RFC 8259) in UTF-8, within the request's depth limit — every
  number whatever its magnitude or precision (``1e400``, ``-0``, ``10.10``, ``1E+2``,
  ``123456789012345678901234567890``). :func:`check_json_text` is the one check, applied at
  every entry point before anything is written; it judges the text the way the database's
  ``JSON_VALID`` will (well-formed, valid UTF-8, no unpaired surrogate escapes).
* **Kept**: the text is stored as received and returned byte for byte (``msgspec.Raw``).
* **Read exactly**: where the server has to look inside — a report's digest, an error's
  details, a workflow expression copying a value — :func:`decode` gives every non-integral
  number as a :class:`Number` (a ``Decimal`` that remembers how it was written) and every
  integer as ``int`` (``-0`` and integers too long for ``int`` as :class:`Number` too), and
  :func:`encode` writes each of them back exactly as it was written. So a value copied from
  one business document into another keeps its spelling, and nothing is ever rounded
  through a float.

Every encoder of the server that may meet a decoded value passes :func:`enc_hook`.
"""

from __future__ import annotations

import re
from decimal import Decimal
from typing import Any

import msgspec

from orbit.errors import InvalidRequest

__all__ = [
    "Number",
    "canonical",
    "canonical_text",
    "canonical_value",
    "check_json_text",
    "decode",
    "enc_hook",
    "encode",
]


class Number(Decimal):
    """A JSON number as written: its value (a ``Decimal``; arithmetic gives plain
    ``Decimal``) and its text, which :func:`encode` and ``str()`` give back unchanged."""

    __slots__ = ("text",)
    text: str

    def __new__(cls, text: str, value: str | None = None) -> Number:
        self = super().__new__(cls, text if value is None else value)
        self.text = text
        return self

    def __str__(self) -> str:
        return self.text

    def __repr__(self) -> str:
        return f"Number({self.text!r})"

    def __reduce__(self) -> tuple[Any, ...]:
        return (type(self), (self.text,))


def enc_hook(value: Any) -> Any:
    """msgspec ``enc_hook``: a :class:`Number` is written as its original text."""
    if isinstance(value, Number):
        return msgspec.Raw(value.text.encode())
    raise NotImplementedError(f"cannot encode {type(value).__name__}")


_DECODER = msgspec.json.Decoder(float_hook=Number)
_ENCODER = msgspec.json.Encoder(decimal_format="number", enc_hook=enc_hook)
_CANONICAL = msgspec.json.Encoder(decimal_format="number", order="sorted", enc_hook=enc_hook)
_ONE_RAW = msgspec.json.Decoder(tuple[msgspec.Raw])
_DIGEST_DECODER = msgspec.json.Decoder(float_hook=Decimal)

# Integer tokens msgspec would not give back as written: ``-0`` (an int has no sign of
# zero) and integers longer than Python converts (4,300 digits). Strings are matched first
# (possessively, one pass) so that nothing inside them is touched.
_SPECIAL_INTS = re.compile(
    rb'"(?>[^"\\]++|\\.)*+"|(?<![0-9.eE+\-])(-?(?:0|[0-9]{4000,}))(?![0-9.eE])', re.DOTALL
)


def _marker(data: bytes) -> bytes:
    """An exponent suffix that occurs nowhere in ``data`` (so no number written by the
    sender can end with it)."""
    zeros = 3
    while b"e+" + b"0" * zeros in data:
        zeros += 1
    return b"e+" + b"0" * zeros


def _decode_special(data: bytes) -> Any:
    """Decode with the special integers rewritten as floats carrying a unique marker, which
    the float hook strips again: each becomes a :class:`Number` with its exact text."""
    marker = _marker(data)
    suffix = marker.decode()

    def mark(m: re.Match[bytes]) -> bytes:
        token = m.group(1)
        if token is None or token == b"0":
            return m.group(0)
        return token + marker

    def hook(text: str) -> Number:
        if text.endswith(suffix):
            written = text[: -len(suffix)]
            return Number(written, written)
        return Number(text)

    return msgspec.json.Decoder(float_hook=hook).decode(_SPECIAL_INTS.sub(mark, data))


def decode(data: bytes | bytearray | str) -> Any:
    """Decode business JSON with its numbers exact (see the module docstring). Raises
    ``msgspec.DecodeError`` for text that is not JSON."""
    raw = data.encode() if isinstance(data, str) else bytes(data)
    if b"-0" not in raw:
        try:
            return _DECODER.decode(raw)
        except msgspec.ValidationError as exc:
            if "out of range" not in str(exc):
                raise
    return _decode_special(raw)


def canonical_text(data: bytes) -> bytes:
    """The canonical form of a JSON text for digests: keys sorted, no whitespace, every
    number by its exact value (never rounded through a float, so different numbers never
    share a digest; ``1e5`` and ``1E+5`` do). Faster than :func:`decode` + :func:`canonical`
    (plain ``Decimal``: spelling is not kept). A text it cannot read as values (not JSON, or
    an integer beyond 4,300 digits) is returned as is, so its digest is still stable."""
    try:
        return _CANONICAL.encode(_DIGEST_DECODER.decode(data))
    except (msgspec.DecodeError, RecursionError):
        return bytes(data)


def canonical_value(data: bytes) -> Any:
    """A JSON text as a value to embed in a larger canonical document: its values decoded
    as in :func:`canonical_text` (or, when that cannot read it, its bytes as they are)."""
    try:
        return _DIGEST_DECODER.decode(data)
    except (msgspec.DecodeError, RecursionError):
        return msgspec.Raw(bytes(data))


def encode(value: Any) -> bytes:
    """Encode a value; every :class:`Number` as written, other ``Decimal`` as numbers."""
    return _ENCODER.encode(value)


def canonical(value: Any) -> bytes:
    """Canonical bytes of a decoded value (keys sorted, compact, numbers as written): the
    input of digests."""
    return _CANONICAL.encode(value)


def check_json_text(value: bytes, field: str) -> str:
    """The text of one business JSON value, validated the way the database's JSON_VALID will
    judge it: well-formed (control characters and unpaired surrogate escapes rejected by
    msgspec's parser) and valid UTF-8 (no encoded surrogates). Numbers are *not*
    range-checked: ``1e400`` or a 40-digit integer is valid JSON and is stored verbatim.
    Raises 400 naming ``field``."""
    try:
        (_,) = _ONE_RAW.decode(b"[" + value + b"]")
        return value.decode("utf-8")
    except (msgspec.DecodeError, UnicodeDecodeError, ValueError, RecursionError) as exc:
        raise InvalidRequest(f"{field} is not valid JSON: {exc}", field=field) from exc
