"""Value types of the definition language: what a path or an expression is known to hold.

A type is declared in a definition with a small spec (docs/workflows.md, "Types")::

    "null" | "bool" | "number" | "string" | "json"
    {"array": <type>}
    {"object": {"<field>": <type>, ...}}     # listed fields are present, others may exist
    {"nullable": <type>}

``json`` is the unknown type: any JSON value, checked at run time where it is used.
The meaning of "expression E has type T" is: *if E evaluates without a run-time error, its
value has type T*. Run-time values are what :func:`weave.definition.jsonvalue.decode` gives:
``None``, ``bool``, ``int``/``Decimal`` numbers, ``str``, ``list`` and ``dict``.
"""

from __future__ import annotations

from dataclasses import dataclass
from decimal import Decimal
from enum import StrEnum
from typing import Any


class Kind(StrEnum):
    """The kind of a value type."""

    NULL = "null"  # only JSON null
    BOOL = "bool"  # true or false
    NUMBER = "number"  # any JSON number
    STRING = "string"  # any JSON string
    ARRAY = "array"  # a JSON array whose items have ``items``
    OBJECT = "object"  # a JSON object with at least the declared ``fields``
    JSON = "json"  # unknown: any JSON value (checked at run time)


@dataclass(frozen=True)
class VType:
    """A value type. ``nullable`` adds JSON null to the values of the kind."""

    kind: Kind
    nullable: bool = False
    items: VType | None = None
    fields: tuple[tuple[str, VType], ...] = ()

    def __str__(self) -> str:
        if self.kind is Kind.ARRAY:
            base = f"array of {self.items}"
        elif self.kind is Kind.OBJECT:
            inner = ", ".join(f"{k}: {v}" for k, v in self.fields)
            base = f"object {{{inner}}}"
        else:
            base = self.kind.value
        return (
            f"nullable {base}"
            if self.nullable and self.kind not in (Kind.NULL, Kind.JSON)
            else base
        )

    @property
    def is_json(self) -> bool:
        return self.kind is Kind.JSON

    def field(self, name: str) -> VType | None:
        """The declared type of field ``name``, or None when undeclared."""
        for k, v in self.fields:
            if k == name:
                return v
        return None

    def as_nullable(self) -> VType:
        if self.nullable or self.kind in (Kind.NULL, Kind.JSON):
            return self
        return VType(self.kind, True, self.items, self.fields)

    def admits(self, kind: Kind) -> bool:
        """True when a value of ``kind`` may have this type (JSON admits every kind)."""
        if self.kind is Kind.JSON or self.kind is kind:
            return True
        return kind is Kind.NULL and self.nullable


JSON = VType(Kind.JSON)
NULL = VType(Kind.NULL)
BOOL = VType(Kind.BOOL)
NUMBER = VType(Kind.NUMBER)
STRING = VType(Kind.STRING)

_SCALARS = {"null": NULL, "bool": BOOL, "number": NUMBER, "string": STRING, "json": JSON}
MAX_TYPE_DEPTH = 16


class TypeSpecError(ValueError):
    """A type spec is malformed; ``where`` is a dotted location inside the spec."""

    def __init__(self, reason: str, where: str = "") -> None:
        super().__init__(reason)
        self.reason = reason
        self.where = where


def parse_type(spec: Any, where: str = "", depth: int = 0) -> VType:
    """Parse a type spec (see the module docstring). Raises :class:`TypeSpecError`."""
    if depth > MAX_TYPE_DEPTH:
        raise TypeSpecError(f"type nested deeper than {MAX_TYPE_DEPTH} levels", where)
    if isinstance(spec, str):
        if spec in _SCALARS:
            return _SCALARS[spec]
        raise TypeSpecError(
            f"unknown type {spec!r} (expected null, bool, number, string, json, "
            "or an object with array, object or nullable)",
            where,
        )
    if isinstance(spec, dict) and len(spec) == 1:
        ((key, inner),) = spec.items()
        if key == "array":
            return VType(Kind.ARRAY, items=parse_type(inner, f"{where}.array", depth + 1))
        if key == "nullable":
            return parse_type(inner, f"{where}.nullable", depth + 1).as_nullable()
        if key == "object":
            if not isinstance(inner, dict):
                raise TypeSpecError("object type needs an object of field types", where)
            fields = tuple(
                (str(name), parse_type(t, f"{where}.object.{name}", depth + 1))
                for name, t in inner.items()
            )
            return VType(Kind.OBJECT, fields=fields)
    raise TypeSpecError(
        'a type is "null", "bool", "number", "string", "json", '
        '{"array": T}, {"object": {...}} or {"nullable": T}',
        where,
    )


def type_spec(t: VType) -> Any:
    """The spec of ``t`` (inverse of :func:`parse_type`)."""
    if t.kind is Kind.ARRAY:
        assert t.items is not None
        base: Any = {"array": type_spec(t.items)}
    elif t.kind is Kind.OBJECT:
        base = {"object": {k: type_spec(v) for k, v in t.fields}}
    else:
        base = t.kind.value
    if t.nullable and t.kind not in (Kind.NULL, Kind.JSON):
        return {"nullable": base}
    return base


def kind_of(value: Any) -> Kind:
    """The kind of a run-time JSON value."""
    if value is None:
        return Kind.NULL
    if isinstance(value, bool):
        return Kind.BOOL
    if isinstance(value, int | float | Decimal):
        return Kind.NUMBER
    if isinstance(value, str):
        return Kind.STRING
    if isinstance(value, list):
        return Kind.ARRAY
    if isinstance(value, dict):
        return Kind.OBJECT
    raise TypeError(f"not a JSON value: {type(value).__name__}")


def conforms(value: Any, t: VType) -> bool:
    """True when the run-time JSON ``value`` has type ``t``.

    The engine calls this on task results and signal payloads of steps that declare an
    ``output_schema`` and on instance inputs against ``input_schema``: a value that does not
    conform fails the step, which is what keeps the static types sound.
    """
    if t.kind is Kind.JSON:
        return True
    k = kind_of(value)
    if k is Kind.NULL:
        return t.nullable or t.kind is Kind.NULL
    if k is not t.kind:
        return False
    if k is Kind.ARRAY:
        assert t.items is not None
        return all(conforms(v, t.items) for v in value)
    if k is Kind.OBJECT:
        return all(name in value and conforms(value[name], ft) for name, ft in t.fields)
    return True
