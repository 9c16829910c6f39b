"""How the SDK reads and writes JSON: business JSON is never refused or re-spelled.

* Bytes in, bytes out: payloads, results, effect results, workflow input/output and signal
  payloads travel as :class:`msgspec.Raw` (the exact bytes); a handler or an effect that
  returns ``msgspec.Raw`` sends exactly those bytes.
* Writing: ``Decimal`` is written as a JSON number with its digits (never as a string).
* Reading into Python values follows the type asked for: ``msgspec.Raw`` keeps the bytes,
  ``Decimal`` (or a Struct/dataclass field typed ``Decimal``) keeps every digit; ``Any`` (the
  default) gives ``int`` and ``float`` as Python's ``json`` does — except a number a float
  cannot hold at all (beyond ±1.8e308, or so small that a float would make it 0), which
  comes as ``Decimal`` instead of failing. No valid JSON number makes decoding fail.
"""

from __future__ import annotations

import builtins
import contextlib
import math
from decimal import Decimal
from typing import Any, TypeVar, overload

import msgspec

__all__ = ["ENCODER", "decode", "decoder", "number"]


def number(text: str) -> float | Decimal:
    """A non-integral JSON number as a Python value: ``float``, or ``Decimal`` when a float
    would lose it entirely (infinite, or zero for a non-zero number)."""
    value = float(text)
    if math.isinf(value):
        return Decimal(text)
    if value == 0.0:
        mantissa = text.lower().split("e", 1)[0]
        if mantissa.strip("-+0.") != "":
            return Decimal(text)
    return value


#: Writes ``Decimal`` as a JSON number (its digits), ``msgspec.Raw`` as its bytes.
ENCODER = msgspec.json.Encoder(decimal_format="number")

T = TypeVar("T")

_DECODERS: dict[Any, msgspec.json.Decoder[Any]] = {}


@overload
def decoder(type: builtins.type[T]) -> msgspec.json.Decoder[T]: ...
@overload
def decoder(type: object = ...) -> msgspec.json.Decoder[Any]: ...
def decoder(type: Any = Any) -> msgspec.json.Decoder[Any]:
    """The (cached) decoder for ``type`` that reads every JSON number (see the module)."""
    try:
        return _DECODERS[type]
    except (KeyError, TypeError):
        pass
    dec: msgspec.json.Decoder[Any] = msgspec.json.Decoder(type, float_hook=number)
    with contextlib.suppress(TypeError):  # an unhashable type annotation: not cached
        _DECODERS[type] = dec
    return dec


@overload
def decode(data: bytes | str | msgspec.Raw, type: builtins.type[T]) -> T: ...
@overload
def decode(data: bytes | str | msgspec.Raw, type: object = ...) -> Any: ...
def decode(data: bytes | str | msgspec.Raw, type: Any = Any) -> Any:
    """Decode JSON into ``type`` (default ``Any``) by the rules of the module docstring."""
    return decoder(type).decode(data)
