"""The expression half of the workflow builder (:mod:`orbit_sdk.workflow`): paths into the
input and step results, literals and operators, rendered as the ``{"$": ...}`` JSON the
definition language reads (docs/workflows.md, "Expressions"). Imports nothing from the server."""

from __future__ import annotations

import json
import re
from collections.abc import Iterable, Mapping
from typing import Any, Union

_IDENT = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")

ExprLike = Union["Expr", None, bool, int, float, str, list[Any], dict[str, Any]]


class Expr:
    """An expression of the definition language (see docs/workflows.md, "Expressions")."""

    __hash__ = None  # type: ignore[assignment]  # == builds an expression, not a bool

    def to_json(self) -> Any:
        raise NotImplementedError

    def _op(self, op: str, *others: ExprLike) -> Expr:
        return Op(op, (self, *others))

    def __eq__(self, other: object) -> Expr:  # type: ignore[override]
        return self._op("==", other)  # type: ignore[arg-type]

    def __ne__(self, other: object) -> Expr:  # type: ignore[override]
        return self._op("!=", other)  # type: ignore[arg-type]

    def __lt__(self, other: ExprLike) -> Expr:
        return self._op("<", other)

    def __le__(self, other: ExprLike) -> Expr:
        return self._op("<=", other)

    def __gt__(self, other: ExprLike) -> Expr:
        return self._op(">", other)

    def __ge__(self, other: ExprLike) -> Expr:
        return self._op(">=", other)

    def __and__(self, other: ExprLike) -> Expr:
        return _flatten("and", self, other)

    def __or__(self, other: ExprLike) -> Expr:
        return _flatten("or", self, other)

    def __invert__(self) -> Expr:
        return Op("not", (self,))

    def __add__(self, other: ExprLike) -> Expr:
        return self._op("+", other)

    def __radd__(self, other: ExprLike) -> Expr:
        return Op("+", (other, self))

    def __sub__(self, other: ExprLike) -> Expr:
        return self._op("-", other)

    def __rsub__(self, other: ExprLike) -> Expr:
        return Op("-", (other, self))

    def __mul__(self, other: ExprLike) -> Expr:
        return self._op("*", other)

    def __rmul__(self, other: ExprLike) -> Expr:
        return Op("*", (other, self))

    def __truediv__(self, other: ExprLike) -> Expr:
        return self._op("/", other)

    def __rtruediv__(self, other: ExprLike) -> Expr:
        return Op("/", (other, self))

    def __mod__(self, other: ExprLike) -> Expr:
        return self._op("%", other)

    def __bool__(self) -> bool:
        raise TypeError("an Expr has no truth value: use & | ~ instead of and/or/not")

    def is_in(self, values: ExprLike) -> Expr:
        """``{"op": "in"}``: true when this value equals an item of ``values`` (an array)."""
        return Op("in", (self, values))

    def __repr__(self) -> str:
        return f"Expr({json.dumps(self.to_json())})"


class Path(Expr):
    """A path such as ``$.input.order.id``; index it to go deeper: ``input()["order"]``."""

    def __init__(self, text: str) -> None:
        if not text.startswith("$"):
            raise ValueError("a path starts with '$'")
        self.text = text

    def __getitem__(self, key: str | int) -> Path:
        if isinstance(key, bool) or not isinstance(key, str | int):
            raise TypeError("path keys are field names (str) or indexes (int)")
        if isinstance(key, int):
            if key < 0:
                raise ValueError("array indexes are >= 0")
            return Path(f"{self.text}[{key}]")
        if _IDENT.fullmatch(key):
            return Path(f"{self.text}.{key}")
        return Path(f"{self.text}[{json.dumps(key)}]")

    def exists(self) -> Expr:
        """True when the path resolves (even to null)."""
        return Op("exists", (self,))

    def to_json(self) -> Any:
        return self.text


class Lit(Expr):
    """A literal value (needed for arrays, objects and strings starting with ``$``)."""

    def __init__(self, value: Any) -> None:
        self.value = value

    def to_json(self) -> Any:
        return (
            expr_json(self.value)
            if not isinstance(self.value, list | dict)
            else {"lit": self.value}
        )


class Op(Expr):
    def __init__(self, op: str, args: Iterable[ExprLike]) -> None:
        self.op = op
        self.args = tuple(args)

    def to_json(self) -> Any:
        return {"op": self.op, "args": [expr_json(a) for a in self.args]}


def _flatten(op: str, a: ExprLike, b: ExprLike) -> Expr:
    args: list[ExprLike] = []
    for x in (a, b):
        if isinstance(x, Op) and x.op == op:
            args.extend(x.args)
        else:
            args.append(x)
    return Op(op, args)


def expr_json(value: ExprLike) -> Any:
    """The JSON form of an expression or a Python literal used as one."""
    if isinstance(value, Expr):
        return value.to_json()
    if value is None or isinstance(value, bool | int | float):
        return value
    if isinstance(value, str):
        return {"lit": value} if value.startswith("$") else value
    if isinstance(value, list | dict):
        return {"lit": value}
    raise TypeError(f"cannot use {type(value).__name__} in an expression")


def template_json(value: Any) -> Any:
    """The JSON form of a template: expressions become ``{"$": expr}`` holes."""
    if isinstance(value, Expr):
        return {"$": value.to_json()}
    if isinstance(value, Mapping):
        if set(value) == {"$"}:  # a literal {"$": ...} object must not read as a hole
            return {"$": {"lit": _plain(value)}}
        return {str(k): template_json(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [template_json(v) for v in value]
    if value is None or isinstance(value, bool | int | float | str):
        return value
    raise TypeError(f"cannot use {type(value).__name__} in a template")


def _plain(value: Any) -> Any:
    if isinstance(value, Expr):
        raise TypeError('an expression cannot sit inside a literal {"$": ...} object')
    if isinstance(value, Mapping):
        return {str(k): _plain(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_plain(v) for v in value]
    return value


def path(text: str) -> Path:
    """A path from its text, e.g. ``path("$.steps.pay.output.status")``."""
    return Path(text)


def _walk(base: str, keys: tuple[str | int, ...]) -> Path:
    p = Path(base)
    for k in keys:
        p = p[k]
    return p


def input(*keys: str | int) -> Path:
    """``$.input`` followed by ``keys``."""
    return _walk("$.input", keys)


def output(step: str, *keys: str | int) -> Path:
    """``$.steps.<step>.output`` followed by ``keys``."""
    return _walk(f"$.steps.{_step_id(step)}.output", keys)


def error(step: str, *keys: str | int) -> Path:
    """``$.steps.<step>.error`` followed by ``keys`` (null when the step succeeded)."""
    return _walk(f"$.steps.{_step_id(step)}.error", keys)


def result(*keys: str | int) -> Path:
    """``$.result`` (the current round's result; only in a poll's ``until``)."""
    return _walk("$.result", keys)


def lit(value: Any) -> Lit:
    """A literal of any JSON value."""
    return Lit(value)


def concat(*parts: ExprLike) -> Expr:
    """Join strings (numbers are written as JSON)."""
    return Op("concat", parts)


def _step_id(step: str) -> str:
    if not _IDENT.fullmatch(step):
        raise ValueError(f"step id {step!r}: letters, digits and _, not starting with a digit")
    return step
