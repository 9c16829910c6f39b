"""/metrics costs O(1) per scrape: no scrape touches the database or waits for a pool
connection, whatever the data; database-computed gauges (open deliveries, queue depth) are
refreshed in the background with bounded queries, and read by scrapes."""

from __future__ import annotations

import asyncio
import re

from platform_fixtures import asgi_client
from pulse_fixtures import force_state, make_tenant

import pulse.http
from orbit.context import AppContext
from orbit.delivery_loop import DeliveryHub, DeliveryLoop
from orbit.http.app import build_app
from orbit.storage import Database, Tx
from pulse import queue_gauges
from pulse.runtime import PulseRuntime


def _value(text: str, name: str, **labels: str) -> float | None:
    want = ",".join(f'{k}="{v}"' for k, v in labels.items())
    m = re.search(rf"^{name}\{{{re.escape(want)}\}} (\S+)$", text, re.MULTILINE)
    return float(m.group(1)) if m else None


async def test_a_scrape_needs_no_pool_connection(db: Database) -> None:
    """Every connection of the node's pool is held (a flood, a slow transaction): a scrape
    still answers at once — it reads only memory. (Before: the ``orbit_deliveries`` collector
    counted deliveries on the shared pool at every scrape, so a scrape waited for a
    connection, and concurrent scrapes exhausted the pool for every tenant.)"""
    small = await Database.connect(db.dsn, maxsize=1)
    try:
        ctx = AppContext(db=small)
        rt = PulseRuntime.build(ctx)
        DeliveryLoop(small, hub=DeliveryHub(), metrics=ctx.metrics)  # registers its gauges
        app = build_app(ctx, pulse.http.routes(rt))
        held, release = asyncio.Event(), asyncio.Event()

        async def hold(tx: Tx) -> None:
            held.set()
            await release.wait()

        holder = asyncio.create_task(small.transaction(hold))
        await held.wait()
        try:
            async with asgi_client(app) as client:
                scrapes = [client.get("/metrics") for _ in range(10)]
                answers = await asyncio.wait_for(asyncio.gather(*scrapes), 5)
        finally:
            release.set()
            await holder
        assert all(r.status_code == 200 for r in answers)
        assert "orbit_deliveries" in answers[0].text
        assert "pulse_queue_tasks" in answers[0].text
    finally:
        await small.close()


async def test_queue_depth_per_state_and_oldest_wait(db: Database) -> None:
    t = await make_tenant(db)
    ids = [(await t.submit(kind="k", payload={"i": i}))["id"] for i in range(6)]
    await force_state(db, t, ids[2], "LEASED")
    await force_state(db, t, ids[3], "RUNNING")
    await force_state(db, t, ids[4], "NEEDS_REVIEW")
    await force_state(db, t, ids[5], "NEEDS_REVIEW")
    ctx = AppContext(db=db)
    gauges = queue_gauges.QueueGauges(ctx.metrics, db, max_queues=1_000_000)
    ctx.metrics.add_refresher("pulse_queue_tasks", gauges.refresh)
    await ctx.metrics.refresh()
    app = build_app(ctx)
    async with asgi_client(app) as client:
        text = (await client.get("/metrics")).text
    labels = {"application": t.application, "namespace": t.namespace, "queue": t.queue}
    counts = {
        s: _value(text, "pulse_queue_tasks", **labels, state=s)
        for s in ("WAITING", "LEASED", "RUNNING", "NEEDS_REVIEW")
    }
    assert counts == {"WAITING": 2, "LEASED": 1, "RUNNING": 1, "NEEDS_REVIEW": 2}, text
    oldest = _value(text, "pulse_queue_oldest_waiting_seconds", **labels)
    assert oldest is not None and 0 <= oldest < 600


async def test_queue_depth_is_bounded_to_the_fullest_queues(db: Database) -> None:
    """Only the ``max_queues`` queues with the most unfinished tasks get label sets (the
    refresh's work and the labels' cardinality are bounded); a queue that empties drops out."""
    big = await make_tenant(db)
    for i in range(3):
        await big.submit(kind="k", payload={"i": i})
    ctx = AppContext(db=db)
    gauges = queue_gauges.QueueGauges(ctx.metrics, db, max_queues=1)
    await gauges.refresh()
    text = ctx.metrics.render()
    assert len(re.findall(r'^pulse_queue_tasks\{.*state="WAITING"\}', text, re.MULTILINE)) == 1
    assert len(re.findall(r"^pulse_queue_oldest_waiting_seconds\{", text, re.MULTILINE)) == 1


async def test_server_refreshes_gauges_in_the_background(db: Database) -> None:
    """The registry's refresh loop runs every refresher at a fixed interval; a failing one
    is counted and the others still run."""
    ctx = AppContext(db=db)
    ran: list[str] = []

    async def ok() -> None:
        ran.append("ok")

    async def broken() -> None:
        raise RuntimeError("boom")

    ctx.metrics.add_refresher("broken", broken)
    ctx.metrics.add_refresher("ok", ok)
    stop = asyncio.Event()
    loop = asyncio.create_task(ctx.metrics.run_refresh(stop, 0.01))
    for _ in range(200):
        if len(ran) >= 3:
            break
        await asyncio.sleep(0.01)
    stop.set()
    await asyncio.wait_for(loop, 5)
    assert len(ran) >= 3
    assert (
        ctx.metrics.counter("orbit_metrics_refresh_errors_total", "", ("gauge",)).value(
            gauge="broken"
        )
        >= 3
    )
