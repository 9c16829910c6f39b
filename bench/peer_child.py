"""Peer measurements, run in a subprocess whose path has PgQueuer / Procrastinate
(``python -m bench.peer_child <kind> '<json args>'``, started by bench/peers.py). Prints one
JSON line. See bench/peers.py for the methods."""

from __future__ import annotations

import asyncio
import contextlib
import json
import statistics
import sys
import time
from datetime import timedelta
from typing import Any


def _pct(values: list[float], q: float) -> float | None:
    if not values:
        return None
    s = sorted(values)
    return round(s[min(len(s) - 1, int(len(s) * q))], 2)


async def _pgq_queries(dsn: str) -> Any:
    import asyncpg
    from pgqueuer.db import AsyncpgDriver
    from pgqueuer.queries import Queries

    return Queries(AsyncpgDriver(await asyncpg.connect(dsn=dsn)))


async def _pgq_setup(dsn: str) -> None:
    q = await _pgq_queries(dsn)
    if not await q.schema_is_installed():
        await q.install()
    await q.clear_queue()


async def pgq_throughput(dsn: str, seconds: float, dequeue: int = 5, batch: int = 10) -> dict:
    """PgQueuer's tools/benchmark.py "throughput": 1 enqueuer (batches of 10), 5 consumers
    (batch size 10), no-op entrypoints; rate = jobs handled / elapsed."""
    import asyncpg
    from pgqueuer import PgQueuer
    from pgqueuer.db import AsyncpgDriver

    await _pgq_setup(dsn)
    handled = 0
    stop = asyncio.Event()
    pgqs = []
    for _ in range(dequeue):
        pgq = PgQueuer(AsyncpgDriver(await asyncpg.connect(dsn=dsn)))

        @pgq.entrypoint("asyncfetch")
        async def asyncfetch(job: Any) -> None:
            nonlocal handled
            handled += 1

        pgqs.append(pgq)

    async def producer() -> None:
        q = await _pgq_queries(dsn)
        n = 0
        while not stop.is_set():
            await q.enqueue(["asyncfetch"] * batch, [f"{n + i}".encode() for i in range(batch)],
                            [0] * batch)  # fmt: skip
            n += batch

    async def timer() -> None:
        await asyncio.sleep(seconds)
        stop.set()
        for p in pgqs:
            p.shutdown.set()

    began = time.monotonic()
    await asyncio.gather(producer(), timer(), *(p.run(batch_size=batch) for p in pgqs))
    elapsed = time.monotonic() - began
    return {"tasks": handled, "seconds": round(elapsed, 2), "per_s": round(handled / elapsed, 1),
            "method": "pgqueuer tools/benchmark.py throughput: 1 enqueuer x10, 5 dequeuers x10"}  # fmt: skip


async def pgq_drain(dsn: str, jobs: int, dequeue: int = 5, batch: int = 10) -> dict:
    """PgQueuer's "drain": enqueue ``jobs`` up front, 5 consumers drain them."""
    import asyncpg
    from pgqueuer import PgQueuer
    from pgqueuer.db import AsyncpgDriver
    from pgqueuer.types import QueueExecutionMode

    await _pgq_setup(dsn)
    q = await _pgq_queries(dsn)
    for start in range(0, jobs, 5000):
        n = min(5000, jobs - start)
        await q.enqueue(["asyncfetch"] * n, [b""] * n, [0] * n)
    pgqs = []
    for _ in range(dequeue):
        pgq = PgQueuer(AsyncpgDriver(await asyncpg.connect(dsn=dsn)))

        @pgq.entrypoint("asyncfetch")
        async def asyncfetch(job: Any) -> None:
            return None

        pgqs.append(pgq)
    began = time.monotonic()
    await asyncio.gather(*(p.run(batch_size=batch, mode=QueueExecutionMode.drain) for p in pgqs))
    elapsed = time.monotonic() - began
    return {"tasks": jobs, "seconds": round(elapsed, 2), "per_s": round(jobs / elapsed, 1)}


async def pgq_enqueue_one(dsn: str, seconds: float, clients: int) -> dict:
    """One job per enqueue call, ``clients`` concurrent connections (as Orbit's S3 single)."""
    await _pgq_setup(dsn)
    qs = [await _pgq_queries(dsn) for _ in range(clients)]
    done = 0
    stop_at = time.monotonic() + seconds

    async def one(q: Any) -> None:
        nonlocal done
        while time.monotonic() < stop_at:
            await q.enqueue("asyncfetch", b"{}", 0)
            done += 1

    began = time.monotonic()
    await asyncio.gather(*(one(q) for q in qs))
    elapsed = time.monotonic() - began
    return {"tasks": done, "per_s": round(done / elapsed, 1), "clients": clients}


async def pgq_latency(dsn: str, n: int) -> dict:
    """Idle system, one consumer (LISTEN/NOTIFY): enqueue one job at a time with its send
    time; latency = handler start − send (as Orbit's S2)."""
    import asyncpg
    from pgqueuer import PgQueuer
    from pgqueuer.db import AsyncpgDriver

    await _pgq_setup(dsn)
    pgq = PgQueuer(AsyncpgDriver(await asyncpg.connect(dsn=dsn)))
    got: asyncio.Queue[float] = asyncio.Queue()

    @pgq.entrypoint("lat")
    async def lat(job: Any) -> None:
        t0 = float(job.payload.decode())
        got.put_nowait((time.time() - t0) * 1000)

    runner = asyncio.create_task(pgq.run(batch_size=1, dequeue_timeout=timedelta(seconds=30)))
    q = await _pgq_queries(dsn)
    await asyncio.sleep(1.0)
    values = []
    for i in range(n + 3):
        await q.enqueue("lat", str(time.time()).encode(), 0)
        v = await asyncio.wait_for(got.get(), 30)
        if i >= 3:
            values.append(v)
        await asyncio.sleep(0.05)
    pgq.shutdown.set()
    await asyncio.wait_for(runner, 30)
    return {"n": n, "p50_ms": _pct(values, 0.5), "p99_ms": _pct(values, 0.99),
            "mean_ms": round(statistics.fmean(values), 2)}  # fmt: skip


def _procrastinate_app(dsn: str) -> Any:
    import procrastinate

    app = procrastinate.App(connector=procrastinate.PsycopgConnector(conninfo=dsn))

    @app.task(name="noop", queue="bench")
    async def noop(n: int = 0) -> None:
        return None

    return app, noop


async def pro_drain(dsn: str, jobs: int) -> dict:
    """Procrastinate: defer ``jobs`` in bulk (batch_defer_async), then one worker with
    concurrency 10 drains them (``wait=False``)."""
    app, noop = _procrastinate_app(dsn)
    async with app.open_async():
        with contextlib.suppress(Exception):  # already applied
            await app.schema_manager.apply_schema_async()
        for start in range(0, jobs, 1000):
            n = min(1000, jobs - start)
            await noop.batch_defer_async(*({"n": i} for i in range(n)))
        began = time.monotonic()
        await app.run_worker_async(queues=["bench"], concurrency=10, wait=False,
                                   install_signal_handlers=False)  # fmt: skip
        elapsed = time.monotonic() - began
    return {"tasks": jobs, "seconds": round(elapsed, 2), "per_s": round(jobs / elapsed, 1)}


async def pro_defer_one(dsn: str, seconds: float, clients: int) -> dict:
    app, noop = _procrastinate_app(dsn)
    done = 0
    async with app.open_async():
        with contextlib.suppress(Exception):  # already applied
            await app.schema_manager.apply_schema_async()
        stop_at = time.monotonic() + seconds

        async def one() -> None:
            nonlocal done
            while time.monotonic() < stop_at:
                await noop.defer_async(n=1)
                done += 1

        began = time.monotonic()
        await asyncio.gather(*(one() for _ in range(clients)))
        elapsed = time.monotonic() - began
    return {"tasks": done, "per_s": round(done / elapsed, 1), "clients": clients}


KINDS = {
    "pgq-throughput": lambda a: pgq_throughput(a["dsn"], a["seconds"]),
    "pgq-drain": lambda a: pgq_drain(a["dsn"], a["jobs"]),
    "pgq-enqueue-one": lambda a: pgq_enqueue_one(a["dsn"], a["seconds"], a["clients"]),
    "pgq-latency": lambda a: pgq_latency(a["dsn"], a["n"]),
    "pro-drain": lambda a: pro_drain(a["dsn"], a["jobs"]),
    "pro-defer-one": lambda a: pro_defer_one(a["dsn"], a["seconds"], a["clients"]),
}


def main() -> None:
    import logging

    logging.basicConfig(level=logging.WARNING)
    kind, args = sys.argv[1], json.loads(sys.argv[2])
    try:
        import uvloop

        result = uvloop.run(KINDS[kind](args))
    except ImportError:
        result = asyncio.run(KINDS[kind](args))
    print(json.dumps(result))


if __name__ == "__main__":
    main()
