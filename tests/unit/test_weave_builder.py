"""The SDK's workflow builder emits JSON that the server's validator accepts, unchanged."""

from __future__ import annotations

import json
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from orbit_sdk.workflow import T, Workflow, concat, error, input, lit, output, path, result, when

from weave.definition import compile_definition, validate_definition
from weave.definition.expressions import Scope, evaluate, expr_to_json, parse_expr
from weave.definition.model import Goto, Outcome, ParallelStep, PollStep, WaitSignalStep


def order_workflow() -> Workflow:
    wf = Workflow(
        description="order fulfilment", input_schema=T.object(order_id=T.string, amount=T.number)
    )
    wf.task(
        "charge",
        queue="payments",
        kind="charge",
        payload={"order": input("order_id"), "cents": input("amount") * 100, "note": "$literal"},
        output_schema=T.object(status=T.string),
        retry={"max_attempts": 3, "backoff_initial_ms": 100},
        on_failure="cancel_order",
    )
    wf.choice("paid", [when(output("charge", "status") == "ok", "ship")], default="cancel_order")
    wf.wait_signal(
        "ship",
        signal="shipped",
        correlation_key=input("order_id"),
        timeout_ms=86_400_000,
        on_timeout="refund",
    )
    with wf.parallel("fan", join="merge") as fan:
        fan.branch("notify").task(
            "mail", queue="mail", kind="send", payload={"to": output("ship", "email")}
        )
        fan.branch("track").poll(
            "track",
            queue="shipping",
            kind="status",
            until=(result("state") == "delivered") | (result("state") == "lost"),
            max_rounds=10,
            max_attempts=2,
            interval_ms=60_000,
            deadline_ms=7 * 86_400_000,
            output_schema=T.object(state=T.string),
            backoff={"backoff_initial_ms": 1000},
        )
    wf.succeed("done", output={"order": input("order_id"), "state": output("track", "state")})
    wf.task(
        "refund",
        queue="payments",
        kind="refund",
        payload={"order": input("order_id")},
        next="cancel_order",
    )
    wf.fail(
        "cancel_order",
        error="order_cancelled",
        message=concat("order ", input("order_id"), " cancelled"),
    )
    return wf


def test_builder_output_passes_the_server_validator() -> None:
    wf = order_workflow()
    doc = wf.to_dict()
    assert validate_definition(doc) == []
    d = compile_definition(wf.to_json())
    assert d.start == "charge"
    assert d.branch_starts("fan") == ("mail", "track")
    assert isinstance(d.steps["track"], PollStep) and d.steps["track"].max_attempts == 2
    assert isinstance(d.steps["ship"], WaitSignalStep) and d.steps["ship"].on_timeout == "refund"
    assert isinstance(d.steps["fan"], ParallelStep) and d.steps["fan"].join == "merge"
    assert d.transition("charge", Outcome.FAILED) == Goto("cancel_order")


def test_builder_emits_the_documented_json() -> None:
    doc = order_workflow().to_dict()
    charge = doc["steps"][0]
    assert charge["payload"] == {
        "order": {"$": "$.input.order_id"},
        "cents": {"$": {"op": "*", "args": ["$.input.amount", 100]}},
        "note": "$literal",  # plain template strings are never paths
    }
    assert doc["steps"][1]["cases"] == [
        {"when": {"op": "==", "args": ["$.steps.charge.output.status", "ok"]}, "next": "ship"}
    ]
    poll = doc["steps"][3]["branches"][1]["steps"][0]
    assert poll["until"] == {
        "op": "or",
        "args": [
            {"op": "==", "args": ["$.result.state", "delivered"]},
            {"op": "==", "args": ["$.result.state", "lost"]},
        ],
    }
    assert poll["task"]["retry"] == {"backoff_initial_ms": 1000}
    assert [s["type"] for s in doc["steps"]][3:5] == ["parallel", "join"]
    assert json.loads(order_workflow().to_json()) == doc


def test_expression_operators() -> None:
    n = input("n")
    cases: list[tuple[Any, Any]] = [
        (
            (n > 1) & (n < 5) & ~(n == 3),
            {
                "op": "and",
                "args": [
                    {"op": ">", "args": ["$.input.n", 1]},
                    {"op": "<", "args": ["$.input.n", 5]},
                    {"op": "not", "args": [{"op": "==", "args": ["$.input.n", 3]}]},
                ],
            },
        ),
        (1 + n, {"op": "+", "args": [1, "$.input.n"]}),
        (10 - n, {"op": "-", "args": [10, "$.input.n"]}),
        (
            2 * n / 4 % 3,
            {
                "op": "%",
                "args": [{"op": "/", "args": [{"op": "*", "args": [2, "$.input.n"]}, 4]}, 3],
            },
        ),
        (n.is_in([1, 2]), {"op": "in", "args": ["$.input.n", {"lit": [1, 2]}]}),
        (input("x").exists(), {"op": "exists", "args": ["$.input.x"]}),
        (input("a", 0, "b c"), '$.input.a[0]["b c"]'),
        (error("pay", "code") != None, {"op": "!=", "args": ["$.steps.pay.error.code", None]}),  # noqa: E711
        (n == "$x", {"op": "==", "args": ["$.input.n", {"lit": "$x"}]}),
        (lit({"a": 1}), {"lit": {"a": 1}}),
        (path("$.steps.s.output")["k"], "$.steps.s.output.k"),
    ]
    for built, expected in cases:
        assert built.to_json() == expected
        assert expr_to_json(parse_expr(built.to_json())) == expected


def test_expr_has_no_truth_value() -> None:
    with pytest.raises(TypeError):
        bool(input("a") == 1)
    with pytest.raises(ValueError):
        output("bad-id")
    with pytest.raises(ValueError):
        Workflow().sleep("s")


def test_literal_dollar_object_in_a_template_stays_literal() -> None:
    wf = Workflow()
    wf.succeed("done", output={"$": "not a hole"})
    d = compile_definition(wf.to_dict())
    step = d.steps["done"]
    from weave.definition.expressions import render

    assert render(step.output, Scope()) == {"$": "not a hole"}  # type: ignore[attr-defined, arg-type]


@settings(max_examples=100, deadline=None)
@given(st.integers(-100, 100), st.integers(-100, 100), st.integers(1, 100))
def test_builder_arithmetic_evaluates_like_python(a: int, b: int, c: int) -> None:
    expr = (input("a") + input("b")) * 2 - input("c")
    cond = (expr > input("b")) | (input("a") == input("b"))
    scope = Scope(input={"a": a, "b": b, "c": c})
    assert evaluate(parse_expr(expr.to_json()), scope) == (a + b) * 2 - c
    assert evaluate(parse_expr(cond.to_json()), scope) == (((a + b) * 2 - c > b) or a == b)
