"""Schedule controls: fire a schedule now (trigger), fill in a past range (backfill), delete.

* **Trigger** creates exactly one occurrence at the database clock's *now* with the current
  version's task (origin ``trigger``), whether the schedule is paused or not, and whatever
  its overlap policy: an operator who asks for a run gets one. Its task becomes the
  schedule's previous run. An ``idempotency_key`` (body) makes it idempotent for the
  schedule's lifetime: the same key answers the occurrence it created (200) instead of a new
  one (unique key ``uq_pulse_schedule_occurrences_trigger``); the ``Idempotency-Key`` header
  works as on every creating POST (24 h window, original status replayed).
* **Backfill** ``[from, to)`` creates the task of every fire time of the cadence in the
  range that has not already created one (at most :data:`MAX_BACKFILL` fire times), each
  under the version that governs it (version 1 for times before the schedule existed), in
  one transaction. A fire time that already ran — scheduled or backfilled before — is
  skipped, so running the same backfill twice creates nothing the second time; a fire time
  recorded as skipped (catch-up window, pause, overlap) is filled in. The range ends at the
  schedule's ``covered_until`` at the latest: later fire times are the scheduler's. The
  unique key on ``fire_slot`` backs exactly-once up. Backfilled tasks are not previous
  runs (overlap policies ignore them).
* **Delete** removes the schedule row: nothing fires any more and the name is free again.
  Its versions and occurrences (and the tasks they created) stay as history until
  retention removes them.

Every one of them locks the schedule row first (the lock order of :mod:`pulse.scheduler`:
schedule row → what task submission locks), so a control never races the scheduler or
another control over the same fire time.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from typing import Annotated, Any

import msgspec
from msgspec import Meta

from orbit import audit, idempotency
from orbit import events as orbit_events
from orbit.audit import Actor
from orbit.errors import InvalidRequest, OrbitError
from orbit.idempotency import IdemRequest, Reply
from orbit.ids import id_hex, new_id
from orbit.preconditions import Preconditions
from orbit.storage import Database, Tx
from orbit.store.clock import clock_now
from orbit.times import format_time, parse_time
from pulse import transitions
from pulse.cron import ONE_US, Segment, Timeline, local_text
from pulse.scheduler import EVENT_FIRED, load_timeline, occurrence_row, task_item, timing_of
from pulse.schedules import ScheduleNotFound, _visible_row, occurrence_view
from pulse.store import schedules as store
from pulse.store import tasks as task_store
from pulse.submit import submit_in_tx

#: Most fire times one backfill may cover.
MAX_BACKFILL = 1000

TRIGGER_ACTION = "schedules.trigger"
BACKFILL_ACTION = "schedules.backfill"
DELETE_ACTION = "schedules.delete"
EVENT_TRIGGERED = "schedule.triggered"
EVENT_BACKFILLED = "schedule.backfilled"
EVENT_DELETED = "schedule.deleted"

#: Printable ASCII, 1-128 characters (the rule of ``Idempotency-Key``).
_KEY_PATTERN = r"^[\x20-\x7e]{1,128}$"


class TriggerBody(msgspec.Struct, forbid_unknown_fields=True, kw_only=True):
    """``POST …/schedules/{name}/trigger`` (the body may be empty)."""

    idempotency_key: Annotated[str, Meta(pattern=_KEY_PATTERN)] | None = None


class BackfillBody(msgspec.Struct, forbid_unknown_fields=True, kw_only=True):
    """``POST …/schedules/{name}/backfill``: the range ``[from, to)`` (RFC 3339)."""

    from_: str = msgspec.field(name="from")
    to: str


@dataclass(frozen=True)
class Triggered:
    """Outcome of :func:`trigger_schedule`: the reply (201 new, 200 same key again) and the
    queue that got a new task (to wake the dispatcher after commit)."""

    reply: Reply
    new_work: bytes | None = None


@dataclass(frozen=True)
class Backfilled:
    """Outcome of :func:`backfill_schedule`: the answer and the queues that got tasks."""

    answer: dict[str, Any]
    new_work: frozenset[bytes] = frozenset()


def _raise_item_error(result: Any) -> None:
    if result.error is not None:
        raise result.error
    if result.row is None:  # pragma: no cover - submit_in_tx gives a row or an error
        raise OrbitError("the task was not created")


# ------------------------------------------------------------------------------ trigger


async def trigger_schedule(
    db: Database,
    namespace_id: bytes,
    name: str,
    body: TriggerBody,
    *,
    idem: IdemRequest | None = None,
    actor: Actor | None = None,
    request_id: str | None = None,
    allowed_queues: frozenset[str] | None = None,
    now: datetime | None = None,
) -> Triggered:
    """Fire schedule ``name`` once now: 201 ``{"occurrence", "task"}``; 200 with the same
    for an ``idempotency_key`` used before on this schedule.

    Raises 404 (no such schedule, or of a queue the key may not use; also when the current
    version's queue no longer exists), 429 (a quota refused the task: nothing is written),
    400 (the template's task is refused).
    """
    key = body.idempotency_key
    woke: list[bytes] = []

    async def effect(tx: Tx) -> tuple[int, Any]:
        row = await _visible_row(tx, namespace_id, name, allowed_queues, for_update=True)
        stamp = await clock_now(tx, now)
        if key is not None:
            found = await store.occurrence_get_by_trigger_key(tx, namespace_id, row["id"], key)
            if found is not None:
                return 200, await _trigger_answer(tx, found, replayed=True)
        version = await store.version_get(tx, namespace_id, row["id"], int(row["current_version"]))
        assert version is not None, "the current version exists"
        local = local_text(timing_of(version).zone, stamp)
        occurrence_id = new_id()
        [result] = await submit_in_tx(
            tx, namespace_id, row["owner_id"], [task_item(row, version, stamp, local)],
            source_kind="schedule", source_id=occurrence_id, request_id=request_id, now=stamp,
        )  # fmt: skip
        _raise_item_error(result)
        task = result.row
        assert task is not None
        if result.status == 201:
            woke.append(task["queue_id"])
        occurrence = occurrence_row(
            row, occurrence_id, stamp, local, int(version["version"]), stamp,
            task_id=task["id"], reason="deduplicated" if result.status == 200 else None,
            origin="trigger", trigger_key=key,
        )  # fmt: skip
        await store.occurrence_insert(tx, occurrence)
        await store.schedule_set_last_task(tx, namespace_id, row["id"], task["id"])
        data = {
            "occurrence_id": id_hex(occurrence_id),
            "fire_at": format_time(stamp),
            "version": int(version["version"]),
            "task_id": id_hex(task["id"]),
            "idempotency_key": key,
        }
        await orbit_events.append_event(
            tx, namespace_id, EVENT_TRIGGERED, "schedule", row["id"], data, request_id,
            now=stamp,
        )  # fmt: skip
        if actor is not None:
            await audit.record(
                tx, actor=actor, action=TRIGGER_ACTION, resource_kind="schedule",
                resource_id=name, status_code=201, namespace_id=namespace_id,
                request_id=request_id, details=data, now=stamp,
            )  # fmt: skip
        return 201, {
            "occurrence": occurrence_view(occurrence),
            "task": transitions.task_view(task),
            "replayed": False,
        }

    async def run(tx: Tx) -> Reply:
        woke.clear()
        return await idempotency.perform(
            tx, idem, namespace_id, TRIGGER_ACTION, name, effect, now=now
        )

    reply = await db.transaction(run)
    return Triggered(reply, None if reply.replayed or not woke else woke[0])


async def _trigger_answer(tx: Tx, occurrence: dict[str, Any], *, replayed: bool) -> dict[str, Any]:
    task = await task_store.task_get(tx, occurrence["namespace_id"], occurrence["task_id"])
    return {
        "occurrence": occurrence_view(occurrence),
        "task": None if task is None else transitions.task_view(task),
        "replayed": replayed,
    }


# ------------------------------------------------------------------------------ backfill


def _range(body: BackfillBody) -> tuple[datetime, datetime]:
    try:
        lo = parse_time(body.from_)
    except ValueError as exc:
        raise InvalidRequest(f"from: {exc}", field="from") from None
    try:
        hi = parse_time(body.to)
    except ValueError as exc:
        raise InvalidRequest(f"to: {exc}", field="to") from None
    if hi <= lo:
        raise InvalidRequest("to must be after from", field="to")
    return lo, hi


def _backfill_line(loaded_line: Timeline, lo: datetime) -> Timeline:
    """The loaded time line, with its first version also governing fire times before it was
    published (a backfill may reach back before the schedule existed)."""
    segs = list(loaded_line.segments)
    if segs and segs[0].start > lo:
        first = segs[0]
        segs[0] = Segment(first.version, lo, first.end, first.timing)
    return Timeline(segs)


async def backfill_schedule(
    db: Database,
    namespace_id: bytes,
    name: str,
    body: BackfillBody,
    *,
    actor: Actor | None = None,
    request_id: str | None = None,
    allowed_queues: frozenset[str] | None = None,
    now: datetime | None = None,
) -> Backfilled:
    """Create the tasks of the fire times in ``[from, to)`` that have not run (module
    docstring), in one transaction: ``{"count", "already_occurred", "fire_times", "from",
    "to"}`` where ``to`` is the effective end (at most the schedule's ``covered_until``).

    Raises 400 (a bad range: malformed, empty, starting in the future, or holding more than
    :data:`MAX_BACKFILL` fire times — nothing is written), 404 (no such schedule), 429 (a
    quota refused a task: nothing is written).
    """
    lo, hi = _range(body)

    async def run(tx: Tx) -> Backfilled:
        row = await _visible_row(tx, namespace_id, name, allowed_queues, for_update=True)
        stamp = await clock_now(tx, now)
        if lo >= stamp:
            raise InvalidRequest("from must be in the past", field="from")
        end = min(hi, row["covered_until"])
        loaded = await load_timeline(tx, namespace_id, row["id"], lo)
        if loaded.horizon is not None:
            end = min(end, loaded.horizon)
        line = _backfill_line(loaded.line, lo)
        times: list[tuple[datetime, int, Any]] = []
        for segment, seg_lo, seg_hi in line.segments_between(lo, end):
            t = segment.timing.next_fire(seg_lo)
            while t is not None and t < seg_hi:
                if len(times) >= MAX_BACKFILL:
                    raise InvalidRequest(
                        f"the range holds more than {MAX_BACKFILL} fire times", field="to"
                    )
                times.append((t, segment.version, segment.timing))
                t = segment.timing.next_fire(t + ONE_US)
        done = await store.occurrence_slots_between(
            tx, namespace_id, row["id"], lo, end, MAX_BACKFILL + 1
        )
        if row["buffered_fire_at"] is not None:
            done.add(row["buffered_fire_at"])  # held back by buffer_one: it fires later
        todo = [(t, v, timing) for t, v, timing in times if t not in done]
        answer = {
            "count": len(todo),
            "already_occurred": len(times) - len(todo),
            "fire_times": len(times),
            "from": format_time(lo),
            "to": format_time(end),
        }
        if not todo:
            return Backfilled(answer)
        ids = [new_id() for _ in todo]
        locals_ = [local_text(timing.zone, t) for t, _, timing in todo]
        items = [
            task_item(row, loaded.versions[v], t, local)
            for (t, v, _), local in zip(todo, locals_, strict=True)
        ]
        results = await submit_in_tx(
            tx, namespace_id, row["owner_id"], items, source_kind="schedule", source_ids=ids,
            request_id=request_id, now=stamp,
        )  # fmt: skip
        for result in results:
            _raise_item_error(result)
        new_work = frozenset(
            r.row["queue_id"] for r in results if r.status == 201 and r.row is not None
        )
        occurrences = []
        events = []
        for (t, v, _), local, occ_id, result in zip(todo, locals_, ids, results, strict=True):
            task = result.row
            assert task is not None
            occurrences.append(
                occurrence_row(
                    row, occ_id, t, local, v, stamp, task_id=task["id"], origin="backfill",
                    reason="deduplicated" if result.status == 200 else None,
                )
            )
            events.append(
                orbit_events.NewEvent(
                    type=EVENT_FIRED,
                    subject_kind="schedule",
                    subject_id=row["id"],
                    data={
                        "occurrence_id": id_hex(occ_id),
                        "fire_at": format_time(t),
                        "version": v,
                        "outcome": "created",
                        "late": False,
                        "task_id": id_hex(task["id"]),
                        "origin": "backfill",
                    },
                    request_id=request_id,
                )
            )
        await store.occurrence_insert_many(tx, occurrences)
        backfilled = orbit_events.NewEvent(
            type=EVENT_BACKFILLED, subject_kind="schedule", subject_id=row["id"],
            data=answer, request_id=request_id,
        )  # fmt: skip
        events.append(backfilled)
        await orbit_events.append_events(tx, namespace_id, events, now=stamp)
        if actor is not None:
            await audit.record(
                tx, actor=actor, action=BACKFILL_ACTION, resource_kind="schedule",
                resource_id=name, status_code=202, namespace_id=namespace_id,
                request_id=request_id, details=answer, now=stamp,
            )  # fmt: skip
        return Backfilled(answer, new_work)

    return await db.transaction(run)


# ------------------------------------------------------------------------------ delete


async def delete_schedule(
    db: Database,
    namespace_id: bytes,
    name: str,
    *,
    pre: Preconditions | None = None,
    actor: Actor | None = None,
    request_id: str | None = None,
    allowed_queues: frozenset[str] | None = None,
) -> None:
    """Delete schedule ``name`` (versions, occurrences and tasks stay as history). 404 when
    absent; 412 when ``If-Match`` names another revision."""
    pre = pre or Preconditions()

    async def run(tx: Tx) -> None:
        row = await _visible_row(tx, namespace_id, name, allowed_queues, for_update=True)
        pre.check(int(row["revision"]))
        stamp = await clock_now(tx, None)
        if not await store.schedule_delete_if_revision(
            tx, namespace_id, row["id"], int(row["revision"])
        ):  # pragma: no cover - the row is locked
            raise ScheduleNotFound()
        data = {
            "name": name,
            "version": int(row["current_version"]),
            "covered_until": format_time(row["covered_until"]),
            "buffered_fire_at": None
            if row["buffered_fire_at"] is None
            else format_time(row["buffered_fire_at"]),
        }
        await orbit_events.append_event(
            tx, namespace_id, EVENT_DELETED, "schedule", row["id"], data, request_id, now=stamp
        )
        if actor is not None:
            await audit.record(
                tx, actor=actor, action=DELETE_ACTION, resource_kind="schedule",
                resource_id=name, status_code=204, namespace_id=namespace_id,
                request_id=request_id, details={"id": id_hex(row["id"]), **data}, now=stamp,
            )  # fmt: skip

    await db.transaction(run)


__all__ = [
    "MAX_BACKFILL",
    "BackfillBody",
    "Backfilled",
    "TriggerBody",
    "Triggered",
    "backfill_schedule",
    "delete_schedule",
    "trigger_schedule",
]
