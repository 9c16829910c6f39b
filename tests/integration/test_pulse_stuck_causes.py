"""The watchdog's stuck reason names the cause, for every cause the dispatcher (or the
worker side) can know (pulse/stuck_causes.py): one case per cause, each made for real
(pause, sessions, keys, quotas, rate windows, offers, running attempts, review) and judged
by one watchdog pass with the clock pinned a little after the bound."""

from __future__ import annotations

from datetime import timedelta
from typing import Any

import msgspec
from event_rows import raw_events
from pulse_fixtures import force_state
from pulse_worker_support import connect, open_session

from orbit.audit import CLI_ACTOR
from orbit.ids import parse_id
from orbit.resources import put_resources
from orbit.storage import Tx
from orbit.times import format_time
from orbit.types import ResourcesPut
from pulse import attempts, queues, tasks, wire
from pulse.dispatch import Dispatcher
from pulse.hub import Hub
from pulse.watchdog import surface_queue

BOUND_MS = 1000


async def _surface(db, t, *, after_s: float = 2.0) -> dict[str, Any]:
    """One watchdog pass over the tenant's queue, ``after_s`` after now; the surfaced tasks
    by id with their reason and their event's cause."""
    now = await db.now() + timedelta(seconds=after_s)
    got = await surface_queue(db, t.namespace_id, t.queue_id, BOUND_MS, now=now)

    async def events(tx: Tx) -> list[dict[str, Any]]:
        return await raw_events(tx, t.namespace_id, type="task.stuck")

    causes = {r["subject_id"]: msgspec.json.decode(r["data"]) for r in await db.read(events)}
    return {s["id"].hex(): {"reason": s["reason"], **causes[s["id"]]} for s in got}


def _cause(surfaced: dict[str, Any], task: dict[str, Any]) -> tuple[str, str]:
    entry = surfaced[task["id"]]
    reason = entry["reason"]
    assert reason.startswith(f"{entry['state']} for ") and len(reason) <= 255
    return entry["cause"], reason


async def _running(db, hub, t, session_conn, task) -> bytes:
    assert await Dispatcher(db, hub).dispatch_to(session_conn) >= 1
    offers = session_conn.take_offers()
    (offer,) = [o for o in offers if o.task.id == task["id"]]
    aid = parse_id(offer.attempt_id)
    started = await attempts.start(db, t.namespace_id, session_conn.info.session_id, aid)
    assert isinstance(started, wire.Started), started
    return aid


async def test_waiting_without_a_session_then_paused_namespace_and_queue(db, tenant) -> None:
    t = await tenant(stuck_after_ms=BOUND_MS)
    task = await t.submit()
    code, reason = _cause(await _surface(db, t), task)
    assert code == "no_session" and reason.endswith(
        "no live worker session takes work from queue default"
    )
    t2 = await tenant(stuck_after_ms=BOUND_MS)
    task2 = await t2.submit()
    await queues.set_queue_paused(db, t2.namespace_id, t2.queue, True)
    assert _cause(await _surface(db, t2), task2)[0] == "queue_paused"
    t3 = await tenant(stuck_after_ms=BOUND_MS)
    task3 = await t3.submit()
    await queues.set_namespace_paused(db, t3.namespace_id, True)
    code, reason = _cause(await _surface(db, t3), task3)
    assert code == "namespace_paused" and reason.endswith("the namespace is paused")


async def test_not_due_and_deadline(db, tenant) -> None:
    t = await tenant(stuck_after_ms=BOUND_MS)
    later = await t.submit(delay_ms=3_600_000)
    code, reason = _cause(await _surface(db, t), later)
    assert code == "not_due" and "a retry's backoff or a delay" in reason
    t2 = await tenant(stuck_after_ms=BOUND_MS)
    soon = format_time(await db.now() + timedelta(milliseconds=500))
    expired = await t2.submit(deadline_at=soon)
    assert _cause(await _surface(db, t2), expired)[0] == "deadline_passed"


async def test_keyed_work_and_sessions(db, tenant) -> None:
    hub = Hub("node-stuck")
    # A keyed task and only a session that does not accept keyed tasks.
    t = await tenant(stuck_after_ms=BOUND_MS)
    keyed = await t.submit(concurrency_key="acct-1")
    info, _ = await open_session(db, t, concurrency_keys=False)
    await connect(db, hub, info)
    code, reason = _cause(await _surface(db, t), keyed)
    assert code == "no_keyed_session" and "concurrency_keys false" in reason
    # The key held by another task's running attempt.
    t2 = await tenant(stuck_after_ms=BOUND_MS)
    first = await t2.submit(concurrency_key="acct-2")
    info2, _ = await open_session(db, t2, concurrency_keys=True)
    conn2 = await connect(db, hub, info2)
    holder = await _running(db, hub, t2, conn2, first)
    second = await t2.submit(concurrency_key="acct-2")
    code, reason = _cause(await _surface(db, t2), second)
    assert code == "key_held" and holder.hex() in reason


async def test_queue_concurrency_application_quota_sessions_full_and_dispatch(db, tenant) -> None:
    hub = Hub("node-stuck-2")
    # The queue's max_concurrency taken.
    t = await tenant(stuck_after_ms=BOUND_MS, max_concurrency=1)
    a = await t.submit()
    info, _ = await open_session(db, t, max_concurrency=4)
    conn = await connect(db, hub, info)
    await _running(db, hub, t, conn, a)
    b = await t.submit()
    code, reason = _cause(await _surface(db, t), b)
    assert code == "queue_concurrency" and "max_concurrency 1 is taken (1 running" in reason
    # The application's max_active_attempts taken.
    t2 = await tenant(stuck_after_ms=BOUND_MS)
    await put_resources(db, CLI_ACTOR, t2.application_id, ResourcesPut(max_active_attempts=1))
    a2 = await t2.submit()
    info2, _ = await open_session(db, t2, max_concurrency=4)
    conn2 = await connect(db, hub, info2)
    await _running(db, hub, t2, conn2, a2)
    b2 = await t2.submit()
    assert _cause(await _surface(db, t2), b2)[0] == "application_active_attempts"
    # Every session of the queue full.
    t3 = await tenant(stuck_after_ms=BOUND_MS)
    a3 = await t3.submit()
    info3, _ = await open_session(db, t3, max_concurrency=1)
    conn3 = await connect(db, hub, info3)
    await _running(db, hub, t3, conn3, a3)
    b3 = await t3.submit()
    assert _cause(await _surface(db, t3), b3)[0] == "sessions_full"
    # A session with room and nothing in the way: no specific cause.
    t4 = await tenant(stuck_after_ms=BOUND_MS)
    idle = await t4.submit()
    info4, _ = await open_session(db, t4, max_concurrency=4)
    await connect(db, hub, info4)
    assert _cause(await _surface(db, t4), idle)[0] == "dispatch"


async def test_start_rate_windows(db, tenant) -> None:
    hub = Hub("node-stuck-3")
    t = await tenant(stuck_after_ms=BOUND_MS, max_starts_per_second=1)
    a = await t.submit()
    b = await t.submit()
    info, _ = await open_session(db, t, max_concurrency=1)  # b stays WAITING
    conn = await connect(db, hub, info)
    await _running(db, hub, t, conn, a)
    # Judged within the same second as the start: the queue's window is used up.
    now = await db.now()
    got = await surface_queue(
        db, t.namespace_id, t.queue_id, 1, now=now + timedelta(milliseconds=100)
    )
    reasons = {s["id"].hex(): s["reason"] for s in got}
    assert "start rate (1/s) is used up" in reasons[b["id"]], reasons


async def test_offered_running_cancel_requested_and_review(db, tenant) -> None:
    hub = Hub("node-stuck-4")
    t = await tenant(stuck_after_ms=BOUND_MS)
    offered = await t.submit()
    info, _ = await open_session(db, t, max_concurrency=4)
    conn = await connect(db, hub, info)
    assert await Dispatcher(db, hub).dispatch_to(conn) == 1
    code, reason = _cause(await _surface(db, t), offered)
    assert code == "offered" and "the worker has not started it" in reason
    t2 = await tenant(stuck_after_ms=BOUND_MS)
    running = await t2.submit()
    info2, _ = await open_session(db, t2, max_concurrency=4)
    conn2 = await connect(db, hub, info2)
    aid = await _running(db, hub, t2, conn2, running)
    code, reason = _cause(await _surface(db, t2), running)
    assert code == "running" and aid.hex() in reason and "test-host pid 1234" in reason
    # The session is gone (judged after its lease): recovery takes the attempt back.
    t3 = await tenant(stuck_after_ms=BOUND_MS)
    gone = await t3.submit()
    info3, _ = await open_session(db, t3, max_concurrency=4)
    conn3 = await connect(db, hub, info3)
    await _running(db, hub, t3, conn3, gone)
    assert _cause(await _surface(db, t3, after_s=120), gone)[0] == "session_gone"
    # A cancel requested that the worker did not act on.
    t4 = await tenant(stuck_after_ms=BOUND_MS)
    cancel = await t4.submit()
    info4, _ = await open_session(db, t4, max_concurrency=4)
    conn4 = await connect(db, hub, info4)
    await _running(db, hub, t4, conn4, cancel)
    out = await tasks.cancel_task(db, t4.namespace_id, cancel["id"])
    assert out.status == 202
    assert _cause(await _surface(db, t4), cancel)[0] == "cancel_requested"
    # NEEDS_REVIEW waits for an operator.
    t5 = await tenant(stuck_after_ms=BOUND_MS)
    review = await t5.submit()
    await force_state(db, t5, review["id"], "NEEDS_REVIEW")
    code, reason = _cause(await _surface(db, t5), review)
    assert code == "review" and "operator" in reason
