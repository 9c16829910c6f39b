"""Workflow instances: start, read, history, pause, resume, cancel (docs/api/workflows.md).

Rules:

* **Start** (``POST .../workflows/{name}/instances``): the input is checked against the
  version's ``input_schema`` before anything is written (400 naming ``input``). One
  transaction inserts the instance (owner = the caller's application) and walks it as far
  as it goes: the first task's Pulse task is created in that same transaction. A
  ``business_key`` makes the start idempotent: an instance of the same workflow with that key
  is returned with 200 and ``"deduplicated": true`` (the unique index settles concurrent
  starts); ``Idempotency-Key`` is honoured too (operation ``workflows.start``, scope = the
  workflow name). A queue quota refusal while creating the first task is the client's 429.
* **Pause** sets ``paused`` and bumps ``control_revision``; running tasks go on, and events
  that arrive meanwhile are recorded as pending advances. **Resume** clears it and applies
  the pending advances in order in the same transaction (a bounded batch; the advancer
  applies any rest). Pausing a paused instance (or resuming a running one) is a 200 no-op.
* **Cancel** ends the instance CANCELLED and, in the same transaction, cancels the Pulse
  tasks of its running activations (:func:`pulse.tasks.cancel_in_tx`); cancels of running
  attempts are pushed to their workers after COMMIT. Cancelling a CANCELLED instance is a
  200 no-op; a SUCCEEDED or FAILED instance → 409.
* Control requests accept ``If-Match: "<control_revision>"`` (412 when it moved on).
* Every state change writes a raw event (``workflow.instance_*``) and control requests an
  audit event, in the same transaction.
"""

from __future__ import annotations

from datetime import datetime
from typing import TYPE_CHECKING, Any

import msgspec

from orbit import audit, business_json
from orbit.audit import Actor
from orbit.business_json import check_json_text
from orbit.errors import Forbidden, InvalidRequest
from orbit.idempotency import IdemRequest, Reply, perform
from orbit.ids import id_hex, new_id, parse_id
from orbit.pagination import encode_cursor
from orbit.preconditions import Preconditions
from orbit.storage import Database, DuplicateKey, Tx
from orbit.store.clock import clock_now
from orbit.times import format_opt, format_time
from weave.advancer import push_after_commit
from weave.definition import jsonvalue
from weave.definition.model import Definition, PollStep, TaskStep
from weave.definition.valuetypes import conforms
from weave.definitions import load_definition, resolve_version
from weave.engine import Run
from weave.engine_core import EVENT_PAUSED, EVENT_RESUMED, EVENT_STARTED, AfterCommit
from weave.errors import InstanceNotFound, InstanceStateConflict
from weave.inbox import apply_pending
from weave.store import activations as act_store
from weave.store import instances as store
from weave.store import signals as signal_store
from weave.store import steps as step_store
from weave.store import waits as wait_store
from weave.types import (
    HistoryEntry,
    HistoryOut,
    HistorySignal,
    InstanceOut,
    InstanceRow,
    InstanceState,
    StartBody,
    StepOut,
    StepRow,
    TransitionOut,
)

if TYPE_CHECKING:
    from pulse.hub import Notifier

START = "workflows.start"
PAUSE = "workflows.pause"
RESUME = "workflows.resume"
CANCEL = "workflows.cancel"
#: Deferred advances a resume applies in its own transaction (the advancer does the rest).
RESUME_BATCH = 100
#: Signals listed in a history response.
HISTORY_SIGNALS = 1000



def _raw(text: str | None) -> msgspec.Raw | None:
    return None if text is None else msgspec.Raw(text.encode())


def _obj(text: str | None) -> Any:
    return None if text is None else business_json.decode(text)


def step_out(row: StepRow) -> StepOut:
    return StepOut(
        step=row.step_path,
        type=row.step_type,
        state=row.state,
        next_step=row.next_step,
        activations=row.activations,
        output=_raw(row.output),
        error=_obj(row.error),
        seq=row.seq,
        started_at=format_time(row.started_at),
        finished_at=format_opt(row.finished_at),
    )


def instance_out(
    row: InstanceRow, steps: list[StepRow] | None = None, *, deduplicated: bool | None = None
) -> InstanceOut:
    """The API object of an instance (``steps`` in history order when given)."""
    return InstanceOut(
        id=id_hex(row.id),
        workflow=row.definition_name,
        workflow_id=id_hex(row.definition_id),
        version=row.version,
        owner_id=id_hex(row.owner_id),
        business_key=row.business_key,
        state=row.state,
        paused=bool(row.paused),
        control_revision=row.control_revision,
        revision=row.revision,
        input=msgspec.Raw(row.input.encode()),
        output=_raw(row.output),
        error=_obj(row.error),
        created_at=format_time(row.created_at),
        updated_at=format_time(row.updated_at),
        finished_at=format_opt(row.finished_at),
        steps=[step_out(s) for s in sorted(steps, key=lambda s: s.seq)]
        if steps is not None
        else msgspec.UNSET,
        deduplicated=deduplicated if deduplicated is not None else msgspec.UNSET,
    )


def _instance_id(text: str) -> bytes:
    raw = parse_id(text)
    if raw is None:
        raise InstanceNotFound()
    return raw


async def _view(tx: Tx, row: InstanceRow, *, deduplicated: bool | None = None) -> InstanceOut:
    steps = await step_store.step_list_for_instance(tx, row.namespace_id, row.id)
    return instance_out(row, steps, deduplicated=deduplicated)


# ----------------------------------------------------------------------------- start


def definition_queues(d: Definition) -> frozenset[str]:
    """Every queue the definition's task and poll steps submit to."""
    return frozenset(s.task.queue for s in d.steps.values() if isinstance(s, TaskStep | PollStep))


def check_input(raw: bytes) -> str:
    """The input's JSON text (400 ``input`` when it is not valid JSON)."""
    return check_json_text(raw, "input")


async def start_in_tx(
    tx: Tx,
    actor: Actor,
    namespace_id: bytes,
    name: str,
    input_text: str,
    *,
    version: int | None = None,
    business_key: str | None = None,
    allowed_queues: frozenset[str] | None = None,
    request_id: str | None = None,
    now: datetime | None = None,
) -> tuple[int, InstanceOut, AfterCommit | None]:
    """Start (or find, by business key) an instance in ``tx``: (status, instance, after).

    ``allowed_queues`` (a key limited to some queues): a definition whose task or poll steps
    use another queue is refused with 403 before anything is written.
    """
    wf, v = await resolve_version(tx, namespace_id, name, version, shared=True)
    d = await load_definition(tx, namespace_id, wf.id, v.version)
    if allowed_queues is not None:
        denied = sorted(definition_queues(d) - allowed_queues)
        if denied:
            raise Forbidden(f"the key may not use queue {denied[0]!r}", queues=denied)
    if not conforms(jsonvalue.decode(input_text), d.input_type):
        raise InvalidRequest(
            f"input does not match the workflow's input_schema ({d.input_type})", field="input"
        )
    if business_key is not None:
        found = await store.instance_get_by_business_key(tx, namespace_id, wf.id, business_key)
        if found is not None:
            return 200, await _view(tx, found, deduplicated=True), None
    t = now or await clock_now(tx)
    instance_id = new_id()
    try:
        await store.instance_insert(
            tx,
            namespace_id=namespace_id,
            instance_id=instance_id,
            owner_id=actor.application_id or bytes(16),
            definition_id=wf.id,
            definition_name=wf.name,
            version=v.version,
            business_key=business_key,
            input_text=input_text,
            created_by=actor.credential_id,
            now=t,
        )
    except DuplicateKey as exc:
        if exc.key != store.BUSINESS_KEY_INDEX or business_key is None:
            raise
        found = await store.instance_get_by_business_key(tx, namespace_id, wf.id, business_key)
        assert found is not None, "a duplicate business key is committed when we see 1062"
        return 200, await _view(tx, found, deduplicated=True), None
    inst = await store.instance_get(tx, namespace_id, instance_id, lock="update")
    assert inst is not None
    run = Run(tx, inst, d, [], t, request_id)
    await run.event(EVENT_STARTED, {"business_key": business_key})
    await run.begin()
    after = await run.save()
    await audit.record(
        tx, actor=actor, action=START, resource_kind="workflow_instance", resource_id=instance_id,
        status_code=201, namespace_id=namespace_id, request_id=request_id,
        details={"workflow": name, "version": v.version}, now=t,
    )  # fmt: skip
    return 201, instance_out(run.inst, list(run.steps.values()), deduplicated=False), after


async def start_instance(
    db: Database,
    actor: Actor,
    namespace_id: bytes,
    name: str,
    body: StartBody,
    *,
    hub: Notifier | None = None,
    allowed_queues: frozenset[str] | None = None,
    request_id: str | None = None,
    idem: IdemRequest | None = None,
    now: datetime | None = None,
) -> Reply:
    """``POST .../workflows/{name}/instances`` (see the module docstring)."""
    input_text = check_input(bytes(body.input))
    if body.business_key is not None and body.business_key.endswith(" "):
        # utf8mb4_bin pads with spaces: "k " would find the instance of "k" as a duplicate.
        raise InvalidRequest("business_key must not end with a space", field="business_key")
    after_box: list[AfterCommit] = []

    async def effect(tx: Tx) -> tuple[int, InstanceOut]:
        after_box.clear()
        status, out, after = await start_in_tx(
            tx, actor, namespace_id, name, input_text, version=body.version,
            business_key=body.business_key, allowed_queues=allowed_queues,
            request_id=request_id, now=now,
        )  # fmt: skip
        if after is not None:
            after_box.append(after)
        return status, out

    async def run(tx: Tx) -> Reply:
        return await perform(tx, idem, namespace_id, START, name, effect)

    reply = await db.transaction(run)
    for after in after_box:
        await push_after_commit(hub, namespace_id, after)
    return reply


# ----------------------------------------------------------------------------- read


async def get_instance(db: Database, namespace_id: bytes, instance_id: str) -> InstanceOut:
    """``GET .../instances/{id}``: the instance with its steps (history order)."""
    iid = _instance_id(instance_id)

    async def run(tx: Tx) -> InstanceOut:
        row = await store.instance_get(tx, namespace_id, iid)
        if row is None:
            raise InstanceNotFound()
        return await _view(tx, row)

    return await db.read(run)


async def _queues_allowed(tx: Tx, row: InstanceRow, allowed_queues: frozenset[str] | None) -> bool:
    """May a key limited to ``allowed_queues`` (None: not limited) see the instance? Only
    when every queue its version's task and poll steps submit to is allowed."""
    if allowed_queues is None:
        return True
    d = await load_definition(tx, row.namespace_id, row.definition_id, row.version)
    return definition_queues(d) <= allowed_queues


async def check_visible(
    db: Database, namespace_id: bytes, instance_id: str, allowed_queues: frozenset[str] | None
) -> None:
    """404 when a key limited to ``allowed_queues`` may not see the instance (nothing is
    read for an unlimited key): its steps run on queues the key may not use."""
    if allowed_queues is None:
        return
    iid = _instance_id(instance_id)

    async def run(tx: Tx) -> bool:
        row = await store.instance_get(tx, namespace_id, iid)
        return row is not None and await _queues_allowed(tx, row, allowed_queues)

    if not await db.read(run):
        raise InstanceNotFound()


async def list_instances(
    db: Database,
    namespace_id: bytes,
    *,
    workflow: str | None = None,
    state: str | None = None,
    before: tuple[datetime, bytes] | None = None,
    limit: int = 50,
    allowed_queues: frozenset[str] | None = None,
) -> tuple[list[InstanceOut], tuple[datetime, bytes] | None]:
    """Instances newest first (optionally of one workflow / in one state), keyset-paged.
    A key limited to ``allowed_queues`` sees only instances :func:`check_visible` allows (a
    page may then hold fewer than ``limit``)."""

    async def run(tx: Tx) -> tuple[list[InstanceOut], tuple[datetime, bytes] | None]:
        definition_id: bytes | None = None
        if workflow is not None:
            wf, _ = await resolve_version(tx, namespace_id, workflow, None)
            definition_id = wf.id
        at, bid = before or (datetime(9999, 12, 31), b"\xff" * 16)
        rows = await store.instance_list(
            tx, namespace_id, state=state, definition_id=definition_id,
            before_at=at, before_id=bid, limit=limit,
        )  # fmt: skip
        nxt = (rows[-1].created_at, rows[-1].id) if len(rows) == limit else None
        return [instance_out(r) for r in rows if await _queues_allowed(tx, r, allowed_queues)], nxt

    return await db.read(run)


async def get_history(
    db: Database, namespace_id: bytes, instance_id: str, *, after_seq: int = 0, limit: int = 500
) -> HistoryOut:
    """``GET .../instances/{id}/history``.

    ``items``: steps, activations and waits merged in history order (``seq``, handed out by
    the instance as it advances), ``limit`` per page after ``after_seq``. On every page:
    ``transitions`` (each step left, in the order the steps finished) and ``signals`` (in
    arrival order, at most :data:`HISTORY_SIGNALS`).
    """
    iid = _instance_id(instance_id)

    async def run(tx: Tx) -> HistoryOut:
        inst = await store.instance_get(tx, namespace_id, iid)
        if inst is None:
            raise InstanceNotFound()
        steps = await step_store.step_list_for_instance(tx, namespace_id, iid)
        acts = await act_store.activation_list_page(tx, namespace_id, iid, after_seq, limit)
        waits = await wait_store.wait_list_page(tx, namespace_id, iid, after_seq, limit)
        items: list[HistoryEntry] = []
        for s in steps:
            if s.seq > after_seq:
                items.append(
                    HistoryEntry(
                        entry="step",
                        seq=s.seq,
                        step=s.step_path,
                        at=format_time(s.started_at),
                        state=s.state,
                        type=s.step_type,
                        next_step=s.next_step,
                        output=_raw(s.output),
                        error=_obj(s.error),
                        finished_at=format_opt(s.finished_at),
                    )
                )
        for a in acts:
            items.append(
                HistoryEntry(
                    entry="activation",
                    seq=a.seq,
                    step=a.step_path,
                    at=format_time(a.started_at),
                    state=a.state,
                    kind=a.kind,
                    id=id_hex(a.id),
                    activation_no=a.activation_no,
                    task_id=id_hex(a.task_id) if a.task_id else None,
                    result=_raw(a.result),
                    error=_obj(a.error),
                    condition_met=None if a.condition_met is None else bool(a.condition_met),
                    finished_at=format_opt(a.finished_at),
                )
            )
        for w in waits:
            items.append(
                HistoryEntry(
                    entry="wait",
                    seq=w.seq,
                    step=w.step_path,
                    at=format_time(w.created_at),
                    state=w.state,
                    kind=w.kind,
                    id=id_hex(w.id),
                    signal=w.signal_name,
                    correlation_key=w.correlation_key,
                    due_at=format_opt(w.due_at),
                    signal_row_id=id_hex(w.signal_row_id) if w.signal_row_id else None,
                    finished_at=format_opt(w.resolved_at),
                )
            )
        items.sort(key=lambda e: e.seq)
        items = items[:limit]
        finished = sorted(
            (s for s in steps if s.finished_at is not None), key=lambda s: (s.finished_at, s.seq)
        )
        transitions = [
            TransitionOut(
                step=s.step_path,
                outcome=s.state,
                to=s.next_step,
                at=format_time(s.finished_at),  # type: ignore[arg-type]
            )
            for s in finished
        ]
        sigs = await signal_store.signal_list_for_instance(tx, namespace_id, iid, HISTORY_SIGNALS)
        signals = [
            HistorySignal(
                id=id_hex(g.id),
                signal_id=g.signal_id,
                name=g.name,
                correlation_key=g.correlation_key,
                payload=msgspec.Raw(g.payload.encode()),
                received_at=format_time(g.received_at),
                matched_wait_id=id_hex(g.matched_wait_id) if g.matched_wait_id else None,
                matched_at=format_opt(g.matched_at),
            )
            for g in sigs
        ]
        more = len(items) == limit and items[-1].seq < inst.history_seq
        nxt = (
            encode_cursor({"after_seq": items[-1].seq}, {"instance": instance_id}) if more else None
        )
        return HistoryOut(
            instance_id=instance_id, state=inst.state, items=items,
            transitions=transitions, signals=signals, next_cursor=nxt,
        )  # fmt: skip

    return await db.read(run)


# ----------------------------------------------------------------------------- control


async def _control(
    db: Database,
    namespace_id: bytes,
    instance_id: str,
    action: str,
    actor: Actor | None,
    change: Any,
    *,
    hub: Notifier | None = None,
    preconditions: Preconditions | None = None,
    request_id: str | None = None,
    now: datetime | None = None,
) -> InstanceOut:
    iid = _instance_id(instance_id)

    async def run(tx: Tx) -> tuple[InstanceOut, AfterCommit | None]:
        inst = await store.instance_get(tx, namespace_id, iid, lock="update")
        if inst is None:
            raise InstanceNotFound()
        if preconditions is not None:
            preconditions.check(inst.control_revision)
        t = now or await clock_now(tx)
        before = (inst.state, inst.paused)
        r = await Run.load(tx, inst, t, request_id)
        changed = await change(r)
        after = await r.save() if changed else None
        if actor is not None:
            await audit.record(
                tx, actor=actor, action=action, resource_kind="workflow_instance",
                resource_id=iid, status_code=200, namespace_id=namespace_id,
                request_id=request_id,
                details={"from": {"state": before[0], "paused": bool(before[1])},
                         "changed": bool(changed)},
                now=t,
            )  # fmt: skip
        return await _view(tx, r.inst), after

    out, after = await db.transaction(run)
    if after is not None:
        await push_after_commit(hub, namespace_id, after)
    return out


def _require_running(r: Run, what: str) -> None:
    if not r.running:
        raise InstanceStateConflict(f"a {r.inst.state} instance cannot be {what}", r.inst.state)


async def pause_instance(
    db: Database, namespace_id: bytes, instance_id: str, *, actor: Actor | None = None,
    preconditions: Preconditions | None = None, request_id: str | None = None,
    now: datetime | None = None,
) -> InstanceOut:  # fmt: skip
    """Pause a RUNNING instance (no-op when paused; 409 when it ended)."""

    async def change(r: Run) -> bool:
        _require_running(r, "paused")
        if r.inst.paused:
            return False
        r.inst.paused = 1
        r.inst.control_revision += 1
        r.changed = True
        await r.event(EVENT_PAUSED, {"control_revision": r.inst.control_revision})
        return True

    return await _control(
        db, namespace_id, instance_id, PAUSE, actor, change,
        preconditions=preconditions, request_id=request_id, now=now,
    )  # fmt: skip


async def resume_instance(
    db: Database, namespace_id: bytes, instance_id: str, *, actor: Actor | None = None,
    hub: Notifier | None = None, preconditions: Preconditions | None = None, request_id: str | None = None,
    now: datetime | None = None,
) -> InstanceOut:  # fmt: skip
    """Resume a paused instance and apply what it deferred (no-op when not paused)."""

    async def change(r: Run) -> bool:
        _require_running(r, "resumed")
        if not r.inst.paused:
            return False
        r.inst.paused = 0
        r.inst.control_revision += 1
        r.changed = True
        await r.event(EVENT_RESUMED, {"control_revision": r.inst.control_revision})
        await apply_pending(r, RESUME_BATCH)
        return True

    return await _control(
        db, namespace_id, instance_id, RESUME, actor, change, hub=hub,
        preconditions=preconditions, request_id=request_id, now=now,
    )  # fmt: skip


async def cancel_instance(
    db: Database, namespace_id: bytes, instance_id: str, *, actor: Actor | None = None,
    hub: Notifier | None = None, preconditions: Preconditions | None = None, request_id: str | None = None,
    reason: str = "cancelled on request", now: datetime | None = None,
) -> InstanceOut:  # fmt: skip
    """Cancel a RUNNING instance and its running tasks (no-op when CANCELLED; 409 when it
    SUCCEEDED or FAILED)."""

    async def change(r: Run) -> bool:
        if r.inst.state == InstanceState.CANCELLED:
            return False
        _require_running(r, "cancelled")
        r.inst.control_revision += 1
        await r.cancel(reason)
        return True

    return await _control(
        db, namespace_id, instance_id, CANCEL, actor, change, hub=hub,
        preconditions=preconditions, request_id=request_id, now=now,
    )  # fmt: skip
