"""Advancing one schedule in the caller's transaction: its versions as a time line, and
for every due fire time the occurrence, its task and its event, or one skipped range
(:func:`advance`; the rules are in :mod:`pulse.scheduler`, which runs it in a loop)."""

from __future__ import annotations

import functools
import logging
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import TYPE_CHECKING, Any

import msgspec

from orbit import events as orbit_events
from orbit.ids import id_hex, new_id
from orbit.storage import Tx
from orbit.times import format_time
from pulse import schedule_overlap, transitions
from pulse.cron import (
    ONE_US,
    CronTiming,
    IntervalTiming,
    Segment,
    Timeline,
    local_text,
    make_timing,
)
from pulse.schedule_overlap import Decision, OverlapState
from pulse.store import queues as queue_store
from pulse.store import schedules as store
from pulse.submit import submit_in_tx
from pulse.types import TaskSubmit

if TYPE_CHECKING:
    pass


log = logging.getLogger("pulse.scheduler")

#: Occurrences written per transaction (a skipped range counts as one).
DEFAULT_BATCH = 100
#: Versions loaded per step (a schedule republished more often than this between two steps
#: is caught up over several steps).
VERSION_WINDOW = 50
#: When a queue's quota refuses an occurrence's task: look again after this long.
DEFER_S = 1.0

EVENT_FIRED = "schedule.fired"
EVENT_SKIPPED = "schedule.skipped"

Clock = datetime | Callable[[], datetime] | None

_JSON = msgspec.json.Encoder()



# ------------------------------------------------------------------------------ time line


@functools.lru_cache(maxsize=1024)
def _timing(
    cron: str | None,
    every_ms: int | None,
    timezone: str,
    start_at: datetime | None,
    end_at: datetime | None,
) -> CronTiming | IntervalTiming:
    return make_timing(
        cron=cron, every_ms=every_ms, timezone=timezone, start_at=start_at, end_at=end_at
    )


def timing_of(version: dict[str, Any]) -> CronTiming | IntervalTiming:
    """The fire-time computation of a stored version row."""
    every = version["every_ms"]
    return _timing(
        version["cron"],
        None if every is None else int(every),
        version["timezone"],
        version["start_at"],
        version["end_at"],
    )


@dataclass
class LoadedTimeline:
    """The versions governing fire times from some instant on, as a :class:`Timeline`.

    ``horizon``: when more versions exist than were loaded, the publish time of the first
    one not fully loaded — nothing at or after it may be decided from this load.
    """

    versions: dict[int, dict[str, Any]]
    line: Timeline
    horizon: datetime | None

    def next_fire(self, t: datetime) -> datetime | None:
        nxt = self.line.next_fire(t)
        value = None if nxt is None else nxt[0]
        if self.horizon is not None:
            value = self.horizon if value is None else min(value, self.horizon)
        return value


async def load_timeline(
    tx: Tx, namespace_id: bytes, schedule_id: bytes, at: datetime
) -> LoadedTimeline:
    """The versions governing fire times ``>= at`` (the one in force at ``at`` and all later
    ones, up to :data:`VERSION_WINDOW`)."""
    first = await store.version_at(tx, namespace_id, schedule_id, at)
    rows = await store.version_list_from(tx, namespace_id, schedule_id, first, VERSION_WINDOW + 1)
    horizon = rows[VERSION_WINDOW]["created_at"] if len(rows) > VERSION_WINDOW else None
    line = Timeline.of([(int(r["version"]), r["created_at"], timing_of(r)) for r in rows])
    return LoadedTimeline({int(r["version"]): r for r in rows}, line, horizon)


# ------------------------------------------------------------------------------ advancing


@dataclass
class Advance:
    """What one :func:`advance` wrote."""

    covered_until: datetime
    check_at: datetime | None
    fired: int = 0  # occurrences with a task (created or deduplicated)
    late: int = 0  # of those, fired later than grace
    skipped_rows: int = 0  # skipped occurrence rows (ranges or single times)
    skipped_times: int = 0  # fire times those rows cover
    deferred: bool = False  # a quota refusal stopped this round; retried after DEFER_S
    caught_up: bool = False  # every fire time <= now is handled
    new_work: set[bytes] = field(default_factory=set)  # queue ids that got tasks
    #: (task id, attempt id) of running previous runs asked to cancel (cancel_previous):
    #: after COMMIT, the hub pushes the cancel to their workers.
    cancel_requested: list[tuple[bytes, bytes]] = field(default_factory=list)


def _options(version: dict[str, Any]) -> dict[str, Any]:
    raw = version["task_options"]
    if raw is None:
        return {}
    if isinstance(raw, (bytes, str)):
        decoded = msgspec.json.decode(raw)
        return decoded if isinstance(decoded, dict) else {}
    return dict(raw)


def render_dedup_key(
    template: str, *, schedule: str, fire_at: datetime, local: str, version: int
) -> str:
    """Fill ``{schedule}``, ``{fire_at}`` (UTC, RFC 3339), ``{fire_at_local}`` and
    ``{version}`` into a task template's ``dedup_key``."""
    return (
        template.replace("{schedule}", schedule)
        .replace("{fire_at}", format_time(fire_at))
        .replace("{fire_at_local}", local)
        .replace("{version}", str(version))
    )


def task_item(
    schedule: dict[str, Any], version: dict[str, Any], fire_at: datetime, local: str
) -> TaskSubmit:
    """The task an occurrence of ``version`` at ``fire_at`` submits (available at its fire
    time, so a late occurrence keeps its place in dispatch order)."""
    opts = _options(version)
    dedup = opts.get("dedup_key")
    deadline_ms = opts.get("deadline_ms")
    return TaskSubmit(
        queue=version["queue_name"],
        kind=version["task_kind"],
        pipeline_version=version["task_pipeline_version"],
        dedup_key=None
        if dedup is None
        else render_dedup_key(
            str(dedup),
            schedule=schedule["name"],
            fire_at=fire_at,
            local=local,
            version=int(version["version"]),
        ),
        payload=msgspec.Raw(version["task_payload"].encode("utf-8")),
        priority=int(version["task_priority"]),
        available_at=format_time(fire_at),
        deadline_at=None
        if deadline_ms is None
        else format_time(fire_at + timedelta(milliseconds=int(deadline_ms))),
        max_attempts=opts.get("max_attempts"),
        retry_safe=bool(opts.get("retry_safe", False)),
    )


def occurrence_row(
    schedule: dict[str, Any],
    occurrence_id: bytes,
    fire_at: datetime,
    local: str,
    version: int,
    now: datetime,
    *,
    task_id: bytes | None = None,
    late: bool = False,
    reason: str | None = None,
    skipped_until: datetime | None = None,
    skipped_count: int | None = None,
    origin: str = "schedule",
    trigger_key: str | None = None,
) -> dict[str, Any]:
    """The ``pulse_schedule_occurrences`` row of one fire time of ``schedule``: created
    (``task_id`` given) or skipped (``skipped_until`` / ``skipped_count``)."""
    return {
        "namespace_id": schedule["namespace_id"],
        "id": occurrence_id,
        "schedule_id": schedule["id"],
        "fire_at": fire_at,
        "fire_at_local": local,
        "version": version,
        "task_id": task_id,
        "outcome": "created" if task_id is not None else "skipped",
        "late": int(late),
        "covered_until": skipped_until,
        "skipped_count": skipped_count,
        "reason": reason,
        "origin": origin,
        "trigger_key": trigger_key,
        "created_at": now,
    }


class _Deferred(Exception):
    """Internal: the occurrence's task was refused by a quota; stop and retry later."""


async def _fire(
    tx: Tx,
    schedule: dict[str, Any],
    version: dict[str, Any],
    zone_text: str,
    fire_at: datetime,
    now: datetime,
    res: Advance,
    request_id: str | None,
    *,
    reason: str | None = None,
    origin: str = "schedule",
) -> dict[str, Any] | None:
    """Write one due fire time: its task (or the reason there is none), its occurrence row
    and its event; return the task row (None when skipped). Raises :class:`_Deferred`
    (nothing written) on a quota refusal. ``reason`` is recorded on a created occurrence
    (e.g. ``buffered``) unless the task was deduplicated."""
    ns, sid = schedule["namespace_id"], schedule["id"]
    occurrence_id = new_id()
    grace = timedelta(milliseconds=int(version["grace_ms"]))
    late = now - fire_at > grace
    [result] = await submit_in_tx(
        tx,
        ns,
        schedule["owner_id"],
        [task_item(schedule, version, fire_at, zone_text)],
        source_kind="schedule",
        source_id=occurrence_id,
        request_id=request_id,
        now=now,
    )
    task_id: bytes | None = None
    if result.status == 429:
        raise _Deferred()
    if result.status in (200, 201) and result.row is not None:
        outcome = "created"
        task_id = result.row["id"]
        reason = "deduplicated" if result.status == 200 else reason
        if result.status == 201:
            res.new_work.add(result.row["queue_id"])
        res.fired += 1
        res.late += int(late)
    else:
        outcome = "skipped"
        reason = "queue_not_found" if result.status == 404 else "invalid_task"
        res.skipped_rows += 1
        res.skipped_times += 1
    skipped = outcome != "created"
    await store.occurrence_insert(
        tx,
        occurrence_row(
            schedule, occurrence_id, fire_at, zone_text, int(version["version"]), now,
            task_id=task_id, late=late, reason=reason, origin=origin,
            skipped_until=fire_at + ONE_US if skipped else None,
            skipped_count=1 if skipped else None,
        ),
    )  # fmt: skip
    data: dict[str, Any] = {
        "occurrence_id": id_hex(occurrence_id),
        "fire_at": format_time(fire_at),
        "version": int(version["version"]),
        "outcome": outcome,
        "late": late,
    }
    if task_id is not None:
        data["task_id"] = id_hex(task_id)
    if reason is not None:
        data["reason"] = reason
    if origin != "schedule":
        data["origin"] = origin
    await orbit_events.append_event(
        tx,
        ns,
        EVENT_FIRED if outcome == "created" else EVENT_SKIPPED,
        "schedule",
        sid,
        data,
        request_id,
        now=now,
    )
    return None if outcome != "created" else result.row


async def _skip_range(
    tx: Tx,
    schedule: dict[str, Any],
    version: dict[str, Any],
    segment: Segment,
    first: datetime,
    until: datetime,
    reason: str,
    now: datetime,
    res: Advance,
    request_id: str | None,
) -> None:
    """One occurrence row for every fire time of ``segment`` in ``[first, until)``."""
    ns, sid = schedule["namespace_id"], schedule["id"]
    count = min(segment.timing.count(first, until), 2**32 - 1)
    occurrence_id = new_id()
    await store.occurrence_insert(
        tx,
        occurrence_row(
            schedule, occurrence_id, first, local_text(segment.timing.zone, first),
            segment.version, now, reason=reason, skipped_until=until, skipped_count=count,
        ),
    )  # fmt: skip
    await orbit_events.append_event(
        tx,
        ns,
        EVENT_SKIPPED,
        "schedule",
        sid,
        {
            "occurrence_id": id_hex(occurrence_id),
            "fire_at": format_time(first),
            "covered_until": format_time(until),
            "skipped_count": count,
            "version": segment.version,
            "reason": reason,
        },
        request_id,
        now=now,
    )
    res.skipped_rows += 1
    res.skipped_times += count


async def advance(
    tx: Tx,
    schedule: dict[str, Any],
    now: datetime,
    *,
    limit: int = DEFAULT_BATCH,
    skip_all: str | None = None,
    request_id: str | None = None,
) -> Advance:
    """Handle the fire times of the LOCKED ``schedule`` row from ``covered_until`` up to and
    including ``now`` (module docstring), then record ``covered_until`` / ``check_at`` and
    the overlap state.

    ``skip_all``: record every such fire time as skipped with this reason (resume after a
    pause) instead of applying catch-up, grace and the overlap policy. Writes at most
    ``limit`` occurrences; :attr:`Advance.caught_up` tells whether it got to ``now``. A
    fire time the overlap policy held back (``buffer_one``) fires first once the previous
    run has finished (:mod:`pulse.schedule_overlap`).
    """
    ns, sid = schedule["namespace_id"], schedule["id"]
    covered: datetime = schedule["covered_until"]
    loaded = await load_timeline(tx, ns, sid, covered)
    overlap = await OverlapState.load(tx, schedule)
    stop = now + ONE_US
    if loaded.horizon is not None:
        stop = min(stop, loaded.horizon)
    res = Advance(covered_until=covered, check_at=schedule["check_at"])
    # Lock order (application resources → queues → tasks): one advance may fire under
    # versions that name different queues, or cancel a previous run of another queue; each
    # submit locks its own queue's usage row first, but after the first task that would
    # come too late — lock them all up front.
    names = sorted({str(v["queue_name"]) for v in loaded.versions.values()})
    extra = []
    if overlap.previous_unfinished and overlap.previous_queue_id is not None:
        extra = [overlap.previous_queue_id]
    if len(names) > 1 or extra:
        queue_ids = list(extra)
        for name in names:
            q = await queue_store.queue_get_by_name(tx, ns, name)
            if q is not None and q["id"] not in queue_ids:
                queue_ids.append(q["id"])
        if len(queue_ids) > 1:
            await transitions.lock_usage(tx, ns, queue_ids, [schedule["owner_id"]])
    produced = 0
    finished = True
    if skip_all is None and overlap.release_due():
        finished = await _release_buffer(tx, schedule, loaded, overlap, now, res, request_id)
        produced += int(finished)
    cursor = covered
    segments = loaded.line.segments_between(covered, stop) if finished else []
    for segment, seg_lo, seg_hi in segments:
        version = loaded.versions[segment.version]
        timing = segment.timing
        lo = max(seg_lo, cursor)
        if skip_all is not None:
            cutoff, reason = seg_hi, skip_all
        else:
            tolerance = max(int(version["grace_ms"]), int(version["catchup_window_ms"]))
            cutoff, reason = now - timedelta(milliseconds=tolerance), "outside_catchup"
        skip_hi = min(cutoff, seg_hi)
        if lo < skip_hi:
            first = timing.next_fire(lo)
            if first is not None and first < skip_hi:
                await _skip_range(
                    tx, schedule, version, segment, first, skip_hi, reason, now, res, request_id
                )
                produced += 1
            lo = skip_hi
        while lo < seg_hi:
            fire_at = timing.next_fire(lo)
            if fire_at is None or fire_at >= seg_hi:
                lo = seg_hi
                break
            if produced >= limit:
                finished = False
                break
            local = local_text(timing.zone, fire_at)
            policy = str(version["overlap"])
            decision = overlap.decide(policy)
            if decision is Decision.SKIP:
                await _skip_range(
                    tx, schedule, version, segment, fire_at, fire_at + ONE_US,
                    schedule_overlap.REASON_OVERLAP, now, res, request_id,
                )  # fmt: skip
            elif decision is Decision.BUFFER:
                overlap.buffer(fire_at, int(version["version"]))
            else:
                try:
                    task = await _fire(tx, schedule, version, local, fire_at, now, res, request_id)
                except _Deferred:
                    res.deferred = True
                    finished = False
                    break
                if task is not None:
                    overlap.fired(policy, task)
            produced += 1
            lo = fire_at + ONE_US
        cursor = lo
        if not finished:
            break
    if finished:
        cursor = max(cursor, stop)
    res.caught_up = finished and loaded.horizon is None
    res.covered_until = cursor
    if res.deferred:
        res.check_at = now + timedelta(seconds=DEFER_S)
    else:
        res.check_at = overlap.check_at(loaded.next_fire(cursor), now)
    ok = await store.schedule_progress_if_covered(
        tx, ns, sid, covered, cursor, res.check_at,
        last_task_id=overlap.previous_id,
        buffered_fire_at=overlap.buffered_fire_at,
        buffered_version=overlap.buffered_version,
    )  # fmt: skip
    assert ok, "the schedule row is locked by this transaction"
    if overlap.cancel:
        # Last write of the step: cancel_in_tx ends with the result stream (lock order).
        from pulse.tasks import cancel_in_tx

        res.cancel_requested = await cancel_in_tx(
            tx, ns, overlap.cancel, request_id=request_id, now=now
        )
    return res


async def _release_buffer(
    tx: Tx,
    schedule: dict[str, Any],
    loaded: LoadedTimeline,
    overlap: OverlapState,
    now: datetime,
    res: Advance,
    request_id: str | None,
) -> bool:
    """Fire the held-back fire time (its previous run has finished). False when a quota
    refused its task (it stays held back; the step stops)."""
    assert overlap.buffered_fire_at is not None and overlap.buffered_version is not None
    number = overlap.buffered_version
    version = loaded.versions.get(number)
    if version is None:
        version = await store.version_get(tx, schedule["namespace_id"], schedule["id"], number)
    assert version is not None, "versions are never deleted"
    fire_at = overlap.buffered_fire_at
    local = local_text(timing_of(version).zone, fire_at)
    try:
        task = await _fire(
            tx, schedule, version, local, fire_at, now, res, request_id,
            reason=schedule_overlap.REASON_BUFFERED,
        )  # fmt: skip
    except _Deferred:
        res.deferred = True
        return False
    overlap.released()
    if task is not None:
        overlap.fired(str(version["overlap"]), task)
    return True
