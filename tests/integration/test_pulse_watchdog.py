"""The stuck-work watchdog against the real database: a task past its queue's bound is
surfaced once per state episode (mark, reason, one ``task.stuck`` event, metric), even with
two watchdogs racing; it is surfaced again after a state change once a new bound passes; its
state, state_version and revision never change; queues without a bound and terminal tasks are
never surfaced; the ``stuck`` list filter; the queue GET's usage (counters, denials, stuck).

Time passes by shifting a task's own timestamps back (``elapse``), so every decision still
uses the database clock, as in production."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest
from event_rows import raw_events
from pulse_fixtures import Tenant, force_state

from orbit.errors import InvalidRequest
from orbit.ids import id_hex
from orbit.metrics import Registry
from orbit.storage import Database, Tx
from pulse import queues, tasks, transitions
from pulse.types import QueuePut, TaskListFilters
from pulse.watchdog import Watchdog, WatchdogSettings, surface_queue

BOUND_MS = 60_000


async def elapse(db: Database, t: Tenant, task_id: str, seconds: float) -> None:
    """Move the task's history ``seconds`` into the past (as if the clock had advanced)."""

    async def run(tx: Tx) -> None:
        await tx.execute(
            "UPDATE pulse_tasks SET"
            " state_changed_at = state_changed_at - INTERVAL %s MICROSECOND,"
            " created_at = created_at - INTERVAL %s MICROSECOND,"
            " stuck_at = stuck_at - INTERVAL %s MICROSECOND"
            " WHERE namespace_id = %s AND id = %s",
            (*(int(seconds * 1e6),) * 3, t.namespace_id, bytes.fromhex(task_id)),
        )

    await db.transaction(run)


async def stuck_events(db: Database, t: Tenant, task_id: str) -> list[dict[str, Any]]:
    async def run(tx: Tx) -> list[dict[str, Any]]:
        return await raw_events(
            tx, t.namespace_id, type=transitions.EVENT_STUCK, subject_id=bytes.fromhex(task_id)
        )

    rows = await db.read(run)
    return [{"type": r["type"], "data": transitions.json_value(r["data"])} for r in rows]


async def result_event_count(db: Database, t: Tenant) -> int:
    async def run(tx: Tx) -> int:
        return int(
            await tx.fetchval(
                "SELECT COUNT(*) FROM orbit_result_events WHERE namespace_id = %s",
                (t.namespace_id,),
            )
        )

    return await db.read(run)


async def surface(db: Database, t: Tenant, queue: str | None = None, **kw: Any) -> list[Any]:
    queue_id = t.queues[queue or t.queue]
    return await surface_queue(db, t.namespace_id, queue_id, BOUND_MS, **kw)


async def test_surfaced_once_per_episode_then_again_after_a_state_change(db, tenant) -> None:
    t = await tenant(stuck_after_ms=BOUND_MS)
    task = await t.submit()
    tid = task["id"]
    results_before = await result_event_count(db, t)

    await elapse(db, t, tid, 30)
    assert await surface(db, t) == []  # 30 s < 60 s
    await elapse(db, t, tid, 31)
    [hit] = await surface(db, t)
    assert hit["state"] == "WAITING" and id_hex(hit["id"]) == tid
    view = await tasks.get_task(db, t.namespace_id, tid)
    assert view["stuck_at"] is not None
    assert view["stuck_reason"] == (
        f"WAITING for 61 s > stuck_after_ms {BOUND_MS} on queue default: no live worker session"
        " takes work from queue default"
    )
    # An observation, not a change: same state, state_version and revision.
    assert view["state"] == "WAITING"
    assert (view["state_version"], view["revision"]) == (task["state_version"], task["revision"])
    [event] = await stuck_events(db, t, tid)
    assert event["data"]["state"] == "WAITING" and event["data"]["queue"] == "default"
    assert event["data"]["reason"] == view["stuck_reason"]
    assert event["data"]["stuck_after_ms"] == BOUND_MS and event["data"]["age_ms"] >= 61_000
    assert event["data"]["state_version"] == task["state_version"]

    # Same episode: never again, however long it lasts.
    await elapse(db, t, tid, 600)
    assert await surface(db, t) == []
    assert len(await stuck_events(db, t, tid)) == 1

    # A state change starts a new episode: not stuck any more, surfaced again only after a
    # whole new bound.
    leased = await force_state(db, t, tid, "LEASED")
    view = await tasks.get_task(db, t.namespace_id, tid)
    assert view["state"] == "LEASED" and view["stuck_at"] is None and view["stuck_reason"] is None
    assert await surface(db, t) == []
    await elapse(db, t, tid, 59)
    assert await surface(db, t) == []
    await elapse(db, t, tid, 2)
    [hit] = await surface(db, t)
    assert hit["state"] == "LEASED"
    view = await tasks.get_task(db, t.namespace_id, tid)
    assert view["state"] == "LEASED" and view["stuck_reason"].startswith("LEASED for 61 s")
    events = await stuck_events(db, t, tid)
    assert [e["data"]["state"] for e in events] == ["WAITING", "LEASED"]
    assert events[1]["data"]["attempt_id"] == leased["attempt_id"]
    # No result event was ever written by the watchdog.
    assert await result_event_count(db, t) == results_before


async def test_state_change_racing_the_mark_starts_a_new_episode(db, tenant) -> None:
    """A state change whose transaction read the clock before the mark and wrote after it
    leaves state_changed_at a little older than stuck_at: the new state still makes it a new,
    unsurfaced episode (the reason names the state it was written for)."""
    t = await tenant(stuck_after_ms=BOUND_MS)
    tid = (await t.submit())["id"]
    await elapse(db, t, tid, 61)
    assert len(await surface(db, t)) == 1
    await force_state(db, t, tid, "LEASED")

    async def late_clock(tx: Tx) -> None:
        await tx.execute(
            "UPDATE pulse_tasks SET state_changed_at = stuck_at - INTERVAL 1 MICROSECOND"
            " WHERE namespace_id = %s AND id = %s",
            (t.namespace_id, bytes.fromhex(tid)),
        )

    await db.transaction(late_clock)
    view = await tasks.get_task(db, t.namespace_id, tid)
    assert view["state"] == "LEASED" and view["stuck_at"] is None
    page = await tasks.list_tasks(db, t.namespace_id, TaskListFilters(), stuck=True)
    assert tid not in [i["id"] for i in page["items"]]
    assert (await queues.get_queue(db, t.namespace_id, "default"))["usage"]["stuck_tasks"] == 0
    await elapse(db, t, tid, 61)
    [hit] = await surface(db, t)
    assert hit["state"] == "LEASED"
    assert [e["data"]["state"] for e in await stuck_events(db, t, tid)] == ["WAITING", "LEASED"]


async def test_running_and_needs_review_are_watched(db, tenant) -> None:
    t = await tenant(stuck_after_ms=BOUND_MS)
    running = (await t.submit())["id"]
    review = (await t.submit())["id"]
    attempt = (await force_state(db, t, running, "RUNNING"))["attempt_id"]
    await force_state(db, t, review, "NEEDS_REVIEW")
    for tid in (running, review):
        await elapse(db, t, tid, 120)
    hits = await surface(db, t)
    assert sorted(h["state"] for h in hits) == ["NEEDS_REVIEW", "RUNNING"]
    [ev] = await stuck_events(db, t, running)
    assert ev["data"]["attempt_id"] == attempt and ev["data"]["state"] == "RUNNING"
    view = await tasks.get_task(db, t.namespace_id, review)
    assert view["state"] == "NEEDS_REVIEW" and view["effect_uncertain"] is True
    assert view["stuck_reason"].startswith("NEEDS_REVIEW for 120 s")


async def test_terminal_tasks_and_unbounded_queues_are_never_surfaced(db, tenant) -> None:
    t = await tenant()  # "default" has no stuck_after_ms
    await t.add_queue("watched", stuck_after_ms=BOUND_MS)
    unbounded = (await t.submit())["id"]
    cancelled = (await t.submit(queue="watched"))["id"]
    await tasks.cancel_task(db, t.namespace_id, cancelled)
    # A bound that is switched off again stops the watching too.
    await t.add_queue("was-watched", stuck_after_ms=BOUND_MS)
    switched_off = (await t.submit(queue="was-watched"))["id"]
    await t.add_queue("was-watched")
    for tid in (unbounded, cancelled, switched_off):
        await elapse(db, t, tid, 10 * 86_400)
    stats = await Watchdog(db, settings=WatchdogSettings(watchdog_batch=1000)).run_once()
    assert stats.queues >= 1
    for tid in (unbounded, cancelled, switched_off):
        assert await stuck_events(db, t, tid) == []
        assert (await tasks.get_task(db, t.namespace_id, tid))["stuck_at"] is None


async def test_two_watchdogs_racing_surface_each_task_once(db, tenant) -> None:
    t = await tenant(stuck_after_ms=BOUND_MS)
    ids = [(await t.submit())["id"] for _ in range(40)]
    for tid in ids:
        await elapse(db, t, tid, 90)
    registry = Registry()
    small = WatchdogSettings(watchdog_batch=7)  # several transactions each
    a = Watchdog(db, settings=small, metrics=registry)
    b = Watchdog(db, settings=small)

    async def drain(w: Watchdog) -> int:
        total = 0
        while True:
            stats = await w.run_once()
            total += stats.surfaced["WAITING"]
            if not stats.backlog:
                return total

    counts = await asyncio.gather(drain(a), drain(b), drain(a), drain(b))
    assert sum(counts) >= len(ids)  # other tests' overdue tasks may be counted as well
    for tid in ids:
        assert len(await stuck_events(db, t, tid)) == 1, tid
    assert registry.counter("pulse_tasks_stuck_total", "", ("state",)).value(state="WAITING") >= 1
    # The gauge counts what is still stuck after the round (our 40 at least).
    await a.run_once()
    assert registry.gauge("pulse_tasks_stuck", "", ("state",)).value(state="WAITING") >= 40


async def test_stuck_filter_lists_only_currently_stuck_tasks(db, tenant) -> None:
    t = await tenant(stuck_after_ms=BOUND_MS)
    await t.add_queue("other", stuck_after_ms=BOUND_MS)
    fresh = (await t.submit())["id"]
    old = [(await t.submit())["id"] for _ in range(3)]
    elsewhere = (await t.submit(queue="other"))["id"]
    moved_on = (await t.submit())["id"]
    for tid in (*old, elsewhere, moved_on):
        await elapse(db, t, tid, 120)
    assert len(await surface(db, t)) == 4
    assert len(await surface(db, t, "other")) == 1
    await force_state(db, t, moved_on, "LEASED")  # new episode: no longer stuck

    async def listed(stuck: bool | None, **filters: Any) -> list[str]:
        page = await tasks.list_tasks(
            db, t.namespace_id, TaskListFilters(**filters), stuck=stuck, limit=500
        )
        return [i["id"] for i in page["items"]]

    assert set(await listed(True)) == {*old, elsewhere}
    assert set(await listed(True, queue="default")) == set(old)
    assert set(await listed(True, state="LEASED")) == set()
    assert set(await listed(False)) == {fresh, moved_on}
    assert set(await listed(None)) == {fresh, *old, elsewhere, moved_on}
    for item in (await tasks.list_tasks(db, t.namespace_id, TaskListFilters(), stuck=True))[
        "items"
    ]:
        assert item["stuck_at"] is not None and item["stuck_reason"]

    # Paging: the cursor is bound to the stuck filter.
    page = await tasks.list_tasks(db, t.namespace_id, TaskListFilters(), stuck=True, limit=2)
    assert len(page["items"]) == 2 and page["next_cursor"]
    rest = await tasks.list_tasks(
        db, t.namespace_id, TaskListFilters(), stuck=True, limit=2, cursor=page["next_cursor"]
    )
    assert {i["id"] for i in page["items"] + rest["items"]} == {*old, elsewhere}
    with pytest.raises(InvalidRequest):
        await tasks.list_tasks(db, t.namespace_id, TaskListFilters(), cursor=page["next_cursor"])


async def test_queue_get_shows_usage_denials_and_stuck_count(db, tenant) -> None:
    t = await tenant(stuck_after_ms=BOUND_MS)
    ids = [(await t.submit())["id"] for _ in range(3)]
    await force_state(db, t, ids[1], "LEASED")
    await force_state(db, t, ids[2], "RUNNING")
    await elapse(db, t, ids[0], 120)
    await surface(db, t)

    async def counters(tx: Tx) -> None:
        # Enforcement (start permits, rate window) counts these; set them directly here.
        await tx.execute(
            "UPDATE pulse_queue_usage SET denials_quota = 5, denials_permits = 2,"
            " denials_rate = 3, window_start = '2026-11-30 01:02:03.000004', window_starts = 4"
            " WHERE namespace_id = %s AND queue_id = %s",
            (t.namespace_id, t.queue_id),
        )

    await db.transaction(counters)
    q = await queues.get_queue(db, t.namespace_id, "default")
    usage = q["usage"]
    assert (usage["unfinished_tasks"], usage["reservations"], usage["active_attempts"]) == (3, 1, 1)
    assert usage["window_start"] == "2026-11-30T01:02:03.000004Z" and usage["window_starts"] == 4
    assert usage["denials"]["quota"] == 5
    assert usage["denials"]["permits"] == 2 and usage["denials"]["rate"] == 3
    assert usage["stuck_tasks"] == 1
    assert usage["free_permits"] is None  # no max_concurrency: unlimited
    assert q["counts"]["WAITING"] == 1 and q["stuck_after_ms"] == BOUND_MS
    # A config change keeps the counters (and the stuck marks).
    res = await queues.put_queue(
        db, t.namespace_id, "default", QueuePut(stuck_after_ms=BOUND_MS * 2)
    )
    assert res.queue["usage"]["denials"]["quota"] == 5 and res.queue["usage"]["stuck_tasks"] == 1
    # free_permits = max_concurrency - active - reservations, never below 0.
    for limit, free in ((5, 3), (2, 0), (1, 0)):
        res = await queues.put_queue(db, t.namespace_id, "default", QueuePut(max_concurrency=limit))
        assert res.queue["usage"]["free_permits"] == free, limit
    # The list shows usage (no per-queue scans: no stuck count there).
    page = await queues.list_queues(db, t.namespace_id)
    [listed] = [i for i in page["items"] if i["name"] == "default"]
    assert listed["usage"]["denials"]["rate"] == 3 and "stuck_tasks" not in listed["usage"]


def test_usage_view_shows_every_denial_column() -> None:
    row = {
        "namespace_id": b"n" * 16, "queue_id": b"q" * 16, "unfinished_tasks": 1,
        "reservations": 0, "active_attempts": 0, "window_start": None, "window_starts": 0,
        "denials_quota": 1, "denials_permits": 2, "denials_rate": 3, "denials_gate": 7,
    }  # fmt: skip
    view = queues.usage_view(row, stuck_tasks=2)
    assert view["denials"]["gate"] == 7 and view["denials"]["permits"] == 2
    assert view["stuck_tasks"] == 2 and "queue_id" not in view


def test_settings_from_env() -> None:
    s = WatchdogSettings.from_env(
        {"ORBIT_PULSE_WATCHDOG_INTERVAL_MS": "250", "ORBIT_PULSE_WATCHDOG_BATCH": "9"}
    )
    assert (s.watchdog_interval_ms, s.watchdog_batch) == (250, 9)
    assert WatchdogSettings.from_env({}).watchdog_interval_ms == 10_000
