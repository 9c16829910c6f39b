"""The engine: what happens to one instance, under its row lock, inside one transaction.

A :class:`Run` is built for one locked instance (``Run.load``). Services then ask it to
start the instance (:meth:`Run.begin`), to apply an inbox event (:meth:`Run.apply`), or to
cancel (:meth:`Run.cancel`), and finally :meth:`Run.save` writes the instance row (CAS on
its revision) and, last of all, cancels the Pulse tasks that must stop. Every write the
advance makes — steps, activations, waits, poll progress, new Pulse tasks
(:func:`pulse.submit.submit_in_tx`), raw events — lands in the caller's transaction, so an
advance happens completely or not at all.

Walking the definition (docs/workflows.md, "Execution semantics"):

* Entering a step writes its ``weave_steps`` row (``seq`` from the instance's
  ``history_seq``). ``task`` and each ``poll`` round create a Pulse task (owner = the
  instance owner, ``source_kind='workflow'``, ``source_id`` = the activation id) and an
  activation; ``wait_signal`` and ``sleep`` create an activation and a wait (a durable timer
  when it has ``due_at``); ``parallel`` enters the first step of every branch; ``join``,
  ``choice``, ``succeed`` and ``fail`` complete at once.
* A step that ends takes ``Definition.transition`` (or ``choose``): ``Goto`` enters the next
  step, ``EndSequence`` ends the instance (top level) or the branch (when every branch of a
  parallel ended, the parallel succeeds and the join is entered), ``FailInstance`` fails
  the instance. Steps complete synchronously in a loop until only asynchronous work (tasks,
  waits) is left, so one advance may walk many steps.
* When the instance ends, every RUNNING step, activation, open wait and active poll is
  CANCELLED, pending advances are DISCARDED, and the Pulse tasks of running activations are
  cancelled in the same transaction (:func:`pulse.tasks.cancel_in_tx`).

Each step runs at most once per instance (no loops outside ``poll``): entering a step
twice raises :class:`EngineBug`.
"""

from __future__ import annotations

import logging
from collections import deque
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import Any

import msgspec

from orbit import events
from orbit.business_json import enc_hook
from orbit.errors import OrbitError
from orbit.ids import id_hex, new_id
from orbit.storage import CasConflict, Tx
from orbit.times import format_time, parse_time
from pulse import submit as pulse_submit
from pulse import tasks as pulse_tasks
from pulse import transitions as pulse_transitions
from pulse.errors import QueueQuotaExceeded
from pulse.store import queues as pulse_queue_store
from pulse.types import TaskSubmit
from weave.definition import jsonvalue
from weave.definition.expressions import EvalError, Expr, Scope, evaluate, render
from weave.definition.model import (
    ChoiceStep,
    Definition,
    EndSequence,
    FailInstance,
    FailStep,
    Goto,
    JoinStep,
    Outcome,
    ParallelStep,
    PollStep,
    RetryPolicy,
    SleepStep,
    Step,
    SucceedInstance,
    SucceedStep,
    TaskSpec,
    TaskStep,
    Transition,
    WaitSignalStep,
)
from weave.definition.valuetypes import conforms
from weave.definitions import load_definition
from weave.store import activations as act_store
from weave.store import instances as instance_store
from weave.store import pending as pending_store
from weave.store import polls as poll_store
from weave.store import signals as signal_store
from weave.store import steps as step_store
from weave.store import waits as wait_store
from weave.types import (
    ActivationKind,
    ActivationRow,
    InboxKind,
    InboxOutcome,
    InboxRow,
    InstanceRow,
    InstanceState,
    PollState,
    PollStateRow,
    SignalRow,
    StepRow,
    StepState,
    WaitKind,
    WaitRow,
    WaitState,
)

log = logging.getLogger("weave.engine")

#: ``orbit_events.subject_kind`` of instance events.
SUBJECT = "workflow_instance"
#: Raw event types of instance changes.
EVENT_STARTED = "workflow.instance_started"
EVENT_ADVANCED = "workflow.instance_advanced"
EVENT_PAUSED = "workflow.instance_paused"
EVENT_RESUMED = "workflow.instance_resumed"
EVENT_ENDED = {
    InstanceState.SUCCEEDED: "workflow.instance_succeeded",
    InstanceState.FAILED: "workflow.instance_failed",
    InstanceState.CANCELLED: "workflow.instance_cancelled",
}
#: ``weave_steps.correlation_key`` / ``weave_signals.correlation_key`` width.
MAX_KEY = 255

_JSON = msgspec.json.Encoder(decimal_format="number", enc_hook=enc_hook)
_FINISHED = frozenset({StepState.SUCCEEDED, StepState.FAILED, StepState.TIMED_OUT})


class EngineBug(RuntimeError):
    """An invariant of the engine broke (a step entered twice, a guarded write missed under
    the instance lock). The advance is rolled back and the inbox event retried later."""


def _json(value: Any) -> str:
    return _JSON.encode(value).decode()


def _error(code: str, message: str, **extra: Any) -> str:
    return _json(
        {"code": code, "message": message, **{k: v for k, v in extra.items() if v is not None}}
    )


def _backoff(retry: RetryPolicy | None) -> dict[str, Any]:
    """The backoff fields a step's ``retry`` gives, as a submit's own ``retry`` (precedence
    step → task → queue, docs/workflows.md "Retries")."""
    if retry is None:
        return {}
    fields = {
        "backoff_initial_ms": retry.backoff_initial_ms,
        "backoff_max_ms": retry.backoff_max_ms,
        "backoff_multiplier": retry.backoff_multiplier,
    }
    return {k: v for k, v in fields.items() if v is not None}


def _decode_text(text: str | None) -> Any:
    return None if text is None else jsonvalue.decode(text)


@dataclass
class AfterCommit:
    """Work for after COMMIT: running attempts whose cancel must be pushed to their worker,
    and queues that got new tasks (to wake this node's dispatcher)."""

    cancels: list[tuple[bytes, bytes]] = field(default_factory=list)
    queues: set[bytes] = field(default_factory=set)


class Run:
    """One instance, locked, with its definition and step rows, inside one transaction."""

    def __init__(
        self,
        tx: Tx,
        inst: InstanceRow,
        definition: Definition,
        steps: list[StepRow],
        now: datetime,
        request_id: str | None = None,
    ) -> None:
        self.tx = tx
        self.inst = inst
        self.d = definition
        self.now = now
        self.request_id = request_id
        self.ns = inst.namespace_id
        self.steps: dict[str, StepRow] = {s.step_path: s for s in steps}
        self.after = AfterCommit()
        self._queue: deque[str] = deque()
        self._to_cancel: list[bytes] = []
        self._input: Any = jsonvalue.decode(inst.input)
        self._outputs: dict[str, dict[str, Any]] = {}
        self.entered: list[str] = []
        self.finished: dict[str, str] = {}
        self.changed = False
        self._ended_event: str | None = None
        self._usage_locked = False

    @classmethod
    async def load(
        cls, tx: Tx, inst: InstanceRow, now: datetime, request_id: str | None = None
    ) -> Run:
        """Build a run for ``inst`` (already locked by the caller)."""
        d = await load_definition(tx, inst.namespace_id, inst.definition_id, inst.version)
        steps = await step_store.step_list_for_instance(tx, inst.namespace_id, inst.id)
        return cls(tx, inst, d, steps, now, request_id)

    # ------------------------------------------------------------------ public operations

    @property
    def running(self) -> bool:
        return self.inst.state == InstanceState.RUNNING

    async def begin(self) -> None:
        """Enter the first step of a new instance and walk as far as it goes."""
        self.changed = True
        self._queue.append(self.d.start)
        await self._drain()

    async def apply(self, ev: InboxRow) -> InboxOutcome:
        """Apply one inbox event to the (running, unpaused) instance."""
        if ev.kind == InboxKind.TASK_FINISHED:
            outcome = await self._on_task_finished(ev)
        elif ev.kind == InboxKind.TIMER_FIRED:
            outcome = await self._on_timer(ev)
        elif ev.kind == InboxKind.SIGNAL_ARRIVED:
            outcome = await self._on_signal(ev)
        else:  # pragma: no cover - CHECK constraint
            raise EngineBug(f"unknown inbox kind {ev.kind!r}")
        if outcome is InboxOutcome.APPLIED:
            self.changed = True
            await self._drain()
        return outcome

    async def cancel(self, reason: str) -> None:
        """End the instance CANCELLED (a client's request)."""
        self.changed = True
        await self._end(InstanceState.CANCELLED, error=_error("cancelled", reason))

    async def save(self) -> AfterCommit:
        """Write the instance (CAS on the revision read under the lock), its raw events, and
        cancel the Pulse tasks that must stop — last, as Pulse's event writes take the
        namespace's result stream lock (docs/architecture.md, lock order)."""
        if self.changed:
            ok = await _instance_update(self.tx, self.inst, self.now)
            if not ok:
                raise CasConflict("workflow instance", "revision moved under the row lock")
            if self.entered or self.finished:
                await self._event(
                    EVENT_ADVANCED, {"entered": self.entered, "finished": self.finished}
                )
            if self._ended_event is not None:
                await self._event(
                    self._ended_event,
                    {"state": self.inst.state, "error": _decode_text(self.inst.error)},
                )
        if self._to_cancel:
            self.after.cancels = await pulse_tasks.cancel_in_tx(
                self.tx, self.ns, self._to_cancel, request_id=self.request_id, now=self.now
            )
        return self.after

    async def event(self, type_: str, data: dict[str, Any]) -> None:
        """Append a raw event about the instance (pause, resume, start)."""
        await self._event(type_, data)

    # ------------------------------------------------------------------ scope

    def scope(self, result: Any = ...) -> Scope:
        """Values paths resolve against: the input and every finished step's output/error."""
        for sid, row in self.steps.items():
            if row.state != StepState.RUNNING and sid not in self._outputs:
                self._outputs[sid] = {
                    "output": _decode_text(row.output),
                    "error": _decode_text(row.error),
                }
        if result is ...:
            return Scope(input=self._input, steps=self._outputs)
        return Scope(input=self._input, steps=self._outputs, result=result)

    # ------------------------------------------------------------------ walking

    async def _drain(self) -> None:
        while self._queue and self.running:
            await self._enter(self._queue.popleft())
        self._queue.clear()

    def _seq(self) -> int:
        self.inst.history_seq += 1
        return self.inst.history_seq

    async def _enter(self, sid: str) -> None:
        if sid in self.steps:
            raise EngineBug(f"step {sid!r} entered twice")
        s = self.d.steps[sid]
        self.entered.append(sid)
        if isinstance(s, TaskStep):
            await self._enter_task(s)
        elif isinstance(s, WaitSignalStep):
            await self._enter_wait(s)
        elif isinstance(s, SleepStep):
            await self._enter_sleep(s)
        elif isinstance(s, PollStep):
            await self._enter_poll(s)
        elif isinstance(s, ParallelStep):
            await self._new_step(s, StepState.RUNNING)
            self._queue.extend(self.d.branch_starts(s.id))
        elif isinstance(s, JoinStep):
            row = await self._new_step(s, StepState.RUNNING)
            await self._finish(row, StepState.SUCCEEDED, Outcome.OK)
        elif isinstance(s, ChoiceStep):
            await self._enter_choice(s)
        elif isinstance(s, SucceedStep):
            await self._enter_succeed(s)
        elif isinstance(s, FailStep):
            await self._enter_fail(s)
        else:  # pragma: no cover - the model has nine step types
            raise EngineBug(f"unknown step type {s.type}")

    async def _new_step(
        self,
        s: Step,
        state: StepState,
        *,
        activations: int = 0,
        output: str | None = None,
        error: str | None = None,
        next_step: str | None = None,
    ) -> StepRow:
        row = StepRow(
            namespace_id=self.ns,
            id=new_id(),
            instance_id=self.inst.id,
            step_path=s.id,
            step_type=s.type.value,
            state=state.value,
            next_step=next_step,
            activations=activations,
            output=output,
            error=error,
            seq=self._seq(),
            started_at=self.now,
            finished_at=None if state == StepState.RUNNING else self.now,
            revision=1,
        )
        await step_store.step_insert(self.tx, row)
        self.steps[s.id] = row
        if state != StepState.RUNNING:
            self.finished[s.id] = state.value
        return row

    async def _save_step(self, row: StepRow) -> None:
        if not await step_store.step_update_if_revision(self.tx, row):
            raise EngineBug(f"step {row.step_path!r} changed under the instance lock")
        row.revision += 1

    async def _finish(
        self,
        row: StepRow,
        state: StepState,
        outcome: Outcome,
        *,
        output: str | None = None,
        error: str | None = None,
    ) -> None:
        """End a RUNNING step and follow the definition's transition for ``outcome``."""
        tr = self.d.transition(row.step_path, outcome)
        row.state = state.value
        row.output = output
        row.error = error
        row.finished_at = self.now
        row.next_step = tr.step if isinstance(tr, Goto) else None
        await self._save_step(row)
        self.finished[row.step_path] = state.value
        await self._follow(row.step_path, tr)

    async def _follow(self, sid: str, tr: Transition) -> None:
        if isinstance(tr, Goto):
            self._queue.append(tr.step)
        elif isinstance(tr, EndSequence):
            if tr.seq.parallel is None:
                await self._end(InstanceState.SUCCEEDED, output="null")
            else:
                await self._branch_ended(tr.seq.parallel)
        elif isinstance(tr, FailInstance):
            await self._end(InstanceState.FAILED, error=_error(tr.code, tr.message, step=tr.step))
        elif isinstance(tr, SucceedInstance):  # pragma: no cover - handled by _enter_succeed
            raise EngineBug(f"succeed transition from {sid!r}")

    def _branch_ended_at(self, step_ids: tuple[str, ...]) -> bool:
        """A branch has ended when one of its own steps finished with no next step (its
        transition was EndSequence; a FailInstance would have ended the instance)."""
        for sid in step_ids:
            row = self.steps.get(sid)
            if row is not None and row.state in _FINISHED and row.next_step is None:
                return True
        return False

    async def _branch_ended(self, parallel_id: str) -> None:
        p = self.d.steps[parallel_id]
        assert isinstance(p, ParallelStep)
        if all(self._branch_ended_at(b.step_ids) for b in p.branches):
            await self._finish(self.steps[parallel_id], StepState.SUCCEEDED, Outcome.OK)

    # ------------------------------------------------------------------ step types

    async def _fail_on_entry(self, s: Step, exc: EvalError | OrbitError | ValueError) -> None:
        """A step that cannot start (run-time expression error, invalid task): it FAILS and
        takes its FAILED transition (a task's on_failure applies)."""
        code = exc.code if isinstance(exc, EvalError | OrbitError) else "invalid_value"
        message = exc.message if isinstance(exc, EvalError | OrbitError) else str(exc)
        row = await self._new_step(s, StepState.RUNNING)
        await self._finish(row, StepState.FAILED, Outcome.FAILED, error=_error(code, message))

    def _string(self, expr: Expr, what: str) -> str:
        value = evaluate(expr, self.scope())
        if not isinstance(value, str):
            raise EvalError("type_error", f"{what} must be a string, got {type(value).__name__}")
        if len(value) > MAX_KEY:
            raise EvalError("too_long", f"{what} is longer than {MAX_KEY} characters")
        return value

    def _task_body(
        self, spec: TaskSpec, max_attempts: int | None, deadline_at: datetime | None
    ) -> TaskSubmit:
        """Render a task spec into a Pulse submit body (raises EvalError / InvalidRequest)."""
        scope = self.scope()
        payload = render(spec.payload, scope)
        key = (
            self._string(spec.concurrency_key, "concurrency_key") if spec.concurrency_key else None
        )
        if spec.deadline_ms is not None:
            own = self.now + timedelta(milliseconds=spec.deadline_ms)
            deadline_at = own if deadline_at is None else min(own, deadline_at)
        body: dict[str, Any] = {
            "queue": spec.queue,
            "kind": spec.kind,
            "pipeline_version": spec.pipeline_version,
            "payload": msgspec.Raw(jsonvalue.encode(payload)),
            "priority": spec.priority if spec.priority is not None else 0,
            "retry_safe": spec.retry_safe,
        }
        if max_attempts is not None:
            body["max_attempts"] = max_attempts
        backoff = _backoff(spec.retry)
        if backoff:  # the step's backoff wins; what it leaves out is the queue's (Pulse)
            body["retry"] = backoff
        if key is not None:
            body["concurrency_key"] = key
        if deadline_at is not None:
            body["deadline_at"] = format_time(deadline_at)
        return pulse_submit.decode_item(_JSON.encode(body))

    async def _submit(self, body: TaskSubmit, activation_id: bytes) -> bytes:
        """Create the Pulse task of an activation in this transaction; its id.

        A quota refusal (429) aborts the whole advance (the caller retries it later); any
        other refusal (unknown queue, invalid task) is raised for the step to fail.
        """
        await self._lock_pulse_usage()
        [res] = await pulse_submit.submit_in_tx(
            self.tx,
            self.ns,
            self.inst.owner_id,
            [body],
            source_kind="workflow",
            source_id=activation_id,
            request_id=self.request_id,
            now=self.now,
        )
        if res.error is not None:
            raise res.error
        assert res.row is not None
        self.after.queues.add(res.row["queue_id"])
        return bytes(res.row["id"])

    async def _lock_pulse_usage(self) -> None:
        """Before this transaction's first Pulse task: lock the owner's resources row and the
        usage rows of every queue the definition's task and poll steps name (one statement;
        Pulse's lock order: application resources → queues → tasks). One advance may create
        several tasks, in several queues, and cancel others: each of those Pulse calls
        locks its own usage rows first, but after the first task row they would come too
        late — with all of them held from here, the later calls find them held already."""
        if self._usage_locked:
            return
        self._usage_locked = True
        names = sorted({s.task.queue for s in self.d if isinstance(s, TaskStep | PollStep)})
        queue_ids = []
        for name in names:
            q = await pulse_queue_store.queue_get_by_name(self.tx, self.ns, name)
            if q is not None:
                queue_ids.append(q["id"])
        await pulse_transitions.lock_usage(self.tx, self.ns, queue_ids, [self.inst.owner_id])

    async def _new_activation(
        self,
        step: StepRow,
        kind: ActivationKind,
        number: int,
        *,
        activation_id: bytes | None = None,
        task_id: bytes | None = None,
        state: str = "RUNNING",
        result: str | None = None,
    ) -> ActivationRow:
        row = ActivationRow(
            namespace_id=self.ns,
            id=activation_id or new_id(),
            instance_id=self.inst.id,
            step_path=step.step_path,
            activation_no=number,
            kind=kind.value,
            task_id=task_id,
            state=state,
            result=result,
            error=None,
            condition_met=None,
            seq=self._seq(),
            started_at=self.now,
            finished_at=None if state == "RUNNING" else self.now,
            revision=1,
        )
        await act_store.activation_insert(self.tx, row)
        return row

    async def _end_activation(
        self,
        activation_id: bytes,
        state: str,
        *,
        result: str | None = None,
        error: str | None = None,
        condition_met: int | None = None,
    ) -> bool:
        return await act_store.activation_finish_if_running(
            self.tx,
            self.ns,
            activation_id,
            state=state,
            result=result,
            error=error,
            condition_met=condition_met,
            now=self.now,
        )

    async def _new_wait(
        self,
        step: StepRow,
        kind: WaitKind,
        *,
        activation_id: bytes | None,
        due_at: datetime | None,
        signal_name: str | None = None,
        correlation_key: str | None = None,
        state: WaitState = WaitState.OPEN,
    ) -> WaitRow:
        row = WaitRow(
            namespace_id=self.ns,
            id=new_id(),
            instance_id=self.inst.id,
            step_path=step.step_path,
            activation_id=activation_id,
            kind=kind.value,
            signal_name=signal_name,
            correlation_key=correlation_key,
            due_at=due_at,
            state=state.value,
            signal_row_id=None,
            notified_at=None,
            seq=self._seq(),
            created_at=self.now,
            resolved_at=None if state == WaitState.OPEN else self.now,
            revision=1,
        )
        await wait_store.wait_insert(self.tx, row)
        return row

    async def _enter_task(self, s: TaskStep) -> None:
        retry = s.task.retry
        try:
            body = self._task_body(s.task, retry.max_attempts if retry else None, None)
        except (EvalError, OrbitError) as exc:
            await self._fail_on_entry(s, exc)
            return
        activation_id = new_id()
        try:
            task_id = await self._submit(body, activation_id)
        except QueueQuotaExceeded:
            raise
        except OrbitError as exc:
            await self._fail_on_entry(s, exc)
            return
        row = await self._new_step(s, StepState.RUNNING, activations=1)
        await self._new_activation(
            row, ActivationKind.TASK, 1, activation_id=activation_id, task_id=task_id
        )

    async def _enter_wait(self, s: WaitSignalStep) -> None:
        key: str | None = None
        if s.correlation_key is not None:
            try:
                key = self._string(s.correlation_key, "correlation_key")
            except EvalError as exc:
                await self._fail_on_entry(s, exc)
                return
        row = await self._new_step(s, StepState.RUNNING, activations=1)
        act = await self._new_activation(row, ActivationKind.SIGNAL, 1)
        due = self.now + timedelta(milliseconds=s.timeout_ms) if s.timeout_ms is not None else None
        wait = await self._new_wait(
            row,
            WaitKind.SIGNAL,
            activation_id=act.id,
            due_at=due,
            signal_name=s.signal,
            correlation_key=key,
        )
        early = await signal_store.signal_find_unmatched(
            self.tx, self.ns, self.inst.id, s.signal, key
        )
        if early is not None:
            await self._match(wait, early)

    async def _match(self, wait: WaitRow, sig: SignalRow) -> None:
        """A signal satisfies an open wait: both are bound, the step ends with the payload."""
        if not await signal_store.signal_match_if_unmatched(
            self.tx, self.ns, sig.id, wait.id, self.now
        ):
            raise EngineBug("signal matched twice under the instance lock")
        if not await wait_store.wait_resolve_if_open(
            self.tx, self.ns, wait.id, WaitState.MATCHED, self.now, signal_row_id=sig.id
        ):
            raise EngineBug("wait resolved twice under the instance lock")
        row = self.steps[wait.step_path]
        s = self.d.steps[wait.step_path]
        assert isinstance(s, WaitSignalStep) and wait.activation_id is not None
        if conforms(jsonvalue.decode(sig.payload), s.payload_type):
            await self._end_activation(wait.activation_id, "SUCCEEDED", result=sig.payload)
            await self._finish(row, StepState.SUCCEEDED, Outcome.OK, output=sig.payload)
        else:
            err = _error(
                "output_schema",
                f"the {s.signal!r} signal payload does not match the step's output_schema",
                signal_id=sig.signal_id,
            )
            await self._end_activation(wait.activation_id, "FAILED", result=sig.payload, error=err)
            await self._finish(row, StepState.FAILED, Outcome.FAILED, error=err)

    async def _enter_sleep(self, s: SleepStep) -> None:
        if s.duration_ms is not None:
            due = self.now + timedelta(milliseconds=s.duration_ms)
        else:
            assert s.until is not None
            try:
                text = self._string(s.until, "until")
                try:
                    due = parse_time(text)
                except ValueError as exc:
                    raise EvalError("invalid_time", f"until: {exc}") from None
            except EvalError as exc:
                await self._fail_on_entry(s, exc)
                return
        row = await self._new_step(s, StepState.RUNNING, activations=1)
        if due <= self.now:
            act = await self._new_activation(row, ActivationKind.TIMER, 1, state="SUCCEEDED")
            await self._new_wait(
                row, WaitKind.SLEEP, activation_id=act.id, due_at=due, state=WaitState.FIRED
            )
            await self._finish(row, StepState.SUCCEEDED, Outcome.OK)
            return
        act = await self._new_activation(row, ActivationKind.TIMER, 1)
        await self._new_wait(row, WaitKind.SLEEP, activation_id=act.id, due_at=due)

    # ------------------------------------------------------------------ poll

    async def _enter_poll(self, s: PollStep) -> None:
        row = await self._new_step(s, StepState.RUNNING)
        deadline = (
            self.now + timedelta(milliseconds=s.deadline_ms) if s.deadline_ms is not None else None
        )
        await poll_store.poll_state_insert(
            self.tx,
            namespace_id=self.ns,
            poll_state_id=new_id(),
            instance_id=self.inst.id,
            step_path=s.id,
            max_rounds=s.max_rounds,
            max_attempts=s.max_attempts,
            interval_ms=s.interval_ms,
            deadline_at=deadline,
            now=self.now,
        )
        ps = await self._poll_state(s.id)
        await self._poll_round(s, row, ps)

    async def _poll_state(self, sid: str) -> PollStateRow:
        ps = await poll_store.poll_state_get(self.tx, self.ns, self.inst.id, sid)
        if ps is None:
            raise EngineBug(f"poll step {sid!r} has no poll state")
        return ps

    async def _save_poll(self, ps: PollStateRow) -> None:
        if not await poll_store.poll_state_update_if_revision(self.tx, ps):
            raise EngineBug(f"poll state of {ps.step_path!r} changed under the instance lock")

    async def _poll_round(self, s: PollStep, row: StepRow, ps: PollStateRow) -> None:
        """Start the next round, or give up when no round may start any more."""
        if ps.rounds_started >= ps.max_rounds:
            await self._poll_exhausted(s, row, ps, "max_rounds")
            return
        if ps.deadline_at is not None and self.now >= ps.deadline_at:
            await self._poll_exhausted(s, row, ps, "deadline")
            return
        activation_id = new_id()
        try:
            body = self._task_body(s.task, s.max_attempts, ps.deadline_at)
            task_id = await self._submit(body, activation_id)
        except QueueQuotaExceeded:
            raise
        except (EvalError, OrbitError) as exc:
            code = exc.code
            await self._poll_exhausted(s, row, ps, "round_failed", cause=_error(code, exc.message))
            return
        number = ps.rounds_started + 1
        await self._new_activation(
            row, ActivationKind.POLL_ROUND, number, activation_id=activation_id, task_id=task_id
        )
        ps.rounds_started = number
        ps.current_activation_id = activation_id
        ps.next_round_at = None
        await self._save_poll(ps)
        row.activations = number
        await self._save_step(row)

    async def _poll_exhausted(
        self, s: PollStep, row: StepRow, ps: PollStateRow, reason: str, cause: str | None = None
    ) -> None:
        ps.state = PollState.EXHAUSTED.value
        ps.exhausted_reason = reason
        ps.finished_at = self.now
        ps.current_activation_id = None
        ps.next_round_at = None
        await self._save_poll(ps)
        err = _error(
            "poll_exhausted",
            f"poll step {s.id!r} gave up: {reason}",
            reason=reason,
            rounds=ps.rounds_completed,
            cause=_decode_text(cause),
        )
        await self._finish(
            row, StepState.TIMED_OUT, Outcome.EXHAUSTED, output=ps.last_result, error=err
        )

    async def _poll_round_done(
        self, s: PollStep, row: StepRow, act: ActivationRow, task_state: str, ev: InboxRow,
        task_error: Any,
    ) -> None:  # fmt: skip
        ps = await self._poll_state(s.id)
        if ps.state != PollState.ACTIVE or ps.current_activation_id != act.id:
            raise EngineBug(f"poll {s.id!r}: round {act.activation_no} is not the current one")
        result_text = ev.payload if ev.payload is not None else "null"
        met = False
        failure: str | None = None
        if task_state == "SUCCEEDED":
            value = jsonvalue.decode(result_text)
            if not conforms(value, s.task.output_type):
                failure = _error("output_schema", "the round result does not match output_schema")
            else:
                try:
                    met = evaluate(s.until, self.scope(result=value)) is True
                except EvalError as exc:
                    failure = _error(exc.code, f"until: {exc.message}")
        else:
            failure = _error(
                "task_" + task_state.lower(),
                f"the round task ended {task_state}",
                task_error=task_error,
            )
        outcome = "met" if met else ("failed" if failure is not None else "not_met")
        await poll_store.poll_round_insert(
            self.tx,
            namespace_id=self.ns,
            round_id=new_id(),
            poll_state_id=ps.id,
            instance_id=self.inst.id,
            step_path=s.id,
            round_no=act.activation_no,
            activation_id=act.id,
            task_id=act.task_id or bytes(16),
            outcome=outcome,
            result=result_text if task_state == "SUCCEEDED" else None,
            error=failure,
            now=self.now,
        )
        if task_state == "SUCCEEDED":
            await self._end_activation(
                act.id,
                "SUCCEEDED",
                result=result_text,
                error=failure,
                condition_met=None if failure is not None else int(met),
            )
            ps.last_result = result_text
        else:
            await self._end_activation(act.id, task_state, error=failure)
        ps.rounds_completed += 1
        ps.current_activation_id = None
        if met:
            ps.state = PollState.SATISFIED.value
            ps.finished_at = self.now
            await self._save_poll(ps)
            await self._finish(row, StepState.SUCCEEDED, Outcome.OK, output=result_text)
            return
        if failure is not None:
            past = ps.deadline_at is not None and self.now >= ps.deadline_at
            await self._poll_exhausted(s, row, ps, "deadline" if past else "round_failed", failure)
            return
        if ps.rounds_completed >= ps.max_rounds:
            await self._poll_exhausted(s, row, ps, "max_rounds")
            return
        next_at = self.now + timedelta(milliseconds=ps.interval_ms)
        if ps.deadline_at is not None and next_at >= ps.deadline_at:
            await self._poll_exhausted(s, row, ps, "deadline")
            return
        if ps.interval_ms == 0:
            await self._poll_round(s, row, ps)
            return
        ps.next_round_at = next_at
        await self._save_poll(ps)
        await self._new_wait(row, WaitKind.POLL_INTERVAL, activation_id=None, due_at=next_at)

    # ------------------------------------------------------------------ control steps

    async def _enter_choice(self, s: ChoiceStep) -> None:
        tr = self.d.choose(s.id, self.scope())
        if isinstance(tr, Goto):
            await self._new_step(s, StepState.SUCCEEDED, next_step=tr.step)
            self._queue.append(tr.step)
        else:
            assert isinstance(tr, FailInstance)
            await self._new_step(s, StepState.FAILED, error=_error(tr.code, tr.message))
            await self._follow(s.id, tr)

    async def _enter_succeed(self, s: SucceedStep) -> None:
        try:
            value = render(s.output, self.scope()) if s.output is not None else None
        except EvalError as exc:
            err = _error("expression_error", f"output: {exc.message}", step=s.id)
            await self._new_step(s, StepState.FAILED, error=err)
            await self._end(InstanceState.FAILED, error=err)
            return
        await self._new_step(s, StepState.SUCCEEDED)
        await self._end(InstanceState.SUCCEEDED, output=jsonvalue.encode(value).decode())

    async def _enter_fail(self, s: FailStep) -> None:
        message = s.error
        if s.message is not None:
            try:
                value = render(s.message, self.scope())
                message = value if isinstance(value, str) else jsonvalue.encode(value).decode()
            except EvalError:
                message = s.error
        err = _error(s.error, message, step=s.id)
        await self._new_step(s, StepState.FAILED, error=err)
        await self._end(InstanceState.FAILED, error=err)

    # ------------------------------------------------------------------ events

    async def _on_task_finished(self, ev: InboxRow) -> InboxOutcome:
        data = _decode_text(ev.data) or {}
        act = await act_store.activation_get(
            self.tx, self.ns, bytes.fromhex(data.get("activation_id", "00" * 16))
        )
        if (
            act is None
            or act.instance_id != self.inst.id
            or act.task_id != ev.source_event_id
            or act.state != "RUNNING"
        ):
            return InboxOutcome.IGNORED
        row = self.steps.get(act.step_path)
        if row is None or row.state != StepState.RUNNING:
            return InboxOutcome.IGNORED
        s = self.d.steps[act.step_path]
        task_state = str(data.get("task_state"))
        task_error = data.get("error")
        if isinstance(s, PollStep):
            await self._poll_round_done(s, row, act, task_state, ev, task_error)
            return InboxOutcome.APPLIED
        assert isinstance(s, TaskStep)
        if task_state == "SUCCEEDED":
            text = ev.payload if ev.payload is not None else "null"
            await self._end_activation(act.id, "SUCCEEDED", result=text)
            if conforms(jsonvalue.decode(text), s.task.output_type):
                await self._finish(row, StepState.SUCCEEDED, Outcome.OK, output=text)
            else:
                err = _error(
                    "output_schema",
                    f"the result of task step {s.id!r} does not match its output_schema",
                    task_id=id_hex(ev.source_event_id),
                )
                await self._finish(row, StepState.FAILED, Outcome.FAILED, error=err)
            return InboxOutcome.APPLIED
        err = _error(
            "task_" + task_state.lower(),
            f"the task of step {s.id!r} ended {task_state}",
            task_id=id_hex(ev.source_event_id),
            task_error=task_error,
        )
        await self._end_activation(act.id, task_state, error=err)
        await self._finish(row, StepState.FAILED, Outcome.FAILED, error=err)
        return InboxOutcome.APPLIED

    async def _on_timer(self, ev: InboxRow) -> InboxOutcome:
        wait = await wait_store.wait_get(self.tx, self.ns, ev.source_event_id)
        if wait is None or wait.instance_id != self.inst.id or wait.state != WaitState.OPEN:
            return InboxOutcome.IGNORED
        row = self.steps.get(wait.step_path)
        if row is None or row.state != StepState.RUNNING:
            return InboxOutcome.IGNORED
        if not await wait_store.wait_resolve_if_open(
            self.tx, self.ns, wait.id, WaitState.FIRED, self.now
        ):
            raise EngineBug("wait resolved twice under the instance lock")
        s = self.d.steps[wait.step_path]
        if wait.kind == WaitKind.SLEEP:
            assert wait.activation_id is not None
            await self._end_activation(wait.activation_id, "SUCCEEDED")
            await self._finish(row, StepState.SUCCEEDED, Outcome.OK)
        elif wait.kind == WaitKind.SIGNAL:
            assert isinstance(s, WaitSignalStep) and wait.activation_id is not None
            err = _error("signal_timeout", f"no {s.signal!r} signal within {s.timeout_ms} ms")
            await self._end_activation(wait.activation_id, "TIMED_OUT", error=err)
            await self._finish(row, StepState.TIMED_OUT, Outcome.TIMED_OUT, error=err)
        elif wait.kind == WaitKind.POLL_INTERVAL:
            assert isinstance(s, PollStep)
            ps = await self._poll_state(s.id)
            if ps.state != PollState.ACTIVE or ps.current_activation_id is not None:
                return InboxOutcome.IGNORED
            await self._poll_round(s, row, ps)
        else:  # poll_deadline timers are not created by this engine version
            return InboxOutcome.IGNORED
        return InboxOutcome.APPLIED

    async def _on_signal(self, ev: InboxRow) -> InboxOutcome:
        sig = await signal_store.signal_get(self.tx, self.ns, ev.source_event_id)
        if sig is None or sig.instance_id != self.inst.id or sig.matched_wait_id is not None:
            return InboxOutcome.IGNORED
        wait = await wait_store.wait_find_open_signal(
            self.tx, self.ns, self.inst.id, sig.name, sig.correlation_key
        )
        if wait is not None:
            await self._match(wait, sig)
        # Without an open wait the signal is kept; the wait that opens later takes it.
        return InboxOutcome.APPLIED

    # ------------------------------------------------------------------ the end

    async def _end(
        self, state: InstanceState, *, output: str | None = None, error: str | None = None
    ) -> None:
        """End the instance: stop everything still running, discard deferred advances."""
        if not self.running:
            return
        self.inst.state = state.value
        self.inst.output = output if state == InstanceState.SUCCEEDED else None
        self.inst.error = error
        self.inst.paused = 0
        self.inst.finished_at = self.now
        self._ended_event = EVENT_ENDED[state]
        self._queue.clear()
        for row in list(self.steps.values()):
            if row.state != StepState.RUNNING:
                continue
            s = self.d.steps[row.step_path]
            if isinstance(s, PollStep):
                ps = await self._poll_state(s.id)
                if ps.state == PollState.ACTIVE:
                    current = ps.current_activation_id
                    ps.state = PollState.CANCELLED.value
                    ps.finished_at = self.now
                    ps.current_activation_id = None
                    ps.next_round_at = None
                    await self._save_poll(ps)
                    if current is not None:
                        await self._cancel_activation(current)
            elif row.activations > 0:
                act = await act_store.activation_get_by_number(
                    self.tx, self.ns, self.inst.id, row.step_path, row.activations
                )
                if act is not None and act.state == "RUNNING":
                    await self._cancel_activation(act.id, act)
            row.state = StepState.CANCELLED.value
            row.finished_at = self.now
            await self._save_step(row)
            self.finished[row.step_path] = row.state
        for wait in await wait_store.wait_list_open(self.tx, self.ns, self.inst.id):
            await wait_store.wait_resolve_if_open(
                self.tx, self.ns, wait.id, WaitState.CANCELLED, self.now
            )
        await pending_store.pending_discard_for_instance(self.tx, self.ns, self.inst.id, self.now)

    async def _cancel_activation(
        self, activation_id: bytes, act: ActivationRow | None = None
    ) -> None:
        if act is None:
            act = await act_store.activation_get(self.tx, self.ns, activation_id)
        if act is None:
            return
        await self._end_activation(act.id, "CANCELLED")
        if act.task_id is not None:
            self._to_cancel.append(act.task_id)

    async def _event(self, type_: str, data: dict[str, Any]) -> None:
        await events.append_event(
            self.tx,
            self.ns,
            type_,
            SUBJECT,
            self.inst.id,
            {"workflow": self.inst.definition_name, "version": self.inst.version, **data},
            self.request_id,
            now=self.now,
        )


async def _instance_update(tx: Tx, inst: InstanceRow, now: datetime) -> bool:
    ok = await instance_store.instance_update_if_revision(tx, inst, now)
    if ok:
        inst.revision += 1
        inst.updated_at = now
    return ok
