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
from typing import Annotated, Any, Literal

import msgspec
from msgspec import Meta

from orbit import audit
from orbit import events as orbit_events
from orbit.audit import Actor
from orbit.business_json import check_json_text
from orbit.errors import InvalidRequest, NotFound
from orbit.ids import id_hex, new_id
from orbit.pagination import decode_cursor, encode_cursor
from orbit.preconditions import Preconditions
from orbit.storage import Database, DuplicateKey, Tx
from orbit.store.clock import clock_now
from orbit.times import Time, format_opt, format_time, parse_time
from pulse.cron import CronError, local_text, make_timing, tzdata_version
from pulse.errors import PulseError, QueueNotFound
from pulse.scheduler import DEFAULT_BATCH, advance, load_timeline, render_dedup_key, timing_of
from pulse.store import queues as queue_store
from pulse.store import schedules as store
from pulse.types import NO_TRAILING_SPACE, Name

#: Defaults of a PUT body (docs/api/schedules.md).
DEFAULT_GRACE_MS = 60_000
DEFAULT_CATCHUP_MS = 3_600_000
_MAX_MS = 10 * 366 * 86_400_000

PUT_ACTION = "schedules.put"
PAUSE_ACTION = "schedules.pause"
RESUME_ACTION = "schedules.resume"
EVENT_PUBLISHED = "schedule.published"
EVENT_PAUSED = "schedule.paused"
EVENT_RESUMED = "schedule.resumed"
OUTCOMES = ("created", "skipped")
#: Pause catches up in at most this many transactions before pausing anyway.
_PAUSE_ROUNDS = 1000

Ms = Annotated[int, Meta(ge=0, le=_MAX_MS)]
#: What a fire time does while the schedule's previous run is unfinished
#: (:mod:`pulse.schedule_overlap`).
Overlap = Literal["allow", "skip", "buffer_one", "cancel_previous"]


class ScheduleNotFound(NotFound, PulseError):
    """The schedule does not exist in this namespace (or the caller may not see it)."""

    def __init__(self) -> None:
        super().__init__("schedule")


class ScheduleTask(msgspec.Struct, forbid_unknown_fields=True, kw_only=True):
    """The task template of a schedule version (``task`` of a PUT body)."""

    kind: Annotated[str, Meta(min_length=1, max_length=255, extra_json_schema=NO_TRAILING_SPACE)]
    payload: msgspec.Raw = msgspec.field(default_factory=lambda: msgspec.Raw(b"null"))
    priority: Annotated[int, Meta(ge=0, le=9)] = 0
    pipeline_version: Annotated[str, Meta(max_length=64, extra_json_schema=NO_TRAILING_SPACE)] = ""
    #: Dedup rule (additive): a template with ``{schedule}``, ``{fire_at}``,
    #: ``{fire_at_local}``, ``{version}``; None = no de-duplication beyond the occurrence.
    dedup_key: (
        Annotated[str, Meta(min_length=1, max_length=255, extra_json_schema=NO_TRAILING_SPACE)]
        | None
    ) = None
    max_attempts: Annotated[int, Meta(ge=1, le=1000)] | None = None
    retry_safe: bool = False
    #: Deadline of each task, counted from its fire time (additive).
    deadline_ms: Annotated[int, Meta(ge=1, le=_MAX_MS)] | None = None


class SchedulePut(msgspec.Struct, forbid_unknown_fields=True, kw_only=True):
    """``PUT /v1/namespaces/{ns}/schedules/{name}``: the whole new version."""

    queue: Name
    task: ScheduleTask
    cron: Annotated[str, Meta(min_length=1, max_length=255)] | None = None
    every_ms: Annotated[int, Meta(ge=1000, le=_MAX_MS)] | None = None
    timezone: Annotated[str, Meta(min_length=1, max_length=64)] = "UTC"
    catchup_window_ms: Ms = DEFAULT_CATCHUP_MS
    grace_ms: Ms = DEFAULT_GRACE_MS
    start_at: Time | None = None
    end_at: Time | None = None
    overlap: Overlap = "allow"


@dataclass(frozen=True)
class PutResult:
    """Outcome of :func:`put_schedule`: the schedule view and whether it was created (201)."""

    schedule: dict[str, Any]
    created: bool

    @property
    def revision(self) -> int:
        return int(self.schedule["revision"])


# ------------------------------------------------------------------------------ validation

_SAMPLE_FIRE = datetime(2000, 12, 31, 23, 59, 59, 999999)


def _time(value: str | None, field: str) -> datetime | None:
    if value is None:
        return None
    try:
        return parse_time(value)
    except ValueError as exc:
        raise InvalidRequest(f"{field}: {exc}", field=field) from None


def _no_trailing_space(value: str | None, field: str) -> None:
    # utf8mb4_bin pads with spaces: "a" and "a " would be the same task identity.
    if value is not None and value.endswith(" "):
        raise InvalidRequest(f"{field} must not end with a space", field=field)


def version_fields(body: SchedulePut) -> dict[str, Any]:
    """The stored fields of the version ``body`` describes (400 naming the field when
    invalid). Builds the fire-time computation once, so a version that is stored can
    always be computed."""
    task = body.task
    payload = check_json_text(bytes(task.payload), "task.payload")
    _no_trailing_space(task.kind, "task.kind")
    _no_trailing_space(task.pipeline_version, "task.pipeline_version")
    _no_trailing_space(task.dedup_key, "task.dedup_key")
    start_at = _time(body.start_at, "start_at")
    end_at = _time(body.end_at, "end_at")
    try:
        make_timing(
            cron=body.cron,
            every_ms=body.every_ms,
            timezone=body.timezone,
            start_at=start_at,
            end_at=end_at,
        )
    except CronError as exc:
        raise InvalidRequest(str(exc), field=exc.field) from None
    if task.dedup_key is not None:
        widest = render_dedup_key(
            task.dedup_key, schedule="n" * 63, fire_at=_SAMPLE_FIRE,
            local="2000-12-31T23:59:59.999999+14:00", version=4_294_967_295,
        )  # fmt: skip
        if len(widest) > 255:
            raise InvalidRequest(
                "task.dedup_key can render longer than 255 characters", field="task.dedup_key"
            )
    options = {
        k: v
        for k, v in (
            ("dedup_key", task.dedup_key),
            ("max_attempts", task.max_attempts),
            ("retry_safe", task.retry_safe or None),
            ("deadline_ms", task.deadline_ms),
        )
        if v is not None
    }
    return {
        "queue_name": body.queue,
        "cron": None if body.cron is None else " ".join(body.cron.split()),
        "every_ms": body.every_ms,
        "timezone": body.timezone,
        "tzdata_version": tzdata_version(),
        "task_kind": task.kind,
        "task_payload": payload,
        "task_priority": task.priority,
        "task_pipeline_version": task.pipeline_version,
        "task_options": msgspec.json.encode(options, order="sorted").decode() if options else None,
        "catchup_window_ms": body.catchup_window_ms,
        "grace_ms": body.grace_ms,
        "start_at": start_at,
        "end_at": end_at,
        "overlap": body.overlap,
    }


def _decoded_options(value: Any) -> dict[str, Any]:
    if value is None:
        return {}
    if isinstance(value, (str, bytes)):
        out = msgspec.json.decode(value)
        return out if isinstance(out, dict) else {}
    return dict(value)


def _same_version(stored: dict[str, Any], fields: dict[str, Any]) -> bool:
    for key, value in fields.items():
        old = stored[key]
        if key == "task_options":
            if _decoded_options(old) != _decoded_options(value):
                return False
        elif key in ("every_ms", "task_priority", "catchup_window_ms", "grace_ms"):
            if (None if old is None else int(old)) != value:
                return False
        elif old != value:
            return False
    return True


# ------------------------------------------------------------------------------ views


def version_view(version: dict[str, Any]) -> dict[str, Any]:
    """The configuration of a version as the API shows it."""
    opts = _decoded_options(version["task_options"])
    return {
        "version": int(version["version"]),
        "queue": version["queue_name"],
        "cron": version["cron"],
        "every_ms": None if version["every_ms"] is None else int(version["every_ms"]),
        "timezone": version["timezone"],
        "tzdata_version": version["tzdata_version"],
        "task": {
            "kind": version["task_kind"],
            "payload": msgspec.Raw(version["task_payload"].encode("utf-8")),
            "priority": int(version["task_priority"]),
            "pipeline_version": version["task_pipeline_version"],
            "dedup_key": opts.get("dedup_key"),
            "max_attempts": opts.get("max_attempts"),
            "retry_safe": bool(opts.get("retry_safe", False)),
            "deadline_ms": opts.get("deadline_ms"),
        },
        "catchup_window_ms": int(version["catchup_window_ms"]),
        "grace_ms": int(version["grace_ms"]),
        "start_at": format_opt(version["start_at"]),
        "end_at": format_opt(version["end_at"]),
        "overlap": version["overlap"],
        "published_at": format_time(version["created_at"]),
    }


def schedule_view(row: dict[str, Any], version: dict[str, Any], now: datetime) -> dict[str, Any]:
    """The API schedule object: identity, state, the current version's configuration, the
    next fire time (null when paused or finished) and ``covered_until``."""
    timing = timing_of(version)
    nxt = None
    if not row["paused"]:
        nxt = timing.next_fire(max(now, row["covered_until"], version["created_at"]))
    return {
        "id": id_hex(row["id"]),
        "name": row["name"],
        "owner_id": id_hex(row["owner_id"]),
        "revision": int(row["revision"]),
        "paused": bool(row["paused"]),
        "control_revision": int(row["control_revision"]),
        **version_view(version),
        "tzdata_current": tzdata_version(),
        "next_fire_at": format_opt(nxt),
        "next_fire_at_local": None if nxt is None else local_text(timing.zone, nxt),
        "covered_until": format_time(row["covered_until"]),
        "check_at": format_opt(row["check_at"]),
        "last_task_id": None if row["last_task_id"] is None else id_hex(row["last_task_id"]),
        "buffered_fire_at": format_opt(row["buffered_fire_at"]),
        "created_at": format_time(row["created_at"]),
        "updated_at": format_time(row["updated_at"]),
    }


def occurrence_view(row: dict[str, Any]) -> dict[str, Any]:
    """An occurrence as the API shows it."""
    return {
        "id": id_hex(row["id"]),
        "fire_at": format_time(row["fire_at"]),
        "fire_at_local": row["fire_at_local"],
        "version": int(row["version"]),
        "task_id": None if row["task_id"] is None else id_hex(row["task_id"]),
        "outcome": row["outcome"],
        "late": bool(row["late"]),
        "covered_until": format_opt(row["covered_until"]),
        "skipped_count": None if row["skipped_count"] is None else int(row["skipped_count"]),
        "reason": row["reason"],
        "origin": row["origin"],
        "idempotency_key": row["trigger_key"],
        "created_at": format_time(row["created_at"]),
    }


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
