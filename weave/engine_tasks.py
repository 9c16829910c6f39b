"""Task and poll steps: the Pulse tasks a run creates and what their ends do.

A ``task`` step (and each round of a ``poll`` step) renders its task spec into a Pulse submit
in the run's transaction (the owner's usage rows locked first, Pulse's lock order), records
an activation, and advances when the task's end reaches the instance's inbox. A ``poll``
step repeats its task until its condition holds, its rounds run out or its time is up.
"""

from __future__ import annotations

from datetime import datetime, timedelta
from typing import Any

import msgspec

from orbit.errors import OrbitError
from orbit.ids import id_hex, new_id
from orbit.times import format_time
from pulse import submit as pulse_submit
from pulse import transitions as pulse_transitions
from pulse.errors import QueueQuotaExceeded
from pulse.store import queues as pulse_queue_store
from pulse.types import TaskSubmit
from weave.definition import jsonvalue
from weave.definition.expressions import EvalError, evaluate, render
from weave.definition.model import (
    Outcome,
    PollStep,
    TaskSpec,
    TaskStep,
)
from weave.definition.valuetypes import conforms
from weave.engine_core import (
    _JSON,
    EngineBug,
    RunCore,
    _backoff,
    _decode_text,
    _error,
)
from weave.store import activations as act_store
from weave.store import polls as poll_store
from weave.types import (
    ActivationKind,
    ActivationRow,
    InboxOutcome,
    InboxRow,
    PollState,
    PollStateRow,
    StepRow,
    StepState,
    WaitKind,
)


class RunTasks(RunCore):
    """:class:`RunCore` with the task and poll step types."""

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
