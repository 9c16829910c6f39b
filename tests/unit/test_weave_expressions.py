"""The expression language: paths, parsing, typing, evaluation, templates, value types."""

from __future__ import annotations

from decimal import Decimal
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from weave.definition import jsonvalue
from weave.definition.expressions import (
    EvalError,
    ExprError,
    Lit,
    Op,
    Path,
    Scope,
    TypeEnv,
    evaluate,
    expr_to_json,
    parse_expr,
    parse_path,
    parse_template,
    render,
    type_of,
)
from weave.definition.valuetypes import (
    BOOL,
    JSON,
    NUMBER,
    STRING,
    Kind,
    TypeSpecError,
    VType,
    conforms,
    parse_type,
    type_spec,
)

# ------------------------------------------------------------------ paths


@pytest.mark.parametrize(
    ("text", "root", "step", "part", "rest"),
    [
        ("$.input", "input", None, None, ()),
        ("$.input.a.b", "input", None, None, ("a", "b")),
        ("$.input.items[0].sku", "input", None, None, ("items", 0, "sku")),
        ('$.input["with space"]["q\\"uote"]', "input", None, None, ("with space", 'q"uote')),
        ("$.steps.pay.output", "steps", "pay", "output", ()),
        ("$.steps.pay.output.status", "steps", "pay", "output", ("status",)),
        ("$.steps.pay.error.code", "steps", "pay", "error", ("code",)),
        ("$.result.state", "result", None, None, ("state",)),
    ],
)
def test_parse_path(
    text: str, root: str, step: str | None, part: str | None, rest: tuple[Any, ...]
) -> None:
    p = parse_path(text)
    assert (p.root, p.step, p.part, p.rest) == (root, step, part, rest)


@pytest.mark.parametrize(
    "text",
    [
        "input.a",
        "$",
        "$.",
        "$.other",
        "$.steps",
        "$.steps.pay",
        "$.steps.pay.result",
        "$.input[",
        "$.input[-1]",
        "$.input[x]",
        '$.input["a"',
        "$.input..a",
        "$.input.1a",
        "$x",
    ],
)
def test_bad_paths(text: str) -> None:
    with pytest.raises(ExprError):
        parse_path(text)


# ------------------------------------------------------------------ parsing


def test_parse_forms() -> None:
    assert parse_expr(3) == Lit(3)
    assert parse_expr("ok") == Lit("ok")
    assert parse_expr({"lit": "$not a path"}) == Lit("$not a path")
    assert parse_expr({"lit": [1, 2]}) == Lit([1, 2])
    assert isinstance(parse_expr("$.input.a"), Path)
    assert isinstance(parse_expr({"path": "$.input.a"}), Path)
    e = parse_expr({"op": "and", "args": [True, {"op": "==", "args": ["$.input.a", 1]}]})
    assert isinstance(e, Op) and e.op == "and" and len(e.args) == 2


@pytest.mark.parametrize(
    "node",
    [
        [1, 2],
        {"op": "==", "args": [1]},
        {"op": "==", "args": [1, 2, 3]},
        {"op": "and", "args": [True]},
        {"op": "nope", "args": []},
        {"op": "==", "args": "x"},
        {"op": "==", "args": [1, 2], "extra": 1},
        {"path": 3},
        {"weird": 1},
        {"op": "exists", "args": ["literal"]},
        {"op": "==", "args": ["$.bad", 1]},
    ],
)
def test_parse_rejects(node: Any) -> None:
    with pytest.raises(ExprError):
        parse_expr(node)


def test_parse_depth_bounded() -> None:
    node: Any = True
    for _ in range(40):
        node = {"op": "not", "args": [node]}
    with pytest.raises(ExprError, match="deeper"):
        parse_expr(node)


def test_expr_json_round_trip() -> None:
    src = {
        "op": "and",
        "args": [
            {"op": "<", "args": ["$.input.n", 3]},
            {"op": "in", "args": ["$.input.k", {"lit": ["a"]}]},
            {"lit": "$x"},
        ],
    }
    assert expr_to_json(parse_expr(src)) == src


# ------------------------------------------------------------------ typing


def test_type_of_basics() -> None:
    env = TypeEnv()
    assert type_of(parse_expr(1), env) == NUMBER
    assert type_of(parse_expr("s"), env) == STRING
    assert type_of(parse_expr("$.input.x"), env) == JSON
    assert type_of(parse_expr({"op": "concat", "args": ["a", "$.input.x"]}), env) == STRING
    assert type_of(parse_expr({"op": "*", "args": [2, "$.input.x"]}), env) == NUMBER
    assert type_of(parse_expr({"op": "exists", "args": ["$.input.x"]}), env) == BOOL


def test_type_env_step_lookup_is_used() -> None:
    def step_type(step: str, part: str) -> VType:
        if step == "pay":
            return parse_type({"object": {"amount": "number"}})
        raise ExprError(f"no {step}")

    env = TypeEnv(step_type=step_type)
    assert type_of(parse_expr("$.steps.pay.output.amount"), env) == NUMBER
    with pytest.raises(ExprError, match="no other"):
        type_of(parse_expr("$.steps.other.output"), env)


# ------------------------------------------------------------------ evaluation


def ev(node: Any, input: Any = None, steps: dict[str, Any] | None = None, **kw: Any) -> Any:
    return evaluate(parse_expr(node), Scope(input=input, steps=steps or {}, **kw))


def test_paths_resolve_and_missing_paths_fail() -> None:
    data = {"a": {"b": [10, {"c": None}]}}
    assert ev("$.input.a.b[0]", data) == 10
    assert ev("$.input.a.b[1].c", data) is None
    for missing in ("$.input.x", "$.input.a.b[5]", "$.input.a.b.c", "$.input.a.b[1].c.d"):
        with pytest.raises(EvalError) as exc:
            ev(missing, data)
        assert exc.value.code == "path_not_found"


def test_exists_and_short_circuit_guards() -> None:
    data = {"a": 1}
    assert ev({"op": "exists", "args": ["$.input.a"]}, data) is True
    assert ev({"op": "exists", "args": ["$.input.zz"]}, data) is False
    guarded = {
        "op": "and",
        "args": [{"op": "exists", "args": ["$.input.zz"]}, {"op": "==", "args": ["$.input.zz", 1]}],
    }
    assert ev(guarded, data) is False
    assert ev({"op": "or", "args": [True, {"op": "==", "args": ["$.input.zz", 1]}]}, data) is True


def test_step_outputs_and_errors() -> None:
    steps = {
        "pay": {"output": {"status": "ok"}, "error": None},
        "bad": {"output": None, "error": {"code": "x"}},
    }
    assert ev({"op": "==", "args": ["$.steps.pay.output.status", "ok"]}, steps=steps) is True
    assert ev("$.steps.bad.error.code", steps=steps) == "x"
    assert ev("$.steps.bad.output", steps=steps) is None
    with pytest.raises(EvalError):
        ev("$.steps.never.output", steps=steps)


def test_json_equality() -> None:
    assert ev({"op": "==", "args": [1, {"lit": 1.0}]}) is True
    assert ev({"op": "==", "args": [True, 1]}) is False
    assert ev({"op": "==", "args": [0, False]}) is False
    assert ev({"op": "==", "args": [None, None]}) is True
    assert ev({"op": "==", "args": [{"lit": {"a": [1, 2]}}, {"lit": {"a": [1, 2]}}]}) is True
    assert ev({"op": "!=", "args": [{"lit": {"a": 1}}, {"lit": {"a": 1, "b": 2}}]}) is True
    assert ev({"op": "in", "args": [2, {"lit": [1, 2]}]}) is True


def test_ordering_and_its_runtime_checks() -> None:
    assert ev({"op": "<", "args": ["a", "b"]}) is True
    assert ev({"op": ">=", "args": [Decimal("2.5"), 2]}) is True
    with pytest.raises(EvalError) as exc:
        ev({"op": "<", "args": ["$.input", 1]}, "a")
    assert exc.value.code == "type_error"


def test_arithmetic_keeps_exact_numbers() -> None:
    assert ev({"op": "+", "args": [Decimal("0.1"), Decimal("0.2")]}) == Decimal("0.3")
    assert ev({"op": "*", "args": [3, 4, 5]}) == 60
    assert ev({"op": "/", "args": [6, 3]}) == 2 and isinstance(ev({"op": "/", "args": [6, 3]}), int)
    assert ev({"op": "/", "args": [1, 4]}) == Decimal("0.25")
    assert ev({"op": "%", "args": [-7, 3]}) == -1  # truncating, like SQL and JavaScript
    with pytest.raises(EvalError) as exc:
        ev({"op": "/", "args": [1, 0]})
    assert exc.value.code == "division_by_zero"
    with pytest.raises(EvalError) as exc:
        ev({"op": "+", "args": ["$.input", 1]}, "x")
    assert exc.value.code == "type_error"
    with pytest.raises(EvalError) as exc:
        ev({"op": "+", "args": ["$.input", 1]}, True)
    assert exc.value.code == "type_error"


def test_concat() -> None:
    assert (
        ev({"op": "concat", "args": ["order-", "$.input", "-", Decimal("1.50")]}, 42)
        == "order-42-1.50"
    )
    with pytest.raises(EvalError):
        ev({"op": "concat", "args": ["a", "$.input"]}, None)


def test_templates_render_holes_at_any_depth() -> None:
    t = parse_template(
        {
            "id": {"$": "$.input.id"},
            "fixed": [1, {"n": {"$": {"op": "+", "args": ["$.input.n", 1]}}}],
            "s": "$.not.a.hole",
        }
    )
    assert render(t, Scope(input={"id": "o-1", "n": 1})) == {
        "id": "o-1",
        "fixed": [1, {"n": 2}],
        "s": "$.not.a.hole",
    }
    assert render(parse_template({"$": "$.input"}), Scope(input=[1])) == [1]
    assert render(parse_template({"$": {"lit": {"$": 1}}}), Scope()) == {"$": 1}


def test_rendered_numbers_are_encoded_as_written() -> None:
    data = jsonvalue.decode(b'{"price": 19.90, "big": 12345678901234567890.000001}')
    out = render(
        parse_template({"p": {"$": "$.input.price"}, "b": {"$": "$.input.big"}}), Scope(input=data)
    )
    assert jsonvalue.encode(out) == b'{"p":19.90,"b":12345678901234567890.000001}'


# ------------------------------------------------------------------ value types


def test_parse_type_and_spec_round_trip() -> None:
    spec = {
        "object": {
            "a": "number",
            "b": {"array": {"nullable": "string"}},
            "c": {"nullable": {"object": {}}},
        }
    }
    t = parse_type(spec)
    assert type_spec(t) == spec
    assert t.field("a") == NUMBER and t.field("zz") is None
    assert parse_type({"nullable": "json"}) == JSON


@pytest.mark.parametrize(
    "spec", ["integer", 3, {"array": "x"}, {"object": []}, {"a": 1, "b": 2}, {"tuple": "number"}]
)
def test_parse_type_rejects(spec: Any) -> None:
    with pytest.raises(TypeSpecError):
        parse_type(spec)


def test_conforms() -> None:
    t = parse_type(
        {"object": {"n": "number", "tags": {"array": "string"}, "maybe": {"nullable": "bool"}}}
    )
    assert conforms({"n": 1, "tags": ["a"], "maybe": None, "extra": 1}, t)
    assert conforms({"n": Decimal("1.5"), "tags": [], "maybe": True}, t)
    assert not conforms({"n": True, "tags": [], "maybe": None}, t)  # bool is not a number
    assert not conforms({"n": 1, "tags": [1], "maybe": None}, t)
    assert not conforms({"tags": [], "maybe": None}, t)  # declared fields must be present
    assert not conforms(None, t)
    assert conforms(None, t.as_nullable())
    assert conforms("anything", JSON)
    assert str(t.as_nullable()).startswith("nullable object")
    assert VType(Kind.NULL).admits(Kind.NULL)


# ------------------------------------------------------------------ properties

json_scalars = st.none() | st.booleans() | st.integers(-(10**12), 10**12) | st.text(max_size=8)
json_values = st.recursive(
    json_scalars,
    lambda c: st.lists(c, max_size=3) | st.dictionaries(st.text(max_size=4), c, max_size=3),
    max_leaves=10,
)


@settings(max_examples=150, deadline=None)
@given(json_values)
def test_a_literal_evaluates_to_itself_and_conforms_to_its_type(value: Any) -> None:
    expr = parse_expr({"lit": value})
    assert evaluate(expr, Scope()) == value
    assert conforms(value, type_of(expr, TypeEnv()))
    assert ev({"op": "==", "args": [{"lit": value}, {"lit": value}]}) is True


@settings(max_examples=150, deadline=None)
@given(
    st.dictionaries(
        st.from_regex(r"[a-z_][a-z0-9_]{0,5}", fullmatch=True), json_values, min_size=1, max_size=4
    ),
    st.data(),
)
def test_well_typed_comparisons_never_raise_on_conforming_input(
    data: dict[str, Any], draw: Any
) -> None:
    # With a declared input type, an ==/!= expression that type-checks evaluates without error.
    key = draw.draw(st.sampled_from(sorted(data)))
    spec = {"object": {key: "json"}}
    env = TypeEnv(input_type=parse_type(spec))
    expr = parse_expr({"op": "!=", "args": [f"$.input.{key}", {"lit": data[key]}]})
    assert type_of(expr, env) == BOOL
    assert conforms(data, env.input_type)
    assert evaluate(expr, Scope(input=data)) is False
