"""The inbox: how facts reach an instance, exactly once.

Three writers put events into ``weave_inbox``, each in the transaction of the fact itself,
de-duplicated by ``(namespace_id, source_event_id)``:

* **task_finished** — :func:`on_task_result`, a hook in Pulse's
  :data:`pulse.transitions.TERMINAL_HOOKS`, runs inside the Pulse transaction that moves a
  workflow task (``source_kind='workflow'``) to SUCCEEDED, FAILED or CANCELLED. Source id:
  the task id (a terminal state is final, so a task yields one event). NEEDS_REVIEW writes
  nothing: the step keeps waiting until an operator resolves the task, whose terminal
  change then writes the event.
* **timer_fired** — the timer loop (:mod:`weave.timers`). Source id: the wait id.
* **signal_arrived** — the signal route (:mod:`weave.signals`). Source id: the signal row id.

The advancer (:mod:`weave.advancer`) and resume (:mod:`weave.instances`) consume events
with :func:`apply_events` / :func:`apply_pending` on a :class:`~weave.engine.Run` whose
instance they hold locked: each event is applied (or deferred while paused, or ignored when
stale) and marked processed in the same transaction as its effects.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from datetime import datetime
from typing import Any

import msgspec

from orbit.business_json import enc_hook
from orbit.ids import id_hex, new_id
from orbit.storage import DuplicateKey, Tx
from pulse import transitions
from weave.engine import Run
from weave.engine_core import EngineBug
from weave.store import activations as act_store
from weave.store import inbox as store
from weave.store import pending as pending_store
from weave.types import InboxKind, InboxOutcome, InboxRow

#: Task states that end a workflow task step (NEEDS_REVIEW waits for its resolution).
FINAL_TASK_STATES = frozenset({"SUCCEEDED", "FAILED", "CANCELLED"})

_JSON = msgspec.json.Encoder(decimal_format="number", enc_hook=enc_hook)


async def write_event(
    tx: Tx,
    namespace_id: bytes,
    instance_id: bytes,
    kind: InboxKind,
    source_event_id: bytes,
    *,
    step_path: str | None = None,
    payload: str | None = None,
    data: Mapping[str, Any] | None = None,
    now: datetime | None = None,
) -> bool:
    """Insert an inbox event in ``tx``; False when the source event was written before."""
    try:
        await store.inbox_insert(
            tx,
            namespace_id=namespace_id,
            inbox_id=new_id(),
            instance_id=instance_id,
            kind=kind.value,
            source_event_id=source_event_id,
            step_path=step_path,
            payload=payload,
            data=None if data is None else _JSON.encode(data).decode(),
            now=now,
        )
    except DuplicateKey as exc:
        if exc.key != store.SOURCE_INDEX:
            raise
        return False
    return True


async def on_task_result(
    tx: Tx, namespace_id: bytes, row: Mapping[str, Any], now: datetime | None = None
) -> None:
    """Pulse terminal hook: a workflow task ended, write its ``task_finished`` event (stamped
    with the task change's ``now``; None = the database clock)."""
    if row.get("source_kind") != "workflow" or row["state"] not in FINAL_TASK_STATES:
        return
    source_id = row.get("source_id")
    if source_id is None:
        return
    act = await act_store.activation_get(tx, namespace_id, bytes(source_id))
    if act is None or act.task_id != bytes(row["id"]):
        return
    result = row.get("result")
    await write_event(
        tx,
        namespace_id,
        act.instance_id,
        InboxKind.TASK_FINISHED,
        bytes(row["id"]),
        step_path=act.step_path,
        payload=result if row["state"] == "SUCCEEDED" and result is not None else None,
        data={
            "activation_id": id_hex(act.id),
            "task_state": row["state"],
            "attempts": int(row.get("attempts") or 0),
            "error": transitions.json_value(row.get("error")),
        },
        now=now,
    )


def install_hook() -> None:
    """Register :func:`on_task_result` with Pulse (idempotent)."""
    if on_task_result not in transitions.TERMINAL_HOOKS:
        transitions.TERMINAL_HOOKS.append(on_task_result)


async def apply_events(run: Run, rows: Sequence[InboxRow]) -> dict[str, int]:
    """Apply locked, unprocessed events to ``run`` in order, marking each processed.

    Stops at the first event not yet due (``available_at`` after ``run.now``: a backed-off
    retry), so events of an instance are never applied out of order. Returns counts by
    outcome.
    """
    counts: dict[str, int] = {}
    for ev in rows:
        if ev.available_at > run.now:
            break
        if not run.running:
            outcome = InboxOutcome.IGNORED
        elif run.inst.paused:
            await pending_store.pending_insert(
                run.tx,
                namespace_id=run.ns,
                pending_id=new_id(),
                instance_id=run.inst.id,
                inbox_id=ev.id,
                control_revision=run.inst.control_revision,
                now=run.now,
            )
            outcome = InboxOutcome.DEFERRED
        else:
            outcome = await run.apply(ev)
        if not await store.inbox_mark_processed_if_pending(
            run.tx, run.ns, ev.id, outcome.value, run.now
        ):
            raise EngineBug("inbox event consumed twice under the instance lock")
        counts[outcome.value] = counts.get(outcome.value, 0) + 1
    return counts


async def apply_pending(run: Run, limit: int) -> int:
    """Apply up to ``limit`` advances deferred while the instance was paused, in the order
    they were recorded; return how many were resolved. Nothing while still paused."""
    if not run.running or run.inst.paused:
        return 0
    done = 0
    for p in await pending_store.pending_list_for_instance(run.tx, run.ns, run.inst.id, limit):
        if not run.running:
            break  # the instance ended: _end discarded the rest
        ev = await store.inbox_get(run.tx, run.ns, p.inbox_id) if p.inbox_id else None
        if ev is not None:
            await run.apply(ev)
        if await pending_store.pending_resolve_if_pending(run.tx, run.ns, p.id, "DONE", run.now):
            done += 1
    if done:
        run.changed = True
    return done
