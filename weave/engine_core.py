"""The engine's state of one locked instance and the primitives every step type uses.

:class:`RunCore` holds what a run knows (the instance row, its definition, its step rows,
the queue of steps to enter) and writes the rows a walk produces: steps, activations and
waits, the transition a finished step takes, the instance's end (everything still running
stops) and its raw events. The step types build on it in :mod:`weave.engine_tasks` (task
and poll steps) and :mod:`weave.engine` (the rest, and the public operations of
:class:`~weave.engine.Run`).
"""

from __future__ import annotations

import logging
from collections import deque
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

import msgspec

from orbit import events
from orbit.business_json import enc_hook
from orbit.errors import OrbitError
from orbit.ids import new_id
from orbit.storage import Tx
from weave.definition import jsonvalue
from weave.definition.expressions import EvalError, Expr, Scope, evaluate
from weave.definition.model import (
    Definition,
    EndSequence,
    FailInstance,
    Goto,
    Outcome,
    ParallelStep,
    PollStep,
    RetryPolicy,
    Step,
    SucceedInstance,
    Transition,
)
from weave.store import activations as act_store
from weave.store import instances as instance_store
from weave.store import pending as pending_store
from weave.store import polls as poll_store
from weave.store import steps as step_store
from weave.store import waits as wait_store
from weave.types import (
    ActivationKind,
    ActivationRow,
    InstanceRow,
    InstanceState,
    PollState,
    PollStateRow,
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


class RunCore:
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

    @property
    def running(self) -> bool:
        return self.inst.state == InstanceState.RUNNING

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

    def _seq(self) -> int:
        self.inst.history_seq += 1
        return self.inst.history_seq

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

    async def _poll_state(self, sid: str) -> PollStateRow:
        ps = await poll_store.poll_state_get(self.tx, self.ns, self.inst.id, sid)
        if ps is None:
            raise EngineBug(f"poll step {sid!r} has no poll state")
        return ps

    async def _save_poll(self, ps: PollStateRow) -> None:
        if not await poll_store.poll_state_update_if_revision(self.tx, ps):
            raise EngineBug(f"poll state of {ps.step_path!r} changed under the instance lock")

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
