"""Structural parsing: decoded definition JSON → model objects (references not yet checked).

The parser checks what one step can check alone: required fields, JSON types, ranges, names,
unknown fields, expression syntax, type specs, ids unique. Graph and type rules are the
validator's (:mod:`weave.definition.validator`), which runs only on a structurally valid draft.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from weave.definition.expressions import Template
from weave.definition.fields import MAX_STEPS, Fields
from weave.definition.model import (
    ROOT,
    ChoiceCase,
    ChoiceStep,
    FailStep,
    JoinStep,
    ParallelStep,
    PollStep,
    RetryPolicy,
    Sequence,
    SequenceRef,
    SleepStep,
    Step,
    StepType,
    SucceedStep,
    TaskSpec,
    TaskStep,
    WaitSignalStep,
)
from weave.definition.problems import Problem, Rule
from weave.definition.valuetypes import JSON, VType

#: Step ids: usable in paths as ``$.steps.<id>``.
STEP_ID_RE = re.compile(r"[A-Za-z_][A-Za-z0-9_]{0,62}")
#: The names rule (docs/api/conventions.md#names) for queues and signals.
NAME_RE = re.compile(r"(?!\.\.?\Z)[A-Za-z0-9_.\-]{1,63}")
#: Error codes of fail steps.
ERROR_CODE_RE = re.compile(r"[A-Za-z0-9_.\-]{1,64}")

MAX_BRANCHES = 64
MAX_PARALLEL_DEPTH = 8
MAX_DESCRIPTION = 1000
MAX_ATTEMPTS = 1000
MAX_ROUNDS = 100_000

TOP_FIELDS = {"steps", "input_schema", "description"}
COMMON_FIELDS = {"id", "type", "description"}
FLOW_FIELDS = {"next", "end"}
TASK_SPEC_FIELDS = {
    "queue",
    "kind",
    "pipeline_version",
    "payload",
    "priority",
    "retry",
    "retry_safe",
    "deadline_ms",
    "concurrency_key",
    "output_schema",
}
RETRY_FIELDS = {"max_attempts", "backoff_initial_ms", "backoff_max_ms", "backoff_multiplier"}


@dataclass
class Draft:
    """Parse result: the steps in document order plus what the validator needs."""

    root: Sequence | None = None
    steps: dict[str, Step] = field(default_factory=dict)
    sequences: dict[str, Sequence] = field(default_factory=dict)
    input_type: VType = JSON
    description: str | None = None
    #: Steps whose ``next`` was written explicitly (others fall through).
    explicit_next: set[str] = field(default_factory=set)
    #: JSON location of each step, e.g. ``steps[3].branches[0].steps[1]``.
    locations: dict[str, str] = field(default_factory=dict)
    #: Nesting depth of each sequence key.
    depth: dict[str, int] = field(default_factory=dict)
    problems: list[Problem] = field(default_factory=list)


def parse_definition(doc: Any) -> Draft:
    """Parse a decoded definition document into a :class:`Draft` (problems inside)."""
    d = Draft()
    if not isinstance(doc, dict):
        d.problems.append(Problem(None, "a definition is a JSON object", Rule.SCHEMA, None))
        return d
    top = Fields(doc, None, "", d.problems)
    top.only(TOP_FIELDS)
    d.description = top.string("description", max_len=MAX_DESCRIPTION)
    d.input_type = top.vtype("input_schema")
    steps = top.list_field("steps", required=True, hi=10**9)  # counted below
    if steps is None:
        return d
    d.root = _parse_sequence(d, steps, ROOT, "steps", None, 0)
    if len(d.steps) > MAX_STEPS:
        d.problems.append(Problem(None, f"more than {MAX_STEPS} steps", Rule.LIMIT, "steps"))
    return d


def _parse_sequence(
    d: Draft, items: list[Any], ref: SequenceRef, loc: str, name: str | None, depth: int
) -> Sequence:
    ids: list[str] = []
    parsed: list[tuple[int, dict[str, Any], str]] = []
    for i, item in enumerate(items):
        iloc = f"{loc}[{i}]"
        if not isinstance(item, dict):
            d.problems.append(Problem(None, "a step is a JSON object", Rule.SCHEMA, iloc))
            continue
        sid = item.get("id")
        if not isinstance(sid, str) or STEP_ID_RE.fullmatch(sid) is None:
            d.problems.append(
                Problem(
                    sid if isinstance(sid, str) else None,
                    "step id is required: 1-63 letters, digits or _, not starting with a digit",
                    Rule.INVALID_NAME,
                    f"{iloc}.id",
                )
            )
            continue
        if sid in d.locations:
            d.problems.append(
                Problem(
                    sid,
                    f"duplicate step id (first at {d.locations[sid]})",
                    Rule.DUPLICATE_ID,
                    f"{iloc}.id",
                )
            )
            continue
        d.locations[sid] = iloc
        ids.append(sid)
        parsed.append((len(ids) - 1, item, iloc))
    seq = Sequence(ref, tuple(ids), name)
    d.sequences[ref.key] = seq
    d.depth[ref.key] = depth
    for index, item, iloc in parsed:
        step = _parse_step(d, item, seq, index, iloc, depth)
        if step is not None:
            d.steps[step.id] = step
    return seq


_FLOW_TYPES = {StepType.TASK, StepType.WAIT_SIGNAL, StepType.SLEEP, StepType.POLL, StepType.JOIN}


def _parse_step(
    d: Draft, item: dict[str, Any], seq: Sequence, index: int, loc: str, depth: int
) -> Step | None:
    sid = seq.step_ids[index]
    f = Fields(item, sid, loc, d.problems)
    raw_type = item.get("type")
    try:
        stype = StepType(raw_type) if isinstance(raw_type, str) else None
    except ValueError:
        stype = None
    if stype is None:
        f.fail("type", f"type must be one of {', '.join(t.value for t in StepType)}")
        return None
    description = f.string("description", max_len=MAX_DESCRIPTION)
    # continuation
    nxt: str | None = None
    if stype in _FLOW_TYPES:
        explicit = f.ref("next")
        end = f.boolean("end")
        if explicit is not None and end:
            f.fail("end", "a step has either next or end: true, not both")
        if explicit is not None:
            nxt = explicit
            d.explicit_next.add(sid)
        elif not end and index + 1 < len(seq.step_ids):
            nxt = seq.step_ids[index + 1]
    elif f.has("next") or f.has("end"):
        why = {
            StepType.PARALLEL: "a parallel continues at its join",
            StepType.CHOICE: "a choice continues at the next of a case or its default",
        }.get(stype, f"a {stype.value} step ends the instance")
        f.fail("next" if f.has("next") else "end", f"{why}: it has no next or end")
    common = {"id": sid, "seq": seq.ref, "index": index, "next": nxt, "description": description}
    builder = _BUILDERS[stype]
    step = builder(d, f, common, seq, index, loc, depth)
    return step if f.ok else None


def _parse_retry(f: Fields, obj: dict[str, Any], *, allow_attempts: bool) -> RetryPolicy | None:
    r = Fields(obj, f.step, f"{f.loc}.retry", f.problems)
    r.only(RETRY_FIELDS if allow_attempts else RETRY_FIELDS - {"max_attempts"})
    if not allow_attempts and "max_attempts" in obj:
        r.fail("max_attempts", "a poll's per-round attempts are the poll's max_attempts")
    policy = RetryPolicy(
        max_attempts=r.integer("max_attempts", lo=1, hi=MAX_ATTEMPTS) if allow_attempts else None,
        backoff_initial_ms=r.integer("backoff_initial_ms"),
        backoff_max_ms=r.integer("backoff_max_ms"),
        backoff_multiplier=r.number("backoff_multiplier", lo=1, hi=100),
    )
    if (
        policy.backoff_initial_ms is not None
        and policy.backoff_max_ms is not None
        and policy.backoff_max_ms < policy.backoff_initial_ms
    ):
        r.fail("backoff_max_ms", "backoff_max_ms must be at least backoff_initial_ms")
    if not r.ok:
        f.ok = False
    return policy


def _parse_task_spec(f: Fields, *, allow_attempts: bool) -> TaskSpec | None:
    queue = f.string(
        "queue", required=True, pattern=NAME_RE, rule=Rule.INVALID_NAME, what="queue name"
    )
    kind = f.string("kind", required=True, max_len=255)
    pipeline_version = f.string("pipeline_version", max_len=64) or ""
    payload = f.template("payload")
    priority = f.integer("priority", lo=0, hi=9)
    retry_obj = f.obj_field("retry")
    retry = (
        _parse_retry(f, retry_obj, allow_attempts=allow_attempts) if retry_obj is not None else None
    )
    retry_safe = f.boolean("retry_safe") or False
    deadline_ms = f.integer("deadline_ms", lo=1)
    concurrency_key = f.expr("concurrency_key")
    output_type = f.vtype("output_schema")
    if queue is None or kind is None:
        return None
    return TaskSpec(
        queue=queue,
        kind=kind,
        payload=payload if payload is not None else Template({}),
        pipeline_version=pipeline_version,
        priority=priority,
        retry=retry,
        retry_safe=retry_safe,
        deadline_ms=deadline_ms,
        concurrency_key=concurrency_key,
        output_type=output_type,
    )


Builder = Callable[[Draft, Fields, dict[str, Any], Sequence, int, str, int], Step | None]


def _task(
    d: Draft, f: Fields, common: dict[str, Any], seq: Sequence, index: int, loc: str, depth: int
) -> Step | None:
    f.only(COMMON_FIELDS | FLOW_FIELDS | TASK_SPEC_FIELDS | {"on_failure"})
    spec = _parse_task_spec(f, allow_attempts=True)
    on_failure = f.ref("on_failure")
    if spec is None:
        return None
    return TaskStep(**common, task=spec, on_failure=on_failure)


def _wait_signal(
    d: Draft, f: Fields, common: dict[str, Any], seq: Sequence, index: int, loc: str, depth: int
) -> Step | None:
    f.only(
        COMMON_FIELDS
        | FLOW_FIELDS
        | {"signal", "correlation_key", "timeout_ms", "on_timeout", "output_schema"}
    )
    signal = f.string(
        "signal",
        required=True,
        pattern=NAME_RE,
        rule=Rule.INVALID_NAME,
        what="signal name (1-63 letters, digits, _, - or .)",
    )
    correlation_key = f.expr("correlation_key")
    timeout_ms = f.integer("timeout_ms", lo=1)
    on_timeout = f.ref("on_timeout")
    if on_timeout is not None and timeout_ms is None:
        f.fail("on_timeout", "on_timeout needs timeout_ms")
    payload_type = f.vtype("output_schema")
    if signal is None:
        return None
    return WaitSignalStep(
        **common,
        signal=signal,
        correlation_key=correlation_key,
        timeout_ms=timeout_ms,
        on_timeout=on_timeout,
        payload_type=payload_type,
    )


def _sleep(
    d: Draft, f: Fields, common: dict[str, Any], seq: Sequence, index: int, loc: str, depth: int
) -> Step | None:
    f.only(COMMON_FIELDS | FLOW_FIELDS | {"duration_ms", "until"})
    duration_ms = f.integer("duration_ms", lo=0)
    until = f.expr("until")
    if f.has("duration_ms") == f.has("until"):
        f.fail(None, "a sleep has exactly one of duration_ms or until")
    return SleepStep(**common, duration_ms=duration_ms, until=until)


def _poll(
    d: Draft, f: Fields, common: dict[str, Any], seq: Sequence, index: int, loc: str, depth: int
) -> Step | None:
    f.only(
        COMMON_FIELDS
        | FLOW_FIELDS
        | {
            "task",
            "until",
            "max_attempts",
            "interval_ms",
            "max_rounds",
            "deadline_ms",
            "on_exhausted",
        }
    )
    task_obj = f.obj_field("task", required=True)
    spec = None
    if task_obj is not None:
        tf = Fields(task_obj, f.step, f"{loc}.task", f.problems)
        tf.only(TASK_SPEC_FIELDS)
        spec = _parse_task_spec(tf, allow_attempts=False)
        if not tf.ok:
            f.ok = False
    until = f.expr("until", required=True)
    max_attempts = f.integer("max_attempts", lo=1, hi=MAX_ATTEMPTS)
    interval_ms = f.integer("interval_ms", lo=0)
    max_rounds = f.integer("max_rounds", required=True, lo=1, hi=MAX_ROUNDS)
    deadline_ms = f.integer("deadline_ms", lo=1)
    on_exhausted = f.ref("on_exhausted")
    if spec is None or until is None or max_rounds is None:
        f.ok = False
        return None
    return PollStep(
        **common,
        task=spec,
        until=until,
        max_attempts=max_attempts or 1,
        interval_ms=interval_ms or 0,
        max_rounds=max_rounds,
        deadline_ms=deadline_ms,
        on_exhausted=on_exhausted,
    )


def _parallel(
    d: Draft, f: Fields, common: dict[str, Any], seq: Sequence, index: int, loc: str, depth: int
) -> Step | None:
    f.only(FLOW_FIELDS | COMMON_FIELDS | {"branches"})
    branches = f.list_field("branches", required=True, lo=1, hi=MAX_BRANCHES)
    if branches is None:
        return None
    if depth + 1 > MAX_PARALLEL_DEPTH:
        f.fail(
            "branches", f"parallel steps nested deeper than {MAX_PARALLEL_DEPTH} levels", Rule.LIMIT
        )
        return None
    sid = common["id"]
    out: list[Sequence] = []
    for b, branch in enumerate(branches):
        bloc = f"{loc}.branches[{b}]"
        if not isinstance(branch, dict):
            f.fail(f"branches[{b}]", "a branch is an object with steps")
            continue
        bf = Fields(branch, sid, bloc, d.problems)
        bf.only({"name", "steps"})
        name = bf.string("name", max_len=63)
        steps = bf.list_field("steps", required=True, hi=10**9)
        if steps is None:
            f.ok = False
            continue
        out.append(_parse_sequence(d, steps, SequenceRef(sid, b), f"{bloc}.steps", name, depth + 1))
    join = seq.step_ids[index + 1] if index + 1 < len(seq.step_ids) else ""
    return ParallelStep(**common, branches=tuple(out), join=join)


def _join(
    d: Draft, f: Fields, common: dict[str, Any], seq: Sequence, index: int, loc: str, depth: int
) -> Step | None:
    f.only(COMMON_FIELDS | FLOW_FIELDS | {"parallel", "policy"})
    parallel = f.ref("parallel")
    if parallel is None and not f.has("parallel"):
        f.fail("parallel", "parallel is required: the id of the parallel step this join closes")
    policy = f.string("policy") or "all"
    if policy != "all":
        f.fail("policy", 'the only join policy is "all"')
    if parallel is None:
        return None
    return JoinStep(**common, parallel=parallel, policy=policy)


def _choice(
    d: Draft, f: Fields, common: dict[str, Any], seq: Sequence, index: int, loc: str, depth: int
) -> Step | None:
    f.only(FLOW_FIELDS | COMMON_FIELDS | {"cases", "default"})
    cases_raw = f.list_field("cases", required=True, lo=1, hi=MAX_STEPS)
    default = f.ref("default")
    cases: list[ChoiceCase] = []
    for i, c in enumerate(cases_raw or []):
        if not isinstance(c, dict):
            f.fail(f"cases[{i}]", "a case is an object with when and next")
            continue
        cf = Fields(c, f.step, f"{loc}.cases[{i}]", d.problems)
        cf.only({"when", "next"})
        when = cf.expr("when", required=True)
        nxt = cf.ref("next")
        if nxt is None and not cf.has("next"):
            cf.fail("next", "next is required")
        if when is not None and nxt is not None:
            cases.append(ChoiceCase(when, nxt))
        if not cf.ok:
            f.ok = False
    return ChoiceStep(**common, cases=tuple(cases), default=default)


def _succeed(
    d: Draft, f: Fields, common: dict[str, Any], seq: Sequence, index: int, loc: str, depth: int
) -> Step | None:
    f.only(FLOW_FIELDS | COMMON_FIELDS | {"output"})
    return SucceedStep(**common, output=f.template("output"))


def _fail(
    d: Draft, f: Fields, common: dict[str, Any], seq: Sequence, index: int, loc: str, depth: int
) -> Step | None:
    f.only(FLOW_FIELDS | COMMON_FIELDS | {"error", "message"})
    error = f.string(
        "error",
        required=True,
        pattern=ERROR_CODE_RE,
        what="error code (1-64 letters, digits, _, - or .)",
    )
    message = f.template("message")
    if error is None:
        return None
    return FailStep(**common, error=error, message=message)


_BUILDERS: dict[StepType, Builder] = {
    StepType.TASK: _task,
    StepType.WAIT_SIGNAL: _wait_signal,
    StepType.SLEEP: _sleep,
    StepType.POLL: _poll,
    StepType.PARALLEL: _parallel,
    StepType.JOIN: _join,
    StepType.CHOICE: _choice,
    StepType.SUCCEED: _succeed,
    StepType.FAIL: _fail,
}
