"""Definition validation: every rule has a failing example that names the right step."""

from __future__ import annotations

from typing import Any

import pytest

from weave.definition import (
    DefinitionError,
    Rule,
    compile_definition,
    definition_digest,
    validate_definition,
)


def task(id: str, **kw: Any) -> dict[str, Any]:
    return {"id": id, "type": "task", "queue": "q", "kind": "k", **kw}


def wait(id: str, **kw: Any) -> dict[str, Any]:
    return {"id": id, "type": "wait_signal", "signal": "go", **kw}


def par(id: str, *branches: list[dict[str, Any]]) -> dict[str, Any]:
    return {"id": id, "type": "parallel", "branches": [{"steps": b} for b in branches]}


def join(id: str, parallel: str, **kw: Any) -> dict[str, Any]:
    return {"id": id, "type": "join", "parallel": parallel, **kw}


def choice(id: str, cases: list[tuple[Any, str]], default: str | None = None) -> dict[str, Any]:
    out: dict[str, Any] = {
        "id": id,
        "type": "choice",
        "cases": [{"when": w, "next": n} for w, n in cases],
    }
    if default is not None:
        out["default"] = default
    return out


def defn(*steps: dict[str, Any], **top: Any) -> dict[str, Any]:
    return {"steps": list(steps), **top}


TRUE_EQ = {"op": "==", "args": ["$.input.a", 1]}


def problems(doc: Any) -> list[tuple[str | None, str]]:
    return [(p.step, p.rule.value) for p in validate_definition(doc)]


def assert_rejects(doc: Any, step: str | None, rule: Rule) -> None:
    found = validate_definition(doc)
    assert found, "expected the definition to be rejected"
    assert (step, rule) in [(p.step, p.rule) for p in found], [p.to_json() for p in found]
    with pytest.raises(DefinitionError):
        compile_definition(doc)


# ------------------------------------------------------------------ valid definitions


def test_minimal_task_is_valid() -> None:
    d = compile_definition(defn(task("a")))
    assert d.start == "a" and list(d.steps) == ["a"]


def test_every_step_type_together_is_valid() -> None:
    doc = defn(
        task(
            "reserve",
            payload={"order": {"$": "$.input.id"}},
            retry={
                "max_attempts": 3,
                "backoff_initial_ms": 10,
                "backoff_max_ms": 100,
                "backoff_multiplier": 2,
            },
        ),
        wait("approve", timeout_ms=1000, on_timeout="reject", correlation_key="$.input.id"),
        {"id": "cool", "type": "sleep", "duration_ms": 5},
        {
            "id": "track",
            "type": "poll",
            "task": {
                "queue": "ship",
                "kind": "status",
                "output_schema": {"object": {"done": "bool"}},
            },
            "until": "$.result.done",
            "max_rounds": 3,
            "max_attempts": 2,
            "interval_ms": 10,
            "deadline_ms": 1000,
            "on_exhausted": "reject",
        },
        par(
            "fan", [task("a1"), task("a2")], [{"id": "b1", "type": "sleep", "until": "$.input.at"}]
        ),
        join("merge", "fan"),
        choice(
            "route",
            [({"op": "==", "args": ["$.steps.a2.output.ok", True]}, "done")],
            default="reject",
        ),
        {"id": "done", "type": "succeed", "output": {"a": {"$": "$.steps.a1.output"}}},
        {"id": "reject", "type": "fail", "error": "rejected", "message": "no"},
    )
    d = compile_definition(doc)
    assert d.branch_starts("fan") == ("a1", "b1")
    assert "a1" in d.available["route"] and "b1" in d.available["route"]


def test_digest_ignores_whitespace_and_key_order_but_not_numbers() -> None:
    a = definition_digest('{"steps": [{"id": "a", "type": "task", "queue": "q", "kind": "k"}]}')
    b = definition_digest('{"steps":[{"kind":"k","queue":"q","type":"task","id":"a"}]}')
    c = definition_digest(
        '{"steps":[{"kind":"k","queue":"q","type":"task","id":"a","priority":1}]}'
    )
    assert a == b != c


# ------------------------------------------------------------------ structure (parser)


@pytest.mark.parametrize(
    ("doc", "step", "rule"),
    [
        ([], None, Rule.SCHEMA),
        ({"steps": []}, None, Rule.SCHEMA),
        ({"steps": [task("a")], "extra": 1}, None, Rule.UNKNOWN_FIELD),
        (defn({"id": "a", "type": "teleport"}), "a", Rule.SCHEMA),
        (defn({"id": "a", "type": "task", "kind": "k"}), "a", Rule.SCHEMA),  # no queue
        (defn(task("a", colour="red")), "a", Rule.UNKNOWN_FIELD),
        (defn(task("a", queue="bad queue")), "a", Rule.INVALID_NAME),
        (defn(task("a", priority=10)), "a", Rule.SCHEMA),
        (defn(task("a", priority=True)), "a", Rule.SCHEMA),
        (defn(task("a", retry={"max_attempts": 0})), "a", Rule.SCHEMA),
        (defn(task("a", retry={"backoff_initial_ms": 10, "backoff_max_ms": 5})), "a", Rule.SCHEMA),
        (defn(task("a", output_schema="integer")), "a", Rule.SCHEMA),
        (defn(task("a"), task("a")), "a", Rule.DUPLICATE_ID),
        (defn({"id": "9lives", "type": "succeed"}), "9lives", Rule.INVALID_NAME),
        (defn({"id": "has-dash", "type": "succeed"}), "has-dash", Rule.INVALID_NAME),
        (defn(wait("w", signal="no spaces")), "w", Rule.INVALID_NAME),
        (defn(wait("w", signal="x" * 64)), "w", Rule.INVALID_NAME),
        (defn(wait("w", on_timeout="x"), task("x")), "w", Rule.SCHEMA),  # no timeout_ms
        (defn(task("a", next="b", end=True), task("b")), "a", Rule.SCHEMA),
        (defn({"id": "s", "type": "sleep"}), "s", Rule.SCHEMA),
        (
            defn({"id": "s", "type": "sleep", "duration_ms": 1, "until": "$.input.t"}),
            "s",
            Rule.SCHEMA,
        ),
        (defn({"id": "s", "type": "sleep", "duration_ms": -1}), "s", Rule.SCHEMA),
        (
            defn({"id": "p", "type": "poll", "task": {"queue": "q", "kind": "k"}, "until": True}),
            "p",
            Rule.SCHEMA,
        ),
        (
            defn(
                {
                    "id": "p",
                    "type": "poll",
                    "task": {"queue": "q", "kind": "k", "retry": {"max_attempts": 2}},
                    "until": True,
                    "max_rounds": 2,
                }
            ),
            "p",
            Rule.SCHEMA,
        ),
        (defn(par("p", [task("a")]) | {"next": "j"}, join("j", "p")), "p", Rule.SCHEMA),
        (defn(par("p", [])), "p", Rule.SCHEMA),
        (defn(join("j", "p", policy="any")), "j", Rule.SCHEMA),
        (defn({"id": "f", "type": "fail"}), "f", Rule.SCHEMA),
        (defn({"id": "f", "type": "fail", "error": "bad code!"}), "f", Rule.SCHEMA),
        (defn({"id": "ok", "type": "succeed", "next": "x"}), "ok", Rule.SCHEMA),
        (defn(choice("c", [])), "c", Rule.SCHEMA),
        (
            defn(task("a", payload={"x": {"$": {"op": "xor", "args": [1, 2]}}})),
            "a",
            Rule.EXPRESSION,
        ),
        (
            defn(task("a", payload={"x": {"$": {"op": "not", "args": [True, False]}}})),
            "a",
            Rule.EXPRESSION,
        ),
        (defn(task("a", payload={"x": {"$": "$.inputs.a"}})), "a", Rule.EXPRESSION),
        (defn(task("a", payload={"x": {"$": "$.steps.b"}})), "a", Rule.EXPRESSION),
        (defn(task("a", payload={"x": {"$": [1, 2]}})), "a", Rule.EXPRESSION),
        (
            defn(task("a", payload={"x": {"$": {"op": "exists", "args": [1]}}})),
            "a",
            Rule.EXPRESSION,
        ),
    ],
)
def test_structural_rule_violations_name_the_step(doc: Any, step: str | None, rule: Rule) -> None:
    assert_rejects(doc, step, rule)


def test_problem_field_locates_the_error_inside_branches() -> None:
    doc = defn(par("p", [task("a"), task("b", queue="")]), join("j", "p"))
    [p] = validate_definition(doc)
    assert p.step == "b" and p.field == "steps[0].branches[0].steps[1].queue"


def test_limits_on_steps_and_nesting() -> None:
    many = defn(*[task(f"s{i}") for i in range(1001)])
    assert (None, "limit") in problems(many)
    inner: list[dict[str, Any]] = [task("leaf")]
    for depth in range(9):
        inner = [par(f"p{depth}", inner), join(f"j{depth}", f"p{depth}")]
    assert ("p0", "limit") in problems(defn(*inner))  # p0 is the innermost, 9th level


# ------------------------------------------------------------------ graph rules


def test_dangling_references_are_named_per_field() -> None:
    assert_rejects(defn(task("a", next="nope")), "a", Rule.DANGLING_REFERENCE)
    assert_rejects(defn(task("a", on_failure="nope")), "a", Rule.DANGLING_REFERENCE)
    assert_rejects(defn(wait("w", timeout_ms=5, on_timeout="nope")), "w", Rule.DANGLING_REFERENCE)
    assert_rejects(
        defn(
            {
                "id": "p",
                "type": "poll",
                "task": {"queue": "q", "kind": "k"},
                "until": True,
                "max_rounds": 1,
                "on_exhausted": "nope",
            }
        ),
        "p",
        Rule.DANGLING_REFERENCE,
    )
    assert_rejects(defn(choice("c", [(True, "nope")]), task("x")), "c", Rule.DANGLING_REFERENCE)
    assert_rejects(
        defn(choice("c", [(True, "x")], default="nope"), task("x")), "c", Rule.DANGLING_REFERENCE
    )
    assert_rejects(defn(join("j", "nope")), "j", Rule.DANGLING_REFERENCE)


def test_no_jump_out_of_a_branch() -> None:
    doc = defn(par("p", [task("a", next="after")]), join("j", "p"), task("after"))
    assert_rejects(doc, "a", Rule.CROSS_SEQUENCE_JUMP)


def test_no_jump_into_a_branch() -> None:
    doc = defn(task("start", on_failure="a"), par("p", [task("a")]), join("j", "p"))
    assert_rejects(doc, "start", Rule.CROSS_SEQUENCE_JUMP)


def test_no_jump_between_sibling_branches() -> None:
    doc = defn(par("p", [task("a", next="b")], [task("b")]), join("j", "p"))
    assert_rejects(doc, "a", Rule.CROSS_SEQUENCE_JUMP)


def test_parallel_must_be_followed_by_its_join() -> None:
    assert_rejects(defn(par("p", [task("a")]), task("x")), "p", Rule.UNSTRUCTURED_JOIN)
    assert_rejects(defn(par("p", [task("a")])), "p", Rule.UNSTRUCTURED_JOIN)


def test_join_must_close_exactly_its_parallel() -> None:
    # join naming a step that is not a parallel
    assert_rejects(defn(task("t"), join("j", "t")), "j", Rule.UNSTRUCTURED_JOIN)
    # join not directly after its parallel
    doc = defn(par("p", [task("a")]), task("x"), join("j", "p"))
    assert_rejects(doc, "j", Rule.UNSTRUCTURED_JOIN)
    # two joins for one parallel
    doc = defn(par("p", [task("a")]), join("j1", "p"), join("j2", "p"))
    assert_rejects(doc, "j2", Rule.UNSTRUCTURED_JOIN)
    # a join in another sequence than its parallel
    doc = defn(par("p", [task("a"), join("j", "p")]), join("j0", "p"))
    assert_rejects(doc, "j", Rule.UNSTRUCTURED_JOIN)


def test_nothing_but_its_parallel_enters_a_join() -> None:
    doc = defn(task("t", on_failure="j"), par("p", [task("a")]), join("j", "p"))
    assert_rejects(doc, "t", Rule.UNSTRUCTURED_JOIN)
    doc = defn(par("p", [task("a")]), join("j", "p"), choice("c", [(True, "j")]))
    assert ("c", "unstructured_join") in problems(doc)


def test_succeed_only_at_top_level() -> None:
    doc = defn(par("p", [{"id": "s", "type": "succeed"}]), join("j", "p"))
    assert_rejects(doc, "s", Rule.MISPLACED_STEP)


@pytest.mark.parametrize(
    ("doc", "step"),
    [
        (defn(task("a", next="a")), "a"),
        (defn(task("a"), task("b", next="a")), "b"),
        (defn(task("a"), choice("c", [(TRUE_EQ, "a")], default="z"), task("z")), "c"),
        (defn(wait("w", timeout_ms=10, on_timeout="w")), "w"),
        (defn(par("p", [task("a"), task("b", next="a")]), join("j", "p")), "b"),
        (defn(task("a"), par("p", [task("x")]), join("j", "p", next="a")), "j"),
    ],
)
def test_cycles_outside_poll_are_rejected(doc: Any, step: str) -> None:
    assert_rejects(doc, step, Rule.CYCLE)


def test_cycle_reason_shows_the_loop() -> None:
    [p] = validate_definition(defn(task("a"), task("b"), task("c", next="a")))
    assert p.step == "c" and "a -> b -> c -> a" in p.reason


def test_unreachable_steps() -> None:
    assert_rejects(
        defn({"id": "ok", "type": "succeed"}, task("orphan")), "orphan", Rule.UNREACHABLE
    )
    assert_rejects(defn(task("a", end=True), task("orphan")), "orphan", Rule.UNREACHABLE)
    assert_rejects(defn(task("a", next="c"), task("b"), task("c")), "b", Rule.UNREACHABLE)


def test_join_unreachable_when_a_branch_can_never_end() -> None:
    doc = defn(
        par("p", [task("a")], [{"id": "boom", "type": "fail", "error": "x"}]),
        join("j", "p"),
        task("after"),
    )
    found = validate_definition(doc)
    assert ("j", Rule.UNREACHABLE) in [(p.step, p.rule) for p in found]
    assert ("after", Rule.UNREACHABLE) in [(p.step, p.rule) for p in found]
    assert "branch 1 of 'p' never ends" in next(p.reason for p in found if p.step == "j")


def test_fail_inside_a_branch_is_fine_when_another_path_ends() -> None:
    doc = defn(
        par(
            "p",
            [
                choice("c", [(TRUE_EQ, "boom")], default="ok"),
                {"id": "boom", "type": "fail", "error": "x"},
                task("ok"),
            ],
        ),
        join("j", "p"),
    )
    # "ok" is after "boom" and reachable through the default: valid
    compile_definition(doc)


# ------------------------------------------------------------------ types and data flow


@pytest.mark.parametrize(
    ("expr", "ok"),
    [
        (True, True),
        ({"op": "==", "args": ["$.input.x", "a"]}, True),
        ("$.input.flag", False),  # json is not a bool: compare explicitly
        ({"op": "and", "args": [True, 1]}, False),
        ({"op": "not", "args": ["yes"]}, False),
        ({"op": "==", "args": [1, "1"]}, False),  # always false
        ({"op": "==", "args": [None, "$.input.x"]}, True),
        ({"op": "<", "args": [1, "a"]}, False),
        ({"op": "<", "args": [True, 1]}, False),
        ({"op": "<", "args": ["$.input.n", 3]}, True),
        ({"op": ">=", "args": [{"op": "+", "args": ["$.input.n", 1]}, 3]}, True),
        ({"op": ">", "args": [{"op": "+", "args": ["a", 1]}, 3]}, False),
        ({"op": "in", "args": ["$.input.k", {"lit": [1, 2]}]}, True),
        ({"op": "in", "args": ["$.input.k", "abc"]}, False),
        ({"op": "exists", "args": ["$.input.k"]}, True),
        ({"op": "==", "args": [{"op": "concat", "args": ["a", 1]}, "a1"]}, True),
        ({"op": "==", "args": [{"op": "concat", "args": ["a", True]}, "a1"]}, False),
        ({"op": "==", "args": ["$.result", 1]}, False),  # $.result only in a poll
        (
            {"op": "or", "args": [True, {"op": "!=", "args": [{"lit": [1]}, {"lit": {"a": 1}}]}]},
            False,
        ),
    ],
)
def test_choice_conditions_are_type_checked(expr: Any, ok: bool) -> None:
    doc = defn(choice("c", [(expr, "x")], default="x"), task("x"))
    if ok:
        compile_definition(doc)
    else:
        found = validate_definition(doc)
        assert found and found[0].step == "c"
        assert found[0].rule in (Rule.TYPE_ERROR, Rule.UNAVAILABLE_OUTPUT), found[0]


def test_declared_schemas_type_paths() -> None:
    typed = {
        "object": {
            "n": "number",
            "tags": {"array": "string"},
            "inner": {"nullable": {"object": {"ok": "bool"}}},
        }
    }
    base = {"input_schema": typed}
    ok_cases = [
        {"op": "<", "args": ["$.input.n", 3]},
        {"op": "==", "args": ["$.input.tags[0]", "x"]},
        "$.input.inner.ok",  # through a nullable object: bool if it evaluates
        {"op": "==", "args": ["$.input.other", 5]},  # undeclared field: json
    ]
    for expr in ok_cases:
        compile_definition(defn(choice("c", [(expr, "x")], default="x"), task("x"), **base))
    bad_cases = [
        {"op": "==", "args": ["$.input.n", "three"]},
        {"op": "==", "args": ["$.input.n.deeper", 1]},  # field of a number
        {"op": "==", "args": ["$.input.tags.x", 1]},  # field of an array
        {"op": "==", "args": ["$.input[0]", 1]},  # index of an object
        "$.input.n",  # a number as condition
    ]
    for expr in bad_cases:
        assert problems(defn(choice("c", [(expr, "x")], default="x"), task("x"), **base))[0] == (
            "c",
            "type_error",
        )


def test_step_outputs_are_typed_by_output_schema() -> None:
    doc = defn(
        task("pay", output_schema={"object": {"status": "string"}}),
        choice("c", [({"op": "==", "args": ["$.steps.pay.output.status", 200]}, "x")], default="x"),
        task("x"),
    )
    assert_rejects(doc, "c", Rule.TYPE_ERROR)


def test_outputs_on_failure_paths_become_nullable() -> None:
    # On the on_failure path "pay" did not succeed: its output may be null, so it is not a
    # bool any more -> the condition that was fine on the success path is rejected.
    cond = {"op": "and", "args": ["$.steps.pay.output.ok", True]}
    good = defn(
        task("pay", output_schema={"object": {"ok": "bool"}}),
        choice("c", [(cond, "x")], default="x"),
        task("x"),
    )
    compile_definition(good)
    bad = defn(
        task("pay", output_schema="bool", on_failure="c"),
        choice("c", [({"op": "and", "args": ["$.steps.pay.output", True]}, "x")], default="x"),
        task("x"),
    )
    assert_rejects(bad, "c", Rule.TYPE_ERROR)


def test_reading_a_step_that_may_not_have_run_is_rejected() -> None:
    # "b" runs only on one branch of the choice; "after" cannot read it.
    doc = defn(
        choice("c", [(TRUE_EQ, "b")], default="after"),
        task("b"),
        task("after", payload={"x": {"$": "$.steps.b.output"}}),
    )
    assert_rejects(doc, "after", Rule.UNAVAILABLE_OUTPUT)


def test_reading_a_later_step_is_rejected() -> None:
    doc = defn(task("a", payload={"x": {"$": "$.steps.b.output"}}), task("b"))
    assert_rejects(doc, "a", Rule.UNAVAILABLE_OUTPUT)


def test_reading_itself_is_rejected() -> None:
    assert_rejects(defn(task("a", payload={"$": "$.steps.a.output"})), "a", Rule.UNAVAILABLE_OUTPUT)


def test_reading_an_unknown_step_is_rejected() -> None:
    assert_rejects(
        defn(task("a", payload={"$": "$.steps.ghost.output"})), "a", Rule.UNAVAILABLE_OUTPUT
    )


def test_sibling_branches_cannot_read_each_other_but_after_join_can() -> None:
    bad = defn(
        par("p", [task("a")], [task("b", payload={"$": "$.steps.a.output"})]), join("j", "p")
    )
    assert_rejects(bad, "b", Rule.UNAVAILABLE_OUTPUT)
    good = defn(
        par("p", [task("a")], [task("b")]),
        join("j", "p"),
        task("after", payload={"a": {"$": "$.steps.a.output"}, "b": {"$": "$.steps.b.output"}}),
    )
    compile_definition(good)


def test_steps_without_output_cannot_be_read() -> None:
    doc = defn(
        {"id": "nap", "type": "sleep", "duration_ms": 1},
        task("a", payload={"$": "$.steps.nap.output"}),
    )
    assert_rejects(doc, "a", Rule.UNAVAILABLE_OUTPUT)
    # but their error (null) may be read
    compile_definition(
        defn(
            {"id": "nap", "type": "sleep", "duration_ms": 1},
            task("a", payload={"$": "$.steps.nap.error"}),
        )
    )


def test_poll_until_reads_the_round_result_with_its_type() -> None:
    def poll(until: Any) -> dict[str, Any]:
        return {
            "id": "p",
            "type": "poll",
            "task": {"queue": "q", "kind": "k", "output_schema": {"object": {"state": "string"}}},
            "until": until,
            "max_rounds": 2,
        }

    compile_definition(defn(poll({"op": "==", "args": ["$.result.state", "done"]})))
    assert_rejects(defn(poll({"op": "==", "args": ["$.result.state", 1]})), "p", Rule.TYPE_ERROR)
    assert_rejects(defn(poll("$.result.state")), "p", Rule.TYPE_ERROR)
    # the poll's own payload may not read $.result
    bad = defn(
        {
            "id": "p",
            "type": "poll",
            "task": {"queue": "q", "kind": "k", "payload": {"$": "$.result"}},
            "until": True,
            "max_rounds": 1,
        }
    )
    assert_rejects(bad, "p", Rule.TYPE_ERROR)


@pytest.mark.parametrize(
    "step",
    [
        wait("w", correlation_key=5),
        wait("w", correlation_key={"op": "+", "args": [1, 2]}),
        {"id": "w", "type": "sleep", "until": 12},
        task("w", concurrency_key=True),
        {"id": "w", "type": "succeed", "output": {"x": {"$": {"op": "-", "args": ["a", 1]}}}},
        {"id": "w", "type": "fail", "error": "e", "message": {"$": {"op": "not", "args": [1]}}},
    ],
)
def test_other_expression_sites_are_type_checked(step: dict[str, Any]) -> None:
    assert_rejects(defn(step), "w", Rule.TYPE_ERROR)


def test_all_problems_are_reported_in_document_order() -> None:
    doc = defn(task("a", next="x1"), task("b", next="x2"), task("c", on_failure="x3"))
    assert problems(doc) == [
        ("a", "dangling_reference"),
        ("b", "dangling_reference"),
        ("c", "dangling_reference"),
    ]


def test_invalid_json_text() -> None:
    assert problems("{nope") == [(None, "schema")]
