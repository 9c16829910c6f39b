"""The expression language: JSON syntax trees, paths, templates, a type checker and an evaluator.

Syntax (docs/workflows.md, "Expressions")::

    expr := null | true | false | <number>            literal
          | "<string not starting with $>"           literal string
          | "$.<path>"                               path (a string starting with "$")
          | {"path": "$.<path>"}                     path, explicit form
          | {"lit": <any JSON>}                      literal of any JSON (arrays, objects, "$...")
          | {"op": "<op>", "args": [expr, ...]}      operator

    path := $.input<seg>*
          | $.steps.<step id>.output<seg>*  |  $.steps.<step id>.error<seg>*
          | $.result<seg>*                           (only in a poll's "until")
    seg  := .<identifier> | [<integer>] | ["<any string>"]

Templates (task payloads, succeed outputs, fail messages) are JSON values in which an object
whose only key is ``"$"`` is replaced by the value of the expression it holds:
``{"order": {"$": "$.input.order_id"}, "source": "web"}``.

Typing: see :mod:`weave.definition.valuetypes`. ``and``/``or``/``not`` and every condition
need a static ``bool``; ordering and arithmetic on ``json`` operands are checked at run time
(:class:`EvalError`), as is a path that does not resolve (except under ``exists``).
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field
from decimal import Decimal, InvalidOperation
from typing import Any

from weave.definition import jsonvalue
from weave.definition.valuetypes import BOOL, JSON, NUMBER, STRING, Kind, VType

MAX_EXPR_DEPTH = 32
MAX_PATH_LENGTH = 1024
IDENT_RE = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")

Segment = str | int


class ExprError(ValueError):
    """A malformed or ill-typed expression. ``where`` locates it inside the field."""

    def __init__(self, reason: str, where: str = "") -> None:
        super().__init__(reason)
        self.reason = reason
        self.where = where


class EvalError(Exception):
    """A run-time evaluation failure; the engine fails the step with ``code``."""

    def __init__(self, code: str, message: str) -> None:
        super().__init__(message)
        self.code = code
        self.message = message


# --------------------------------------------------------------------------- syntax trees


@dataclass(frozen=True)
class Lit:
    """A literal JSON value."""

    value: Any


@dataclass(frozen=True)
class Path:
    """A path into the evaluation scope.

    ``root`` is ``input``, ``steps`` or ``result``; for ``steps``, ``step`` is the step id and
    ``part`` is ``output`` or ``error``. ``rest`` is what follows (field names and indexes).
    """

    text: str
    root: str
    step: str | None = None
    part: str | None = None
    rest: tuple[Segment, ...] = ()


@dataclass(frozen=True)
class Op:
    """An operator application."""

    op: str
    args: tuple[Expr, ...]


Expr = Lit | Path | Op


@dataclass(frozen=True)
class Embedded:
    """A ``{"$": expr}`` hole in a template."""

    expr: Expr


@dataclass(frozen=True)
class Template:
    """A JSON value with :class:`Embedded` expressions at any depth."""

    node: Any

    def exprs(self) -> Iterator[tuple[str, Expr]]:
        """Every embedded expression with its location (e.g. ``.order.id``)."""
        yield from _template_exprs(self.node, "")


def _template_exprs(node: Any, where: str) -> Iterator[tuple[str, Expr]]:
    if isinstance(node, Embedded):
        yield where, node.expr
    elif isinstance(node, dict):
        for k, v in node.items():
            yield from _template_exprs(v, f"{where}.{k}")
    elif isinstance(node, list):
        for i, v in enumerate(node):
            yield from _template_exprs(v, f"{where}[{i}]")


# --------------------------------------------------------------------------- parsing

#: Operator name → (min args, max args or None). Type rules are in :func:`type_of`.
OPERATORS: dict[str, tuple[int, int | None]] = {
    "==": (2, 2),
    "!=": (2, 2),
    "<": (2, 2),
    "<=": (2, 2),
    ">": (2, 2),
    ">=": (2, 2),
    "and": (2, None),
    "or": (2, None),
    "not": (1, 1),
    "+": (2, None),
    "-": (2, 2),
    "*": (2, None),
    "/": (2, 2),
    "%": (2, 2),
    "exists": (1, 1),
    "in": (2, 2),
    "concat": (1, None),
}


def parse_path(text: str) -> Path:
    """Parse ``$.input.a[0]["b c"]`` and friends. Raises :class:`ExprError`."""
    if len(text) > MAX_PATH_LENGTH:
        raise ExprError(f"path longer than {MAX_PATH_LENGTH} characters")
    if not text.startswith("$"):
        raise ExprError(f"path {text!r} must start with '$'")
    segs: list[Segment] = []
    i, n = 1, len(text)
    while i < n:
        c = text[i]
        if c == ".":
            m = IDENT_RE.match(text, i + 1)
            if m is None:
                raise ExprError(f"path {text!r}: expected a name after '.' at position {i}")
            segs.append(m.group(0))
            i = m.end()
        elif c == "[":
            j = text.find("]", i)
            if j < 0:
                raise ExprError(f"path {text!r}: unclosed '['")
            inner = text[i + 1 : j]
            if inner.isdigit() and inner.isascii():
                segs.append(int(inner))
                i = j + 1
            elif inner.startswith('"'):
                end = _string_end(text, i + 1)
                try:
                    key = jsonvalue.decode(text[i + 1 : end + 1])
                except Exception:
                    raise ExprError(f"path {text!r}: bad quoted name") from None
                if end + 1 >= n or text[end + 1] != "]":
                    raise ExprError(f"path {text!r}: expected ']' after quoted name")
                segs.append(key)
                i = end + 2
            else:
                raise ExprError(f"path {text!r}: '[...]' holds an index or a quoted name")
        else:
            raise ExprError(f"path {text!r}: unexpected {c!r} at position {i}")
    if not segs or not isinstance(segs[0], str):
        raise ExprError(f"path {text!r} must start with $.input, $.steps.<id> or $.result")
    head = segs[0]
    if head == "input":
        return Path(text, "input", rest=tuple(segs[1:]))
    if head == "result":
        return Path(text, "result", rest=tuple(segs[1:]))
    if head == "steps":
        if len(segs) < 3 or not isinstance(segs[1], str) or segs[2] not in ("output", "error"):
            raise ExprError(f"path {text!r}: expected $.steps.<step id>.output or .error")
        return Path(text, "steps", step=segs[1], part=str(segs[2]), rest=tuple(segs[3:]))
    raise ExprError(f"path {text!r} must start with $.input, $.steps.<id> or $.result")


def _string_end(text: str, start: int) -> int:
    """Index of the closing quote of the JSON string opening at ``start``."""
    i = start + 1
    while i < len(text):
        if text[i] == "\\":
            i += 2
            continue
        if text[i] == '"':
            return i
        i += 1
    raise ExprError(f"path {text!r}: unterminated quoted name")


def parse_expr(node: Any, where: str = "", depth: int = 0) -> Expr:
    """Parse an expression from decoded JSON. Raises :class:`ExprError`."""
    if depth > MAX_EXPR_DEPTH:
        raise ExprError(f"expression nested deeper than {MAX_EXPR_DEPTH} levels", where)
    if node is None or isinstance(node, bool) or jsonvalue.is_number(node):
        return Lit(node)
    if isinstance(node, str):
        if node.startswith("$"):
            try:
                return parse_path(node)
            except ExprError as exc:
                raise ExprError(exc.reason, where) from None
        return Lit(node)
    if isinstance(node, list):
        raise ExprError('an array literal must be written {"lit": [...]}', where)
    if not isinstance(node, dict):
        raise ExprError(f"not an expression: {type(node).__name__}", where)
    keys = set(node)
    if keys == {"lit"}:
        return Lit(node["lit"])
    if keys == {"path"}:
        if not isinstance(node["path"], str):
            raise ExprError("path must be a string", where)
        try:
            return parse_path(node["path"])
        except ExprError as exc:
            raise ExprError(exc.reason, where) from None
    if keys == {"op", "args"}:
        op = node["op"]
        if not isinstance(op, str) or op not in OPERATORS:
            raise ExprError(f"unknown operator {op!r} (known: {', '.join(OPERATORS)})", where)
        args = node["args"]
        if not isinstance(args, list):
            raise ExprError(f"{op}: args must be an array", where)
        lo, hi = OPERATORS[op]
        if len(args) < lo or (hi is not None and len(args) > hi):
            want = str(lo) if hi == lo else (f"at least {lo}" if hi is None else f"{lo} to {hi}")
            raise ExprError(f"{op} takes {want} argument(s), got {len(args)}", where)
        parsed = tuple(parse_expr(a, f"{where}.args[{i}]", depth + 1) for i, a in enumerate(args))
        if op == "exists" and not isinstance(parsed[0], Path):
            raise ExprError("exists takes a path", where)
        return Op(op, parsed)
    raise ExprError(
        'an expression object is {"op": ..., "args": [...]}, {"path": "$..."} or {"lit": ...}',
        where,
    )


def parse_template(node: Any, where: str = "", depth: int = 0) -> Template:
    """Parse a template (see the module docstring). Raises :class:`ExprError`."""
    return Template(_parse_template_node(node, where, depth))


def _parse_template_node(node: Any, where: str, depth: int) -> Any:
    if depth > MAX_EXPR_DEPTH:
        raise ExprError(f"template nested deeper than {MAX_EXPR_DEPTH} levels", where)
    if isinstance(node, dict):
        if set(node) == {"$"}:
            return Embedded(parse_expr(node["$"], f"{where}.$", depth + 1))
        return {k: _parse_template_node(v, f"{where}.{k}", depth + 1) for k, v in node.items()}
    if isinstance(node, list):
        return [_parse_template_node(v, f"{where}[{i}]", depth + 1) for i, v in enumerate(node)]
    return node


def expr_to_json(expr: Expr) -> Any:
    """The canonical JSON form of an expression (paths as strings, literals bare if safe)."""
    if isinstance(expr, Path):
        return expr.text
    if isinstance(expr, Lit):
        v = expr.value
        if v is None or isinstance(v, bool) or jsonvalue.is_number(v):
            return v
        if isinstance(v, str) and not v.startswith("$"):
            return v
        return {"lit": v}
    return {"op": expr.op, "args": [expr_to_json(a) for a in expr.args]}


def iter_paths(expr: Expr) -> Iterator[Path]:
    """Every path in ``expr``."""
    if isinstance(expr, Path):
        yield expr
    elif isinstance(expr, Op):
        for a in expr.args:
            yield from iter_paths(a)


# --------------------------------------------------------------------------- type checking


@dataclass
class TypeEnv:
    """What paths may refer to at one place in a definition.

    ``step_type(step_id, part)`` returns the type of ``$.steps.<id>.<part>`` or raises
    :class:`ExprError` with the reason the step's output may not be used here.
    ``result_type`` is the type of ``$.result``, or None where ``$.result`` is not allowed.
    """

    input_type: VType = JSON
    step_type: Callable[[str, str], VType] = field(default=lambda s, p: JSON)
    result_type: VType | None = None


def literal_type(value: Any) -> VType:
    """The most precise type of a literal."""
    from weave.definition.valuetypes import NULL

    if value is None:
        return NULL
    if isinstance(value, bool):
        return BOOL
    if jsonvalue.is_number(value):
        return NUMBER
    if isinstance(value, str):
        return STRING
    if isinstance(value, list):
        return VType(Kind.ARRAY, items=JSON)
    return VType(Kind.OBJECT)


def path_type(path: Path, env: TypeEnv) -> VType:
    """The static type of ``path`` in ``env``. Raises :class:`ExprError`."""
    if path.root == "input":
        t = env.input_type
    elif path.root == "result":
        if env.result_type is None:
            raise ExprError(f"{path.text}: $.result is only available in a poll's until")
        t = env.result_type
    else:
        assert path.step is not None and path.part is not None
        t = env.step_type(path.step, path.part)
    for seg in path.rest:
        if t.kind is Kind.JSON:
            return JSON
        if isinstance(seg, str):
            if t.kind is not Kind.OBJECT:
                raise ExprError(f"{path.text}: cannot take field {seg!r} of a {t.kind.value}")
            ft = t.field(seg)
            t = JSON if ft is None else ft
        else:
            if t.kind is not Kind.ARRAY:
                raise ExprError(f"{path.text}: cannot index a {t.kind.value}")
            assert t.items is not None
            t = t.items
    return t


def _comparable(a: VType, b: VType) -> bool:
    """Could values of types a and b ever be equal?"""
    if a.is_json or b.is_json:
        return True
    if a.kind is b.kind:
        return True
    return (a.kind is Kind.NULL and b.nullable) or (b.kind is Kind.NULL and a.nullable)


def type_of(expr: Expr, env: TypeEnv, where: str = "") -> VType:
    """The static type of ``expr``; raises :class:`ExprError` naming the problem."""
    if isinstance(expr, Lit):
        return literal_type(expr.value)
    if isinstance(expr, Path):
        try:
            return path_type(expr, env)
        except ExprError as exc:
            raise type(exc)(exc.reason, where) from None
    ts = [type_of(a, env, f"{where}.args[{i}]") for i, a in enumerate(expr.args)]
    op = expr.op
    if op in ("==", "!="):
        if not _comparable(ts[0], ts[1]):
            raise ExprError(f"{op} compares a {ts[0]} with a {ts[1]}: always {op == '!='}", where)
        return BOOL
    if op in ("<", "<=", ">", ">="):
        for i, t in enumerate(ts):
            if not t.is_json and t.kind not in (Kind.NUMBER, Kind.STRING):
                raise ExprError(f"{op}: argument {i} is a {t}, not a number or string", where)
        known = {t.kind for t in ts if not t.is_json}
        if len(known) > 1:
            raise ExprError(f"{op} orders a number against a string", where)
        return BOOL
    if op in ("and", "or", "not"):
        for i, t in enumerate(ts):
            if t != BOOL:
                raise ExprError(
                    f"{op}: argument {i} is a {t}, not a bool "
                    '(compare json values explicitly, e.g. {"op": "==", "args": [path, true]})',
                    where,
                )
        return BOOL
    if op in ("+", "-", "*", "/", "%"):
        for i, t in enumerate(ts):
            if not t.is_json and t.kind is not Kind.NUMBER:
                raise ExprError(f"{op}: argument {i} is a {t}, not a number", where)
        return NUMBER
    if op == "exists":
        return BOOL
    if op == "in":
        hay = ts[1]
        if not hay.is_json and hay.kind is not Kind.ARRAY:
            raise ExprError(f"in: argument 1 is a {hay}, not an array", where)
        return BOOL
    if op == "concat":
        for i, t in enumerate(ts):
            if not t.is_json and t.kind not in (Kind.STRING, Kind.NUMBER):
                raise ExprError(f"concat: argument {i} is a {t}, not a string or number", where)
        return STRING
    raise ExprError(f"unknown operator {op!r}", where)  # pragma: no cover - parse rejects


def expect_type(expr: Expr, env: TypeEnv, want: VType | tuple[Kind, ...], where: str = "") -> VType:
    """Check ``expr`` and require a type: an exact VType, or one of the kinds (json allowed)."""
    t = type_of(expr, env, where)
    if isinstance(want, VType):
        if t != want:
            raise ExprError(f"expected a {want}, got a {t}", where)
    elif not t.is_json and t.kind not in want:
        names = " or ".join(k.value for k in want)
        raise ExprError(f"expected a {names}, got a {t}", where)
    return t


def template_type(template: Template, env: TypeEnv, where: str = "") -> None:
    """Type-check every expression of a template."""
    for loc, expr in template.exprs():
        type_of(expr, env, f"{where}{loc}")


# --------------------------------------------------------------------------- evaluation

_MISSING: Any = object()


@dataclass
class Scope:
    """Run-time values paths resolve against.

    ``steps`` maps a step id to ``{"output": value, "error": value}`` for every finished step
    (a step that did not succeed has output ``None``). ``result`` is the current poll round's
    result inside a poll's ``until``.
    """

    input: Any = None
    steps: Mapping[str, Mapping[str, Any]] = field(default_factory=dict)
    result: Any = _MISSING


def resolve(path: Path, scope: Scope) -> Any:
    """The value at ``path``; raises EvalError(path_not_found) when it does not resolve."""
    if path.root == "input":
        v = scope.input
    elif path.root == "result":
        v = scope.result
    else:
        step = scope.steps.get(path.step or "")
        v = _MISSING if step is None else step.get(path.part or "", None)
    for seg in path.rest:
        if v is _MISSING:
            break
        if isinstance(seg, str):
            v = v.get(seg, _MISSING) if isinstance(v, dict) else _MISSING
        else:
            v = v[seg] if isinstance(v, list) and seg < len(v) else _MISSING
    if v is _MISSING:
        raise EvalError("path_not_found", f"{path.text} does not resolve")
    return v


def _num(v: Any, op: str) -> int | Decimal:
    if not jsonvalue.is_number(v):
        raise EvalError("type_error", f"{op}: {jsonvalue.encode(v).decode()[:80]} is not a number")
    if isinstance(v, float):
        return Decimal(repr(v))
    return v  # type: ignore[no-any-return]


def _normalize(v: Decimal | int, ints: bool) -> int | Decimal:
    if ints and isinstance(v, Decimal) and v == v.to_integral_value():
        return int(v)
    return v


def evaluate(expr: Expr, scope: Scope) -> Any:
    """Evaluate ``expr``. Raises :class:`EvalError` (path_not_found, type_error,
    division_by_zero, arithmetic_error)."""
    if isinstance(expr, Lit):
        return expr.value
    if isinstance(expr, Path):
        return resolve(expr, scope)
    op, args = expr.op, expr.args
    if op == "exists":
        assert isinstance(args[0], Path)
        try:
            resolve(args[0], scope)
            return True
        except EvalError:
            return False
    if op in ("and", "or"):
        for a in args:
            v = evaluate(a, scope)
            if not isinstance(v, bool):
                raise EvalError("type_error", f"{op}: operand is not a bool")
            if v is (op == "or"):
                return v
        return op == "and"
    vals = [evaluate(a, scope) for a in args]
    if op == "not":
        if not isinstance(vals[0], bool):
            raise EvalError("type_error", "not: operand is not a bool")
        return not vals[0]
    if op == "==":
        return jsonvalue.json_equal(vals[0], vals[1])
    if op == "!=":
        return not jsonvalue.json_equal(vals[0], vals[1])
    if op in ("<", "<=", ">", ">="):
        lhs, rhs = vals
        if isinstance(lhs, str) and isinstance(rhs, str):
            pass
        elif jsonvalue.is_number(lhs) and jsonvalue.is_number(rhs):
            lhs, rhs = _num(lhs, op), _num(rhs, op)
        else:
            raise EvalError("type_error", f"{op}: operands must be two numbers or two strings")
        return {"<": lhs < rhs, "<=": lhs <= rhs, ">": lhs > rhs, ">=": lhs >= rhs}[op]
    if op in ("+", "-", "*", "/", "%"):
        nums = [_num(v, op) for v in vals]
        ints = all(isinstance(v, int) for v in nums)
        try:
            if op == "+":
                acc: int | Decimal = nums[0]
                for x in nums[1:]:
                    acc = acc + x
                return acc
            if op == "*":
                acc = nums[0]
                for x in nums[1:]:
                    acc = acc * x
                return acc
            if op == "-":
                return nums[0] - nums[1]
            if nums[1] == 0:
                raise EvalError("division_by_zero", f"{op}: division by zero")
            if op == "/":
                return _normalize(Decimal(nums[0]) / Decimal(nums[1]), ints)
            return _normalize(Decimal(nums[0]) % Decimal(nums[1]), ints)
        except (ArithmeticError, InvalidOperation) as exc:
            raise EvalError("arithmetic_error", f"{op}: {exc}") from None
    if op == "in":
        hay = vals[1]
        if not isinstance(hay, list):
            raise EvalError("type_error", "in: second operand is not an array")
        return any(jsonvalue.json_equal(vals[0], x) for x in hay)
    if op == "concat":
        parts = []
        for v in vals:
            if isinstance(v, str):
                parts.append(v)
            elif jsonvalue.is_number(v):
                parts.append(jsonvalue.encode(v).decode())
            else:
                raise EvalError("type_error", "concat: operands must be strings or numbers")
        return "".join(parts)
    raise EvalError("type_error", f"unknown operator {op!r}")  # pragma: no cover


def render(template: Template, scope: Scope) -> Any:
    """The value of a template: every ``{"$": expr}`` replaced by the expression's value."""
    return _render(template.node, scope)


def _render(node: Any, scope: Scope) -> Any:
    if isinstance(node, Embedded):
        return evaluate(node.expr, scope)
    if isinstance(node, dict):
        return {k: _render(v, scope) for k, v in node.items()}
    if isinstance(node, list):
        return [_render(v, scope) for v in node]
    return node
