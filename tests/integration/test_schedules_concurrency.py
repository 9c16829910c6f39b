"""Several schedulers at once never write an occurrence or a task twice: two connection pools
in one process, and two separate processes, racing over the same due schedules."""

from __future__ import annotations

import asyncio
import json
import sys
import time
from collections.abc import AsyncIterator, Iterator
from datetime import datetime, timedelta

import pytest
from platform_fixtures import process_env
from pulse_fixtures import Tenant
from schedule_support import isolated_dsn, name, occurrences, put, quiesce, tenant

from orbit.storage import DSN, Database, Tx
from pulse.cron import CronExpr, CronTiming, load_zone
from pulse.scheduler import Scheduler

T0 = datetime(2032, 6, 1, 8, 0, 0)


@pytest.fixture(scope="module")
def sched_dsn() -> Iterator[DSN]:
    yield from isolated_dsn()


@pytest.fixture(scope="module")
async def pools(sched_dsn: DSN) -> AsyncIterator[tuple[Database, Database]]:
    a = await Database.connect(sched_dsn, maxsize=4)
    b = await Database.connect(sched_dsn, maxsize=4)
    try:
        yield a, b
    finally:
        await a.close()
        await b.close()


@pytest.fixture(autouse=True)
def _quiet(sched_dsn: DSN) -> Iterator[None]:
    yield
    quiesce(sched_dsn)


async def _setup(
    db: Database, created: datetime, tenants: int, per_tenant: int
) -> list[tuple[Tenant, str, str]]:
    """``tenants`` × ``per_tenant`` schedules with assorted crons, all created at ``created``."""
    crons = ["* * * * *", "*/2 * * * *", "*/3 * * * *", "* * * * * 30", "*/5 * * * *"]
    out = []
    for _ in range(tenants):
        t = await tenant(db)
        for k in range(per_tenant):
            s = name()
            cron = crons[k % len(crons)]
            await put(db, t, s, now=created, cron=cron, catchup_window_ms=86_400_000,
                      timezone="Europe/Berlin")  # fmt: skip
            out.append((t, s, cron))
    return out


async def _check(
    db: Database, made: list[tuple[Tenant, str, str]], created: datetime, until: datetime
) -> int:
    """Every schedule has exactly croniter's fire times in [created, until], each with one
    task of its own; no task without its occurrence. Returns the occurrence count."""
    total = 0
    berlin = load_zone("Europe/Berlin")
    for t, s, cron in made:
        occ = await occurrences(db, t, s)
        expected = CronTiming(CronExpr.parse(cron), berlin).fires(
            created, until + timedelta(microseconds=1)
        )
        assert [o["fire_at"] for o in occ] == expected, (s, cron)
        assert all(o["outcome"] == "created" and o["task_id"] is not None for o in occ)
        total += len(occ)
    for t in {id(t): t for t, _, _ in made}.values():

        async def run(tx: Tx, t: Tenant = t) -> tuple[int, int, int]:
            row = await tx.fetchone(
                "SELECT COUNT(*) AS n, COUNT(DISTINCT source_id) AS d FROM pulse_tasks"
                " WHERE namespace_id = %s AND source_kind = 'schedule'",
                (t.namespace_id,),
            )
            occ = await tx.fetchval(
                "SELECT COUNT(*) FROM pulse_schedule_occurrences o JOIN pulse_tasks k"
                " ON k.namespace_id = o.namespace_id AND k.id = o.task_id"
                " AND k.source_id = o.id WHERE o.namespace_id = %s",
                (t.namespace_id,),
            )
            assert row is not None
            return int(row["n"]), int(row["d"]), int(occ)

        tasks, distinct, linked = await db.read(run)
        assert tasks == distinct == linked  # one task per occurrence, each linked back
    return total


async def test_two_pools_racing_never_duplicate(pools: tuple[Database, Database]) -> None:
    a, b = pools
    made = await _setup(a, T0, tenants=3, per_tenant=5)
    clock = T0
    for minutes in (7, 19, 31):  # three rounds of downtime, each raced by four schedulers
        clock = T0 + timedelta(minutes=minutes, seconds=45)
        stats = await asyncio.gather(
            *(Scheduler(db, now=clock, batch=4).run_once() for db in (a, b, a, b))
        )
        assert all(s.errors == 0 for s in stats)
        assert sum(1 for s in stats if s.steps) >= 2  # the work really was shared
    total = await _check(a, made, T0, clock)
    assert total > 250


PROCESS_SCRIPT = r"""
import asyncio, json, sys, time
from datetime import datetime
from orbit.storage import DSN, Database
from pulse.scheduler import Scheduler

async def main():
    dsn, now, start = DSN.parse(sys.argv[1]), datetime.fromisoformat(sys.argv[2]), float(sys.argv[3])
    db = await Database.connect(dsn, maxsize=2)
    time.sleep(max(0.0, start - time.time()))
    stats = await Scheduler(db, now=now, batch=3).run_once()
    await db.close()
    print(json.dumps({"steps": stats.steps, "fired": stats.fired, "errors": stats.errors}))

asyncio.run(main())
"""


@pytest.mark.process
async def test_two_processes_racing_never_duplicate(
    sched_dsn: DSN, pools: tuple[Database, Database]
) -> None:
    a, _ = pools
    created = T0 + timedelta(days=1)
    made = await _setup(a, created, tenants=2, per_tenant=10)
    clock = created + timedelta(minutes=40, seconds=10)
    start = time.time() + 3.0
    procs = [
        await asyncio.create_subprocess_exec(
            sys.executable,
            "-c",
            PROCESS_SCRIPT,
            sched_dsn.url(hide_password=False),
            clock.isoformat(),
            str(start),
            env=process_env(),
            stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.PIPE,
        )
        for _ in range(2)
    ]
    results = []
    for p in procs:
        out, err = await asyncio.wait_for(p.communicate(), 100)
        assert p.returncode == 0, err.decode()
        results.append(json.loads(out.decode().strip().splitlines()[-1]))
    assert all(r["errors"] == 0 for r in results)
    assert all(r["steps"] > 0 for r in results), results  # both processes took part
    total = await _check(a, made, created, clock)
    assert sum(r["fired"] for r in results) == total
