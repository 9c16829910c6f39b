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

from datetime import datetime, timedelta
from typing import Any

from orbit.storage import CasConflict, Tx
from orbit.times import parse_time
from pulse import tasks as pulse_tasks
from weave.definition import jsonvalue
from weave.definition.expressions import EvalError, render
from weave.definition.model import (
    ChoiceStep,
    FailInstance,
    FailStep,
    Goto,
    JoinStep,
    Outcome,
    ParallelStep,
    PollStep,
    SleepStep,
    SucceedStep,
    TaskStep,
    WaitSignalStep,
)
from weave.definition.valuetypes import conforms
from weave.definitions import load_definition
from weave.engine_core import (
    EVENT_ADVANCED,
    AfterCommit,
    EngineBug,
    _decode_text,
    _error,
    _instance_update,
)
from weave.engine_tasks import RunTasks
from weave.store import signals as signal_store
from weave.store import steps as step_store
from weave.store import waits as wait_store
from weave.types import (
    ActivationKind,
    InboxKind,
    InboxOutcome,
    InboxRow,
    InstanceRow,
    InstanceState,
    PollState,
    SignalRow,
    StepState,
    WaitKind,
    WaitRow,
    WaitState,
)


class Run(RunTasks):
    """One instance, locked, with its definition and step rows, inside one transaction."""

    @classmethod
    async def load(
        cls, tx: Tx, inst: InstanceRow, now: datetime, request_id: str | None = None
    ) -> Run:
        """Build a run for ``inst`` (already locked by the caller)."""
        d = await load_definition(tx, inst.namespace_id, inst.definition_id, inst.version)
        steps = await step_store.step_list_for_instance(tx, inst.namespace_id, inst.id)
        return cls(tx, inst, d, steps, now, request_id)

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

    async def _drain(self) -> None:
        while self._queue and self.running:
            await self._enter(self._queue.popleft())
        self._queue.clear()

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
