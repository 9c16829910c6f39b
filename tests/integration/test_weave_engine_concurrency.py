"""Two advancers on one database — each with its own connection pool, as two server nodes —
never advance an instance twice, while a worker completes tasks and signals arrive
concurrently. Also: two timer loops never write a timer's event twice."""

from __future__ import annotations

import asyncio
import secrets
from datetime import timedelta
from typing import Any

from weave_engine_support import Flow

from orbit.storage import Database
from weave.advancer import Advancer, AdvancerSettings
from weave.timers import TimerLoop

N_INSTANCES = 12
DOC = {
    "steps": [
        {"id": "fan", "type": "parallel", "branches": [
            {"steps": [{"id": f"t{i}", "type": "task", "queue": "q", "kind": "k",
                        "payload": {"i": i}}]}
            for i in range(3)
        ]},
        {"id": "j", "type": "join", "parallel": "fan"},
        {"id": "after", "type": "task", "queue": "q", "kind": "k"},
        {"id": "w", "type": "wait_signal", "signal": "go"},
        {"id": "done", "type": "succeed", "output": {"$": "$.steps.w.output"}},
    ]
}  # fmt: skip


async def test_two_advancers_never_advance_an_instance_twice(db: Database, dsn, tenant) -> None:
    flow = await Flow.create(db, await tenant())
    name = await flow.publish(DOC)
    ids = []
    for _ in range(N_INSTANCES):
        status, inst = await flow.start_named(name, None)
        assert status == 201
        ids.append(inst["id"])
    other = await Database.connect(dsn, maxsize=4)
    fast = AdvancerSettings(batch=2, scan_limit=50)
    advancers = [Advancer(db, settings=fast), Advancer(other, settings=fast)]
    done = asyncio.Event()
    stats: list[dict[str, int]] = [{}, {}]

    async def advance(k: int) -> None:
        while not done.is_set():
            s = await advancers[k].run_once()
            for key, v in s.events.items():
                stats[k][key] = stats[k].get(key, 0) + v
            stats[k]["skipped"] = stats[k].get("skipped", 0) + s.skipped
            await asyncio.sleep(0)

    async def drive() -> None:
        signalled: set[str] = set()
        while True:
            await flow.work()
            waiting = await flow.rows(
                "SELECT instance_id FROM weave_waits WHERE namespace_id = %s AND state = 'OPEN'"
            )
            for w in waiting:
                iid = w["instance_id"].hex()
                if iid not in signalled:
                    signalled.add(iid)
                    # The same signal twice, concurrently: de-duplicated by signal_id.
                    sid = secrets.token_hex(4)
                    await asyncio.gather(
                        flow.signal(iid, "go", iid, signal_id=sid),
                        flow.signal(iid, "go", iid, signal_id=sid),
                    )
            running = await flow.rows(
                "SELECT COUNT(*) AS n FROM weave_instances WHERE namespace_id = %s"
                " AND state = 'RUNNING'"
            )
            if running[0]["n"] == 0:
                done.set()
                return
            await asyncio.sleep(0.01)

    try:
        async with asyncio.timeout(90):
            await asyncio.gather(advance(0), advance(1), drive())
    finally:
        done.set()
        await other.close()

    for iid in ids:
        got = await flow.instance(iid)
        assert got["state"] == "SUCCEEDED" and got["output"] == iid
        assert sorted(s["step"] for s in got["steps"]) == sorted(
            ["fan", "t0", "t1", "t2", "j", "after", "w", "done"]
        )
        tasks = await flow.tasks_of(iid)
        assert len(tasks) == 4 and {t["state"] for t in tasks} == {"SUCCEEDED"}
        inbox = await flow.inbox_of(iid)
        # 4 task completions and 1 signal, each applied exactly once.
        assert sorted((e["kind"], e["outcome"]) for e in inbox) == sorted(
            [("task_finished", "applied")] * 4 + [("signal_arrived", "applied")]
        )
    # Both nodes did part of the work.
    applied = [s.get("applied", 0) for s in stats]
    assert sum(applied) == 5 * N_INSTANCES, stats
    assert all(a > 0 for a in applied), stats


async def test_racing_advances_of_one_instance_serialise(db: Database, dsn, tenant) -> None:
    flow = await Flow.create(db, await tenant())
    inst = await flow.start(DOC)
    await flow.work()  # three completions wait in the inbox
    other = await Database.connect(dsn, maxsize=2)
    try:
        a, b = Advancer(db), Advancer(other)
        ns = flow.t.namespace_id
        iid = bytes.fromhex(inst["id"])
        results = await asyncio.gather(*(x.advance(ns, iid) for x in (a, b, a, b)))
    finally:
        await other.close()
    applied = sum((r or {}).get("applied", 0) for r in results)
    assert applied == 3, results
    steps = {s["step"]: s["state"] for s in (await flow.instance(inst["id"]))["steps"]}
    assert steps["j"] == "SUCCEEDED" and steps["after"] == "RUNNING"
    assert len(await flow.tasks_of(inst["id"])) == 4


async def test_two_timer_loops_write_each_timer_event_once(db: Database, dsn, tenant) -> None:
    flow = await Flow.create(db, await tenant())
    doc: dict[str, Any] = {"steps": [{"id": "nap", "type": "sleep", "duration_ms": 1000}]}
    name = await flow.publish(doc)
    ids = [(await flow.start_named(name, None))[1]["id"] for _ in range(30)]
    other = await Database.connect(dsn, maxsize=2)
    later = await db.now() + timedelta(seconds=5)
    try:
        loops = [TimerLoop(db), TimerLoop(other), TimerLoop(db), TimerLoop(other)]
        counts = await asyncio.gather(*(t.run_once(now=later) for t in loops))
    finally:
        await other.close()
    mine = await flow.rows(
        "SELECT COUNT(*) AS n FROM weave_inbox WHERE namespace_id = %s AND kind = 'timer_fired'"
    )
    assert mine[0]["n"] == 30
    assert sum(counts) >= 30  # other tests' due timers may be fired too
    await flow.advancer.run_once(now=later)
    for iid in ids:
        assert (await flow.instance(iid))["state"] == "SUCCEEDED"
