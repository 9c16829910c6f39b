"""Schedules: publish immutable versions, read, pause/resume, list occurrences.

* ``PUT`` publishes a new immutable version atomically (one transaction, the schedule row
  locked): version numbers 1, 2, …; the schedule's ``revision`` (its ETag) moves with each
  publish; ``If-Match`` / ``If-None-Match: *`` are checked against the locked row. A PUT
  equal to the current version (same fields, same tzdata release) is a no-op: 200, same
  revision. The publish time of a version is the database clock at commit, never earlier
  than the schedule's ``covered_until`` or the previous version's publish time; fire times
  before it keep the old version (nothing due is lost), later ones use the new one.
* Pause first fires what is already due (the scheduler's catch-up and grace rules, in
  bounded transactions), then sets ``paused`` (bumping ``control_revision``). Resume records
  every fire time that fell into the pause as skipped (one row per version segment, reason
  ``paused``) and continues from the resume time. Both are idempotent.
* Reads give the current version, the next fire time, ``covered_until`` and the occurrence
  list (newest first, with a cursor).

The scheduler loop itself is :mod:`pulse.scheduler`.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from typing import Any

from orbit import audit
from orbit import events as orbit_events
from orbit.audit import Actor
from orbit.errors import InvalidRequest, NotFound
from orbit.ids import new_id
from orbit.pagination import decode_cursor, encode_cursor
from orbit.preconditions import Preconditions
from orbit.storage import Database, DuplicateKey, Tx
from orbit.store.clock import clock_now
from orbit.times import format_time, parse_time
from pulse.errors import PulseError, QueueNotFound
from pulse.schedule_versions import (
    DEFAULT_CATCHUP_MS,
    DEFAULT_GRACE_MS,
    SchedulePut,
    ScheduleTask,
    _same_version,
    occurrence_view,
    schedule_view,
    version_fields,
    version_view,
)
from pulse.scheduler import DEFAULT_BATCH, advance, load_timeline, timing_of
from pulse.store import queues as queue_store
from pulse.store import schedules as store

PUT_ACTION = "schedules.put"
PAUSE_ACTION = "schedules.pause"
RESUME_ACTION = "schedules.resume"
EVENT_PUBLISHED = "schedule.published"
EVENT_PAUSED = "schedule.paused"
EVENT_RESUMED = "schedule.resumed"
OUTCOMES = ("created", "skipped")
#: Pause catches up in at most this many transactions before pausing anyway.
_PAUSE_ROUNDS = 1000



class ScheduleNotFound(NotFound, PulseError):
    """The schedule does not exist in this namespace (or the caller may not see it)."""

    def __init__(self) -> None:
        super().__init__("schedule")




@dataclass(frozen=True)
class PutResult:
    """Outcome of :func:`put_schedule`: the schedule view and whether it was created (201)."""

    schedule: dict[str, Any]
    created: bool

    @property
    def revision(self) -> int:
        return int(self.schedule["revision"])



async def _view(tx: Tx, row: dict[str, Any], now: datetime) -> dict[str, Any]:
    version = await store.version_get(
        tx, row["namespace_id"], row["id"], int(row["current_version"])
    )
    assert version is not None, "the current version exists"
    return schedule_view(row, version, now)


async def _visible_row(
    tx: Tx,
    namespace_id: bytes,
    name: str,
    allowed_queues: frozenset[str] | None,
    *,
    for_update: bool = False,
) -> dict[str, Any]:
    row = await store.schedule_get_by_name(tx, namespace_id, name, for_update=for_update)
    if row is None:
        raise ScheduleNotFound()
    if allowed_queues is not None:
        version = await store.version_get(tx, namespace_id, row["id"], int(row["current_version"]))
        if version is None or version["queue_name"] not in allowed_queues:
            raise ScheduleNotFound()
    return row


# ------------------------------------------------------------------------------ publish


async def put_schedule(
    db: Database,
    namespace_id: bytes,
    owner_id: bytes,
    name: str,
    body: SchedulePut,
    *,
    pre: Preconditions | None = None,
    actor: Actor | None = None,
    request_id: str | None = None,
    allowed_queues: frozenset[str] | None = None,
    now: datetime | None = None,
) -> PutResult:
    """Create schedule ``name`` (version 1, 201) or publish a new version of it (200).

    ``owner_id`` owns a new schedule and every task it creates (an update keeps the owner).
    Raises 400 (invalid body), 404 (unknown queue, or a schedule of a queue the key may not
    use), 412 (If-Match / If-None-Match). An identical PUT changes nothing (200).
    """
    pre = pre or Preconditions()
    fields = version_fields(body)

    async def run(tx: Tx) -> PutResult:
        stamp = await clock_now(tx, now)
        row = await store.schedule_get_by_name(tx, namespace_id, name, for_update=True)
        if row is not None and allowed_queues is not None:
            await _visible_row(tx, namespace_id, name, allowed_queues)
        # Shared lock: a queue delete waits for this publish (and then sees the schedule).
        if await queue_store.queue_get_by_name(tx, namespace_id, body.queue, shared=True) is None:
            raise QueueNotFound()
        if row is None:
            pre.check(None)
            created = await _create(tx, namespace_id, owner_id, name, fields, stamp)
            if created is not None:
                await _published(tx, created, 1, 201, actor, request_id, stamp)
                return PutResult(await _view(tx, created, stamp), True)
            row = await store.schedule_get_by_name(tx, namespace_id, name, for_update=True)
            assert row is not None, "the concurrent creator committed"
        pre.check(int(row["revision"]))
        current = await store.version_get(tx, namespace_id, row["id"], int(row["current_version"]))
        assert current is not None
        if _same_version(current, fields):
            return PutResult(await _view(tx, row, stamp), False)
        number = int(row["current_version"]) + 1
        published = max(stamp, row["covered_until"], current["created_at"])
        await store.version_insert(
            tx,
            {
                "namespace_id": namespace_id,
                "id": new_id(),
                "schedule_id": row["id"],
                "version": number,
                "created_at": published,
                **fields,
            },
        )
        loaded = await load_timeline(tx, namespace_id, row["id"], row["covered_until"])
        ok = await store.schedule_publish_if_revision(
            tx,
            {
                "namespace_id": namespace_id,
                "id": row["id"],
                "revision": row["revision"],
                "version": number,
                "check_at": loaded.next_fire(row["covered_until"]),
                "now": stamp,
            },
        )
        assert ok, "the schedule row is locked FOR UPDATE"
        after = await store.schedule_get_by_name(tx, namespace_id, name)
        assert after is not None
        await _published(tx, after, number, 200, actor, request_id, stamp)
        return PutResult(await _view(tx, after, stamp), False)

    return await db.transaction(run)


async def _create(
    tx: Tx,
    namespace_id: bytes,
    owner_id: bytes,
    name: str,
    fields: dict[str, Any],
    stamp: datetime,
) -> dict[str, Any] | None:
    """Insert schedule + version 1 (covered from the publish time on); None when a concurrent
    PUT created the name first."""
    schedule_id = new_id()
    version = {
        "namespace_id": namespace_id,
        "id": new_id(),
        "schedule_id": schedule_id,
        "version": 1,
        "created_at": stamp,
        **fields,
    }
    try:
        await store.schedule_insert(
            tx,
            {
                "namespace_id": namespace_id,
                "id": schedule_id,
                "name": name,
                "owner_id": owner_id,
                "check_at": timing_of(version).next_fire(stamp),
                "covered_until": stamp,
                "now": stamp,
            },
        )
    except DuplicateKey as exc:
        if exc.key != store.NAME_INDEX:
            raise
        return None
    await store.version_insert(tx, version)
    row = await store.schedule_get_by_name(tx, namespace_id, name)
    assert row is not None
    return row


async def _published(
    tx: Tx,
    row: dict[str, Any],
    version: int,
    status: int,
    actor: Actor | None,
    request_id: str | None,
    stamp: datetime,
) -> None:
    ns = row["namespace_id"]
    await orbit_events.append_event(
        tx, ns, EVENT_PUBLISHED, "schedule", row["id"],
        {"name": row["name"], "version": version, "revision": int(row["revision"])},
        request_id, now=stamp,
    )  # fmt: skip
    await audit.record(
        tx, actor=actor, action=PUT_ACTION, resource_kind="schedule", resource_id=row["name"],
        status_code=status, namespace_id=ns, request_id=request_id,
        details={"version": version, "revision": int(row["revision"])}, now=stamp,
    )  # fmt: skip


# ------------------------------------------------------------------------------ reads


async def get_schedule(
    db: Database,
    namespace_id: bytes,
    name: str,
    *,
    allowed_queues: frozenset[str] | None = None,
    now: datetime | None = None,
) -> dict[str, Any]:
    """The schedule view; 404 when absent (or of a queue the key may not use)."""

    async def run(tx: Tx) -> dict[str, Any]:
        stamp = await clock_now(tx, now)
        row = await _visible_row(tx, namespace_id, name, allowed_queues)
        return await _view(tx, row, stamp)

    return await db.read(run)


async def list_schedules(
    db: Database,
    namespace_id: bytes,
    *,
    limit: int = 50,
    cursor: str | None = None,
    allowed_queues: frozenset[str] | None = None,
    now: datetime | None = None,
) -> dict[str, Any]:
    """Schedules by name: ``{"items", "next_cursor"}`` (additive route)."""
    position = decode_cursor(cursor, {"list": "schedules"})
    after = str(position.get("n", "")) if position else ""

    async def run(tx: Tx) -> dict[str, Any]:
        stamp = await clock_now(tx, now)
        rows = await store.schedule_list_after(tx, namespace_id, after, limit + 1)
        more = len(rows) > limit
        rows = rows[:limit]
        items = []
        for row in rows:
            view = await _view(tx, row, stamp)
            if allowed_queues is None or view["queue"] in allowed_queues:
                items.append(view)
        nxt = encode_cursor({"n": rows[-1]["name"]}, {"list": "schedules"}) if more else None
        return {"items": items, "next_cursor": nxt}

    return await db.read(run)


async def list_occurrences(
    db: Database,
    namespace_id: bytes,
    name: str,
    *,
    limit: int = 50,
    cursor: str | None = None,
    outcome: str | None = None,
    allowed_queues: frozenset[str] | None = None,
) -> dict[str, Any]:
    """Occurrences of schedule ``name``, newest fire time first: ``{"items", "next_cursor"}``.
    ``outcome`` filters (``created`` / ``skipped``); a cursor is bound to its filters."""
    if outcome is not None and outcome not in OUTCOMES:
        raise InvalidRequest("outcome must be created or skipped", field="outcome")
    filters = {"schedule": name, "outcome": outcome}
    position = decode_cursor(cursor, filters)
    before, before_id = datetime.max, b""
    if position is not None:
        try:
            before = parse_time(str(position.get("before")))
            before_id = bytes.fromhex(str(position.get("id", "")))
        except ValueError:
            raise InvalidRequest("cursor is not valid", field="cursor") from None

    async def run(tx: Tx) -> dict[str, Any]:
        row = await _visible_row(tx, namespace_id, name, allowed_queues)
        rows = await store.occurrence_list_before(
            tx, namespace_id, row["id"], before, outcome, limit + 1, before_id
        )
        more = len(rows) > limit
        rows = rows[:limit]
        nxt = None
        if more:
            last = rows[-1]
            nxt = encode_cursor(
                {"before": format_time(last["fire_at"]), "id": last["id"].hex()}, filters
            )
        return {"items": [occurrence_view(r) for r in rows], "next_cursor": nxt}

    return await db.read(run)


# ------------------------------------------------------------------------------ pause


async def pause_schedule(
    db: Database,
    namespace_id: bytes,
    name: str,
    *,
    actor: Actor | None = None,
    request_id: str | None = None,
    allowed_queues: frozenset[str] | None = None,
    now: datetime | None = None,
) -> dict[str, Any]:
    """Pause: fire what is already due (catch-up and grace rules, bounded transactions),
    then stop. Idempotent (pausing a paused schedule changes nothing)."""
    for _ in range(_PAUSE_ROUNDS):

        async def run(tx: Tx) -> dict[str, Any] | None:
            row = await _visible_row(tx, namespace_id, name, allowed_queues, for_update=True)
            stamp = await clock_now(tx, now)
            if row["paused"]:
                return await _view(tx, row, stamp)
            adv = await advance(tx, row, stamp, limit=DEFAULT_BATCH, request_id=request_id)
            if not adv.caught_up and not adv.deferred:
                return None  # commit this batch, go on in a fresh transaction
            return await _set_paused(
                tx, row, True, adv.covered_until, adv.check_at, actor, request_id, stamp
            )

        view = await db.transaction(run)
        if view is not None:
            return view
    raise RuntimeError("pause did not catch up")  # pragma: no cover - 100 000 occurrences


async def resume_schedule(
    db: Database,
    namespace_id: bytes,
    name: str,
    *,
    actor: Actor | None = None,
    request_id: str | None = None,
    allowed_queues: frozenset[str] | None = None,
    now: datetime | None = None,
) -> dict[str, Any]:
    """Resume: every fire time since the schedule was paused (from ``covered_until`` up to
    now) is recorded as skipped (reason ``paused``, one row per version segment); firing
    continues after now. Idempotent."""

    async def run(tx: Tx) -> dict[str, Any]:
        row = await _visible_row(tx, namespace_id, name, allowed_queues, for_update=True)
        stamp = await clock_now(tx, now)
        if not row["paused"]:
            return await _view(tx, row, stamp)
        current = dict(row)
        while True:  # one skipped row per version segment; more than one load of versions
            adv = await advance(tx, current, stamp, skip_all="paused", request_id=request_id)
            if adv.caught_up or adv.covered_until <= current["covered_until"]:
                break
            current = {**current, "covered_until": adv.covered_until, "check_at": adv.check_at}
        return await _set_paused(
            tx, row, False, adv.covered_until, adv.check_at, actor, request_id, stamp
        )

    return await db.transaction(run)


async def _set_paused(
    tx: Tx,
    row: dict[str, Any],
    paused: bool,
    covered_until: datetime,
    check_at: datetime | None,
    actor: Actor | None,
    request_id: str | None,
    stamp: datetime,
) -> dict[str, Any]:
    ns = row["namespace_id"]
    ok = await store.schedule_set_paused_if_control(
        tx,
        {
            "namespace_id": ns,
            "id": row["id"],
            "control_revision": row["control_revision"],
            "paused": int(paused),
            "covered_until": covered_until,
            "check_at": check_at,
            "now": stamp,
        },
    )
    assert ok, "the schedule row is locked FOR UPDATE"
    after = await store.schedule_get_by_name(tx, ns, row["name"])
    assert after is not None
    control = int(after["control_revision"])
    await orbit_events.append_event(
        tx, ns, EVENT_PAUSED if paused else EVENT_RESUMED, "schedule", row["id"],
        {"name": row["name"], "control_revision": control}, request_id, now=stamp,
    )  # fmt: skip
    await audit.record(
        tx, actor=actor, action=PAUSE_ACTION if paused else RESUME_ACTION,
        resource_kind="schedule", resource_id=row["name"], namespace_id=ns,
        request_id=request_id, details={"control_revision": control}, now=stamp,
    )  # fmt: skip
    return await _view(tx, after, stamp)


__all__ = [
    "DEFAULT_CATCHUP_MS",
    "DEFAULT_GRACE_MS",
    "PutResult",
    "ScheduleNotFound",
    "SchedulePut",
    "ScheduleTask",
    "get_schedule",
    "list_occurrences",
    "list_schedules",
    "occurrence_view",
    "pause_schedule",
    "put_schedule",
    "resume_schedule",
    "schedule_view",
    "version_fields",
    "version_view",
]
