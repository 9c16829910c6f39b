"""Hypothesis over random definitions: valid ones validate (and every walk through the
compiled model ends), and a mutation that breaks one rule is rejected naming the step."""

from __future__ import annotations

import random
from collections.abc import Iterator
from typing import Any

from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st

from weave.definition import Rule, compile_definition, validate_definition
from weave.definition.expressions import Scope
from weave.definition.model import (
    ChoiceStep,
    Definition,
    EndSequence,
    FailInstance,
    Goto,
    Outcome,
    ParallelStep,
    PollStep,
    SucceedInstance,
    TaskStep,
    WaitSignalStep,
)

CONDITIONS: list[Any] = [
    {"op": "==", "args": ["$.input.a", 1]},
    {
        "op": "and",
        "args": [{"op": ">", "args": ["$.input.n", 3]}, {"op": "exists", "args": ["$.input.x"]}],
    },
    {"op": "not", "args": [{"op": "in", "args": ["$.input.k", {"lit": [1, 2]}]}]},
    {"op": "or", "args": [{"op": "<", "args": [{"op": "*", "args": ["$.input.n", 2]}, 10]}, False]},
]
FLOW = ["task", "wait", "sleep", "poll"]
HAS_OUTPUT = {"task", "wait_signal", "poll"}


class Ids:
    def __init__(self) -> None:
        self.n = 0

    def new(self, prefix: str) -> str:
        self.n += 1
        return f"{prefix}{self.n}"


@st.composite
def definitions(draw: st.DrawFn, max_units: int = 5) -> dict[str, Any]:
    ids = Ids()
    steps = draw_sequence(draw, ids, depth=0, top=True, max_units=max_units)
    first = steps[0]
    if first["type"] in HAS_OUTPUT:
        # every later top-level task may read the start step's output: it dominates them
        for s in steps[1:]:
            if s["type"] == "task" and draw(st.booleans()):
                s["payload"] = {
                    "first": {"$": f"$.steps.{first['id']}.output"},
                    "a": {"$": "$.input.a"},
                }
    return {"steps": steps}


def draw_sequence(
    draw: st.DrawFn, ids: Ids, depth: int, top: bool, max_units: int
) -> list[dict[str, Any]]:
    n = draw(st.integers(1, max_units))
    kinds: list[str] = []
    for i in range(n):
        last = i == n - 1
        options = list(FLOW)
        if not last:
            options.append("choice")
        if depth < 2:
            options.append("parallel")
        kinds.append(draw(st.sampled_from(options)))
    if top:
        kinds.append(draw(st.sampled_from(["succeed", "fail", "task"])))
    # Lay out units; a parallel takes two slots (parallel + join).
    steps: list[dict[str, Any]] = []
    for kind in kinds:
        if kind == "parallel":
            pid = ids.new("p")
            branches = [
                {
                    "name": f"b{b}",
                    "steps": draw_sequence(draw, ids, depth + 1, False, max(1, max_units - 2)),
                }
                for b in range(draw(st.integers(1, 3)))
            ]
            steps.append({"id": pid, "type": "parallel", "branches": branches})
            steps.append({"id": ids.new("j"), "type": "join", "parallel": pid})
        else:
            steps.append(make_step(draw, ids, kind))
    # Forward edges (never to a join, never skipping the only way into the next step).
    targets = [i for i, s in enumerate(steps) if s["type"] != "join"]
    for i, s in enumerate(steps):
        later = [steps[j]["id"] for j in targets if j > i]
        if s["type"] == "choice":
            cases = draw(st.lists(st.sampled_from(later), min_size=1, max_size=3))
            s["cases"] = [{"when": draw(st.sampled_from(CONDITIONS)), "next": t} for t in cases]
            s["default"] = steps[i + 1]["id"]
            assert steps[i + 1]["type"] != "join"
        elif s["type"] in ("task", "wait_signal", "poll") and later and draw(st.booleans()):
            field = {"task": "on_failure", "wait_signal": "on_timeout", "poll": "on_exhausted"}[
                s["type"]
            ]
            s[field] = draw(st.sampled_from(later))
            if field == "on_timeout":
                s["timeout_ms"] = 1000
        if (
            s["type"] in ("task", "sleep")
            and i + 1 < len(steps)
            and steps[i + 1]["type"] != "join"
            and draw(st.booleans())
        ):
            s["next"] = steps[i + 1]["id"]  # explicit, same as falling through
    return steps


def make_step(draw: st.DrawFn, ids: Ids, kind: str) -> dict[str, Any]:
    if kind == "task":
        return {
            "id": ids.new("t"),
            "type": "task",
            "queue": "q",
            "kind": "k",
            "payload": {"a": {"$": "$.input.a"}},
        }
    if kind == "wait":
        return {"id": ids.new("w"), "type": "wait_signal", "signal": "sig.nal-1"}
    if kind == "sleep":
        return {"id": ids.new("s"), "type": "sleep", "duration_ms": draw(st.integers(0, 10_000))}
    if kind == "poll":
        return {
            "id": ids.new("poll"),
            "type": "poll",
            "task": {"queue": "q", "kind": "status", "output_schema": {"object": {"done": "bool"}}},
            "until": "$.result.done",
            "max_rounds": draw(st.integers(1, 5)),
        }
    if kind == "choice":
        return {"id": ids.new("c"), "type": "choice"}
    if kind == "succeed":
        return {"id": ids.new("ok"), "type": "succeed", "output": {"$": "$.input"}}
    if kind == "fail":
        return {"id": ids.new("f"), "type": "fail", "error": "bad"}
    raise AssertionError(kind)


def all_sequences(doc: dict[str, Any]) -> Iterator[list[dict[str, Any]]]:
    def walk(seq: list[dict[str, Any]]) -> Iterator[list[dict[str, Any]]]:
        yield seq
        for s in seq:
            if s["type"] == "parallel":
                for b in s["branches"]:
                    yield from walk(b["steps"])

    yield from walk(doc["steps"])


def all_steps(doc: dict[str, Any]) -> list[dict[str, Any]]:
    return [s for seq in all_sequences(doc) for s in seq]


def rules_at(doc: dict[str, Any], step: str) -> set[Rule]:
    return {p.rule for p in validate_definition(doc) if p.step == step}


# The valid-definition properties get more examples than each single-rule mutation.
SETTINGS = settings(
    max_examples=60,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much],
)
MAIN = settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])


# ------------------------------------------------------------------ valid definitions


@MAIN
@given(definitions())
def test_random_valid_definitions_validate(doc: dict[str, Any]) -> None:
    assert validate_definition(doc) == []
    d = compile_definition(doc)
    assert len(d.steps) == len(all_steps(doc))


def walk(d: Definition, rng: random.Random) -> tuple[str, int]:
    """Drive the model like an engine with random outcomes; return how it ended."""
    active = [d.start]
    ended_branches: set[tuple[str | None, int | None]] = set()
    done: set[str] = set()
    moves = 0
    while active:
        moves += 1
        assert moves < 10 * len(d.steps) + 10, "the walk does not end"
        sid = active.pop(rng.randrange(len(active)))
        assert sid not in done, f"step {sid} entered twice"
        done.add(sid)
        s = d.steps[sid]
        if isinstance(s, ParallelStep):
            active.extend(d.branch_starts(sid))
            continue
        if isinstance(s, ChoiceStep):
            t = d.choose(
                sid, Scope(input={"a": rng.choice([1, 2]), "n": rng.randint(0, 9), "k": 1, "x": 0})
            )
        else:
            outcome = Outcome.OK
            if isinstance(s, TaskStep) and rng.random() < 0.3:
                outcome = Outcome.FAILED
            elif isinstance(s, WaitSignalStep) and s.timeout_ms and rng.random() < 0.3:
                outcome = Outcome.TIMED_OUT
            elif isinstance(s, PollStep) and rng.random() < 0.3:
                outcome = Outcome.EXHAUSTED
            t = d.transition(sid, outcome)
        if isinstance(t, Goto):
            active.append(t.step)
        elif isinstance(t, SucceedInstance | FailInstance):
            return type(t).__name__, moves
        elif isinstance(t, EndSequence):
            if t.seq.parallel is None:
                return "EndSequence", moves
            ended_branches.add((t.seq.parallel, t.seq.branch))
            p = d.steps[t.seq.parallel]
            assert isinstance(p, ParallelStep)
            if all((p.id, b.ref.branch) in ended_branches for b in p.branches):
                nxt = d.transition(p.id, Outcome.OK)
                assert isinstance(nxt, Goto) and nxt.step == p.join
                active.append(nxt.step)
    raise AssertionError("nothing left to run but the instance did not end")


@MAIN
@given(definitions(), st.integers(0, 2**32))
def test_every_walk_through_a_valid_definition_ends(doc: dict[str, Any], seed: int) -> None:
    d = compile_definition(doc)
    how, _ = walk(d, random.Random(seed))
    assert how in ("SucceedInstance", "FailInstance", "EndSequence")


# ------------------------------------------------------------------ mutations


@SETTINGS
@given(definitions(), st.data())
def test_dangling_reference_is_rejected(doc: dict[str, Any], data: st.DataObject) -> None:
    flow = [
        s for s in all_steps(doc) if s["type"] in ("task", "wait_signal", "sleep", "poll", "join")
    ]
    assume(flow)
    s = data.draw(st.sampled_from(flow))
    s.pop("end", None)
    s["next"] = "no_such_step"
    assert Rule.DANGLING_REFERENCE in rules_at(doc, s["id"])


@SETTINGS
@given(definitions(), st.data())
def test_back_jump_is_rejected_as_a_cycle(doc: dict[str, Any], data: st.DataObject) -> None:
    candidates = [
        (seq, i)
        for seq in all_sequences(doc)
        for i, s in enumerate(seq)
        if s["type"] in ("task", "wait_signal", "sleep", "poll", "join")
    ]
    assume(candidates)
    seq, i = data.draw(st.sampled_from(candidates))
    seq[i]["next"] = seq[0]["id"] if seq[0]["type"] != "join" else seq[i]["id"]
    assert rules_at(doc, seq[i]["id"]) == {Rule.CYCLE}


@SETTINGS
@given(definitions(), st.data())
def test_jump_out_of_a_branch_is_rejected(doc: dict[str, Any], data: st.DataObject) -> None:
    inner = [
        s
        for seq in list(all_sequences(doc))[1:]
        for s in seq
        if s["type"] in ("task", "sleep", "wait_signal", "poll")
    ]
    assume(inner)
    s = data.draw(st.sampled_from(inner))
    s["next"] = doc["steps"][0]["id"]
    assert Rule.CROSS_SEQUENCE_JUMP in rules_at(doc, s["id"])


@SETTINGS
@given(definitions(), st.data())
def test_jump_into_a_branch_is_rejected(doc: dict[str, Any], data: st.DataObject) -> None:
    inner = [s["id"] for seq in list(all_sequences(doc))[1:] for s in seq if s["type"] != "join"]
    top = [s for s in doc["steps"] if s["type"] == "task"]
    assume(inner and top)
    s = data.draw(st.sampled_from(top))
    s["on_failure"] = data.draw(st.sampled_from(inner))
    assert Rule.CROSS_SEQUENCE_JUMP in rules_at(doc, s["id"])


@SETTINGS
@given(definitions(), st.data())
def test_removing_a_join_is_rejected(doc: dict[str, Any], data: st.DataObject) -> None:
    places = [
        (seq, i) for seq in all_sequences(doc) for i, s in enumerate(seq) if s["type"] == "join"
    ]
    assume(places)
    seq, i = data.draw(st.sampled_from(places))
    parallel = seq[i]["parallel"]
    del seq[i]
    assert Rule.UNSTRUCTURED_JOIN in rules_at(doc, parallel)


@SETTINGS
@given(definitions(), st.data())
def test_ill_typed_payload_is_rejected(doc: dict[str, Any], data: st.DataObject) -> None:
    tasks = [s for s in all_steps(doc) if s["type"] == "task"]
    assume(tasks)
    s = data.draw(st.sampled_from(tasks))
    s["payload"] = {
        "n": {"$": {"op": data.draw(st.sampled_from(["+", "-", "*"])), "args": ["text", 1]}}
    }
    assert rules_at(doc, s["id"]) == {Rule.TYPE_ERROR}


@SETTINGS
@given(definitions(), st.data())
def test_ill_typed_condition_is_rejected(doc: dict[str, Any], data: st.DataObject) -> None:
    choices = [s for s in all_steps(doc) if s["type"] == "choice"]
    assume(choices)
    s = data.draw(st.sampled_from(choices))
    s["cases"][0]["when"] = data.draw(
        st.sampled_from(
            ["$.input.a", {"op": "and", "args": [1, True]}, {"op": "==", "args": [1, "1"]}]
        )
    )
    assert rules_at(doc, s["id"]) == {Rule.TYPE_ERROR}


@SETTINGS
@given(definitions())
def test_step_after_the_end_is_unreachable(doc: dict[str, Any]) -> None:
    last = doc["steps"][-1]
    if last["type"] not in ("succeed", "fail"):
        last["end"] = True
    doc["steps"].append({"id": "orphan", "type": "task", "queue": "q", "kind": "k"})
    assert rules_at(doc, "orphan") == {Rule.UNREACHABLE}


@SETTINGS
@given(definitions(), st.data())
def test_duplicate_id_is_rejected(doc: dict[str, Any], data: st.DataObject) -> None:
    steps = all_steps(doc)
    assume(len(steps) >= 2)
    a, b = data.draw(
        st.lists(st.sampled_from(range(len(steps))), min_size=2, max_size=2, unique=True)
    )
    steps[b]["id"] = steps[a]["id"]
    assert Rule.DUPLICATE_ID in rules_at(doc, steps[a]["id"])


@SETTINGS
@given(definitions(), st.data())
def test_reading_a_later_step_is_rejected(doc: dict[str, Any], data: st.DataObject) -> None:
    top = doc["steps"]
    pairs = [
        (i, j)
        for i in range(len(top))
        for j in range(i + 1, len(top))
        if top[i]["type"] == "task" and top[j]["type"] in HAS_OUTPUT
    ]
    assume(pairs)
    i, j = data.draw(st.sampled_from(pairs))
    top[i]["payload"] = {"later": {"$": f"$.steps.{top[j]['id']}.output"}}
    assert rules_at(doc, top[i]["id"]) == {Rule.UNAVAILABLE_OUTPUT}
