"""One tenant's flood of transactions cannot make another tenant wait for the pool: the
quiet tenant's transaction gets the next connection that frees up (orbit/storage/fairness.py),
not the one after the flood's queue."""

from __future__ import annotations

import asyncio
import time

from orbit.storage import Database, Tx
from orbit.storage.fairness import enter_tenant


async def test_a_quiet_tenant_skips_a_floods_queue(db: Database) -> None:
    small = await Database.connect(db.dsn, maxsize=4)
    try:

        async def slow(tx: Tx) -> None:
            await tx.execute("SELECT SLEEP(0.05)")

        async def flood_one() -> None:
            enter_tenant("flood")
            await small.read(slow)

        async def quiet_one() -> float:
            enter_tenant("quiet")
            started = time.perf_counter()
            await small.fetchone("SELECT 1 AS one")
            return time.perf_counter() - started

        flood = [asyncio.create_task(flood_one()) for _ in range(120)]
        await asyncio.sleep(0.1)  # the flood holds its share and has a long queue
        waited = await asyncio.wait_for(asyncio.create_task(quiet_one()), 10)
        still_queued = sum(not f.done() for f in flood)
        await asyncio.gather(*flood)
        # First come, first served would have made the quiet tenant wait for ~110 flood
        # transactions of 50 ms on 4 connections (~1.4 s); it waits for at most one.
        assert waited < 0.5, waited
        assert still_queued > 60
        assert small.gate.held == {} and small.gate.in_use == 0
    finally:
        await small.close()
