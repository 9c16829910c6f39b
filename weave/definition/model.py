"""The validated, immutable model of a workflow definition — what the engine walks.

Produced only by :func:`weave.definition.compile_definition` (parse + validate), so every
reference resolves, every join is structured, the graph has no cycles and every expression
type-checks. The engine never re-validates; it asks the model where to go next::

    d = compile_definition(text)
    d.start                                  # first step of the top-level sequence
    d.steps["pay"]                           # a TaskStep, PollStep, ...
    d.transition("pay", Outcome.OK)          # Goto("ship") | EndSequence(...) | FailInstance(...)
    d.choose("route", scope)                 # evaluates a choice's cases
    d.branch_starts("fan")                   # first step of each branch of a parallel
    d.transition("fan", Outcome.OK)          # all branches ended -> Goto(<its join>)

Step ids are unique across the whole definition; with no cycles (loops only inside a poll),
each step runs at most once per instance, so a step id identifies a step run
(``weave_steps.step_path``).
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from enum import StrEnum
from typing import ClassVar

from weave.definition.expressions import EvalError, Expr, Scope, Template, evaluate
from weave.definition.valuetypes import JSON, VType

#: Version of the definition language this module implements.
LANGUAGE_VERSION = 1


class StepType(StrEnum):
    """Step types of the definition language."""

    TASK = "task"  # run one Pulse task, take its result
    WAIT_SIGNAL = "wait_signal"  # wait for a named signal, optionally with a timeout
    SLEEP = "sleep"  # durable timer
    POLL = "poll"  # repeat a task in rounds until a condition on its result holds
    PARALLEL = "parallel"  # start every branch at once
    JOIN = "join"  # continue once every branch of its parallel has ended
    CHOICE = "choice"  # branch on typed conditions
    SUCCEED = "succeed"  # end the instance successfully with an output
    FAIL = "fail"  # end the instance as FAILED with an error


class Outcome(StrEnum):
    """How a step ended; selects the outgoing edge in :meth:`Definition.transition`."""

    OK = "ok"  # task succeeded, signal matched, timer fired, poll satisfied, all branches ended
    FAILED = "failed"  # task ended FAILED/CANCELLED (or its output broke output_schema)
    TIMED_OUT = "timed_out"  # wait_signal timeout
    EXHAUSTED = "exhausted"  # poll: rounds, deadline or a failed round


class EdgeKind(StrEnum):
    """Labels of control-flow edges (validation, history display)."""

    NEXT = "next"  # normal continuation (explicit next or fall-through)
    ON_FAILURE = "on_failure"
    ON_TIMEOUT = "on_timeout"
    ON_EXHAUSTED = "on_exhausted"
    CASE = "case"
    DEFAULT = "default"
    BRANCH = "branch"  # parallel -> first step of a branch


@dataclass(frozen=True)
class SequenceRef:
    """Where a sequence lives: the top level (``parallel is None``) or a branch of a parallel."""

    parallel: str | None = None
    branch: int | None = None

    @property
    def key(self) -> str:
        return "" if self.parallel is None else f"{self.parallel}[{self.branch}]"

    def __str__(self) -> str:
        return (
            "top level" if self.parallel is None else f"branch {self.branch} of {self.parallel!r}"
        )


ROOT = SequenceRef()


@dataclass(frozen=True)
class Sequence:
    """An ordered list of steps: the top level or one branch."""

    ref: SequenceRef
    step_ids: tuple[str, ...]
    name: str | None = None


@dataclass(frozen=True)
class RetryPolicy:
    """Per-task retry options; None fields fall back to the queue's defaults (Pulse)."""

    max_attempts: int | None = None
    backoff_initial_ms: int | None = None
    backoff_max_ms: int | None = None
    backoff_multiplier: float | None = None


@dataclass(frozen=True)
class TaskSpec:
    """What a task step (or each poll round) submits to Pulse.

    ``payload`` is rendered with :func:`weave.definition.expressions.render`;
    ``concurrency_key`` (a string expression) likewise. ``deadline_ms`` is relative to the
    activation (Pulse ``deadline_at``). The task's owner is the instance's owner.
    """

    queue: str
    kind: str
    payload: Template
    pipeline_version: str = ""
    priority: int | None = None
    retry: RetryPolicy | None = None
    retry_safe: bool = False
    deadline_ms: int | None = None
    concurrency_key: Expr | None = None
    output_type: VType = JSON


@dataclass(frozen=True, kw_only=True)
class Step:
    """Common fields. ``next`` is resolved: the explicit ``next``, else the following step of
    the sequence, else None (end of the sequence). It is None for steps that never continue
    normally (parallel, choice, succeed, fail)."""

    type: ClassVar[StepType]
    id: str
    seq: SequenceRef
    index: int
    next: str | None = None
    description: str | None = None

    #: Type of ``$.steps.<id>.output`` when the step succeeded; None = the step has no output.
    def output_type(self) -> VType | None:
        return None


@dataclass(frozen=True, kw_only=True)
class TaskStep(Step):
    type: ClassVar[StepType] = StepType.TASK
    task: TaskSpec
    on_failure: str | None = None

    def output_type(self) -> VType | None:
        return self.task.output_type


@dataclass(frozen=True, kw_only=True)
class WaitSignalStep(Step):
    """Waits for signal ``signal`` (matching ``correlation_key`` when set, a string expression
    evaluated when the wait opens). Output: the signal payload (``payload_type``)."""

    type: ClassVar[StepType] = StepType.WAIT_SIGNAL
    signal: str
    correlation_key: Expr | None = None
    timeout_ms: int | None = None
    on_timeout: str | None = None
    payload_type: VType = JSON

    def output_type(self) -> VType | None:
        return self.payload_type


@dataclass(frozen=True, kw_only=True)
class SleepStep(Step):
    """Durable timer: ``duration_ms`` after activation, or at ``until`` (an RFC 3339 string
    expression)."""

    type: ClassVar[StepType] = StepType.SLEEP
    duration_ms: int | None = None
    until: Expr | None = None


@dataclass(frozen=True, kw_only=True)
class PollStep(Step):
    """Runs ``task`` in rounds (each with ``max_attempts`` attempts) until ``until`` (a bool
    expression over ``$.result``, the round's result) holds; ``interval_ms`` between rounds;
    at most ``max_rounds``; no new round after ``deadline_ms`` from the step start.
    Output: the last round's result (the satisfying one on OK)."""

    type: ClassVar[StepType] = StepType.POLL
    task: TaskSpec
    until: Expr
    max_attempts: int = 1
    interval_ms: int = 0
    max_rounds: int = 1
    deadline_ms: int | None = None
    on_exhausted: str | None = None

    def output_type(self) -> VType | None:
        return self.task.output_type


@dataclass(frozen=True, kw_only=True)
class ParallelStep(Step):
    """Starts every branch; continues to ``join`` (the next step of its sequence) once every
    branch has ended. A ``fail`` in a branch fails the instance."""

    type: ClassVar[StepType] = StepType.PARALLEL
    branches: tuple[Sequence, ...]
    join: str


@dataclass(frozen=True, kw_only=True)
class JoinStep(Step):
    type: ClassVar[StepType] = StepType.JOIN
    parallel: str
    policy: str = "all"


@dataclass(frozen=True)
class ChoiceCase:
    when: Expr
    next: str


@dataclass(frozen=True, kw_only=True)
class ChoiceStep(Step):
    """Goes to the ``next`` of the first case whose ``when`` is true, else ``default``;
    with no default and no match the instance fails (``no_choice_matched``)."""

    type: ClassVar[StepType] = StepType.CHOICE
    cases: tuple[ChoiceCase, ...]
    default: str | None = None


@dataclass(frozen=True, kw_only=True)
class SucceedStep(Step):
    """Ends the instance SUCCEEDED with ``output`` rendered (``null`` when absent). Top level only."""

    type: ClassVar[StepType] = StepType.SUCCEED
    output: Template | None = None


@dataclass(frozen=True, kw_only=True)
class FailStep(Step):
    """Ends the instance FAILED with error ``{"code": error, "message": <rendered>, "step": id}``."""

    type: ClassVar[StepType] = StepType.FAIL
    error: str
    message: Template | None = None


# --------------------------------------------------------------------------- transitions


@dataclass(frozen=True)
class Goto:
    """Enter ``step`` next (in the same sequence)."""

    step: str


@dataclass(frozen=True)
class EndSequence:
    """The sequence ``seq`` has ended. At top level the instance SUCCEEDS with output null;
    in a branch, the branch has ended: when every branch of ``seq.parallel`` has ended,
    ``transition(seq.parallel, Outcome.OK)`` gives the join."""

    seq: SequenceRef


@dataclass(frozen=True)
class SucceedInstance:
    """A succeed step: render ``output`` (None = JSON null) and end the instance SUCCEEDED."""

    step: str
    output: Template | None


@dataclass(frozen=True)
class FailInstance:
    """End the instance FAILED with ``{"code": code, "message": message, "step": step}``
    (a fail step renders ``message_template`` when present)."""

    step: str
    code: str
    message: str
    message_template: Template | None = None


Transition = Goto | EndSequence | SucceedInstance | FailInstance


@dataclass(frozen=True)
class Definition:
    """A validated definition. Build it with :func:`weave.definition.compile_definition`."""

    root: Sequence
    steps: Mapping[str, Step]
    sequences: Mapping[str, Sequence]
    input_type: VType = JSON
    description: str | None = None
    language_version: int = LANGUAGE_VERSION
    #: For each step, the steps whose output/error it may read (completed on every path to it).
    available: Mapping[str, frozenset[str]] = field(default_factory=dict)

    @property
    def start(self) -> str:
        """The first step of the top-level sequence (where an instance begins)."""
        return self.root.step_ids[0]

    def step(self, step_id: str) -> Step:
        return self.steps[step_id]

    def __iter__(self) -> Iterator[Step]:
        """Steps in document order (depth first through branches)."""
        return iter(self.steps.values())

    def sequence(self, ref: SequenceRef) -> Sequence:
        return self.sequences[ref.key]

    def branch_starts(self, parallel_id: str) -> tuple[str, ...]:
        """The first step of each branch, in branch order (all start together)."""
        p = self.steps[parallel_id]
        assert isinstance(p, ParallelStep)
        return tuple(b.step_ids[0] for b in p.branches)

    def enclosing_parallels(self, step_id: str) -> tuple[str, ...]:
        """Parallel steps enclosing ``step_id``, innermost first (empty at top level)."""
        out = []
        ref = self.steps[step_id].seq
        while ref.parallel is not None:
            out.append(ref.parallel)
            ref = self.steps[ref.parallel].seq
        return tuple(out)

    def branch_step_ids(self, parallel_id: str) -> frozenset[str]:
        """Every step inside the parallel's branches, nested ones included (for cancelling
        the siblings of a failed branch)."""
        p = self.steps[parallel_id]
        assert isinstance(p, ParallelStep)
        out: set[str] = set()
        for b in p.branches:
            for sid in b.step_ids:
                out.add(sid)
                if isinstance(self.steps[sid], ParallelStep):
                    out |= self.branch_step_ids(sid)
        return frozenset(out)

    def _continue(self, step: Step) -> Transition:
        return Goto(step.next) if step.next is not None else EndSequence(step.seq)

    def transition(self, step_id: str, outcome: Outcome = Outcome.OK) -> Transition:
        """Where to go when ``step_id`` ended with ``outcome``.

        Choice steps are decided by :meth:`choose`. Outcomes a step type cannot have raise
        ValueError (an engine bug).
        """
        s = self.steps[step_id]
        if isinstance(s, SucceedStep):
            return SucceedInstance(s.id, s.output)
        if isinstance(s, FailStep):
            return FailInstance(s.id, s.error, s.error, s.message)
        if isinstance(s, ParallelStep):
            _expect(s, outcome, Outcome.OK)
            return Goto(s.join)
        if isinstance(s, ChoiceStep):
            raise ValueError("choice steps are decided by Definition.choose")
        if outcome is Outcome.OK:
            return self._continue(s)
        if isinstance(s, TaskStep) and outcome is Outcome.FAILED:
            if s.on_failure is not None:
                return Goto(s.on_failure)
            return FailInstance(s.id, "task_failed", f"task step {s.id!r} failed")
        if isinstance(s, WaitSignalStep) and outcome is Outcome.TIMED_OUT:
            if s.on_timeout is not None:
                return Goto(s.on_timeout)
            return FailInstance(s.id, "signal_timeout", f"no {s.signal!r} signal in time")
        if isinstance(s, PollStep) and outcome is Outcome.EXHAUSTED:
            if s.on_exhausted is not None:
                return Goto(s.on_exhausted)
            return FailInstance(s.id, "poll_exhausted", f"poll step {s.id!r} was exhausted")
        if outcome is Outcome.FAILED:
            # e.g. an expression failed at run time while entering the step
            return FailInstance(s.id, "step_failed", f"step {s.id!r} failed")
        raise ValueError(f"step {s.id!r} ({s.type}) cannot end with {outcome}")

    def choose(self, step_id: str, scope: Scope) -> Transition:
        """Evaluate a choice: the first true case, else default, else FailInstance.

        A run-time expression error (e.g. ordering a json string against a number) gives
        ``FailInstance(code="expression_error")``.
        """
        s = self.steps[step_id]
        assert isinstance(s, ChoiceStep)
        for i, case in enumerate(s.cases):
            try:
                hit = evaluate(case.when, scope)
            except EvalError as exc:
                return FailInstance(s.id, "expression_error", f"cases[{i}].when: {exc.message}")
            if hit is True:
                return Goto(case.next)
        if s.default is not None:
            return Goto(s.default)
        return FailInstance(s.id, "no_choice_matched", f"no case of choice {s.id!r} matched")

    def edges(self, step_id: str) -> list[tuple[EdgeKind, str | None]]:
        """Outgoing control edges: (kind, target step id, or None = end of the sequence)."""
        s = self.steps[step_id]
        return step_edges(s)


def step_edges(s: Step) -> list[tuple[EdgeKind, str | None]]:
    """Outgoing edges of one step; a None target means the end of its sequence."""
    if isinstance(s, SucceedStep | FailStep):
        return []
    if isinstance(s, ParallelStep):
        return [(EdgeKind.BRANCH, b.step_ids[0]) for b in s.branches if b.step_ids]
    if isinstance(s, ChoiceStep):
        out: list[tuple[EdgeKind, str | None]] = [(EdgeKind.CASE, c.next) for c in s.cases]
        if s.default is not None:
            out.append((EdgeKind.DEFAULT, s.default))
        return out
    out = [(EdgeKind.NEXT, s.next)]
    if isinstance(s, TaskStep) and s.on_failure is not None:
        out.append((EdgeKind.ON_FAILURE, s.on_failure))
    if isinstance(s, WaitSignalStep) and s.on_timeout is not None:
        out.append((EdgeKind.ON_TIMEOUT, s.on_timeout))
    if isinstance(s, PollStep) and s.on_exhausted is not None:
        out.append((EdgeKind.ON_EXHAUSTED, s.on_exhausted))
    return out


def _expect(s: Step, got: Outcome, want: Outcome) -> None:
    if got is not want:
        raise ValueError(f"step {s.id!r} ({s.type}) cannot end with {got}")
