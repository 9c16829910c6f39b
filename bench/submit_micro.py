"""Batch-submit micro-benchmark: ``python -m bench.submit_micro [--sizes 100,500,1000]
[--seconds 3] [--rounds 1] [--mode service,http] [--dedup] [--profile PATH]``.

Creates a scratch database (dropped after), one tenant and queue, then for each batch size
submits the same body the S3 scenario sends (``{"queue", "kind": "noop", "payload": {"n": 1}}``
× size) back to back for ``--seconds``:

* ``service`` calls :func:`pulse.submit.submit_batch` directly (raw item bytes, as the route
  passes them);
* ``http`` posts ``tasks:batch`` to the real Starlette app in-process (httpx ASGI transport):
  route, body decoding, authorization, response encoding — no socket, no uvicorn.

Prints tasks/s per (mode, size) and the load average before and after. ``--profile PATH``
runs pyinstrument over the whole run and writes an HTML flame view there (plus a text summary
next to it). ``--dedup`` gives every item a unique ``dedup_key`` (the identity lookup path).

``--mode`` may also name ``service-old`` / ``http-old``: the same calls with the batch fast
path switched back to the driver-escaped INSERTs, the read-back of the inserted rows and
the generic task view (monkeypatched for that run only), so old and new interleave in one
session on a noisy machine.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import secrets
import time
from pathlib import Path
from typing import Any

import httpx
import msgspec

from bench.env import ScratchDatabase
from orbit import events as orbit_events
from orbit import migrate
from orbit.bootstrap import bootstrap
from orbit.context import AppContext
from orbit.http.app import build_app
from orbit.settings import Settings
from orbit.storage import Database
from pulse import queues as queue_service
from pulse import submit, submit_rows
from pulse.store import tasks as task_store
from pulse.types import QueuePut

_ENC = msgspec.json.Encoder()


def _items(n: int, dedup: bool) -> list[dict[str, Any]]:
    out: list[dict[str, Any]] = []
    for _ in range(n):
        item: dict[str, Any] = {"queue": "q", "kind": "noop", "payload": {"n": 1}}
        if dedup:
            item["dedup_key"] = secrets.token_hex(8)
        out.append(item)
    return out


async def _run(args: argparse.Namespace) -> list[dict[str, Any]]:
    scratch = ScratchDatabase(prefix="orbit_micro")
    scratch.create()
    figures: list[dict[str, Any]] = []
    try:
        migrate.up(scratch.dsn)
        db = await Database.connect(scratch.dsn, maxsize=4)
        try:
            boot = await bootstrap(db, f"app-{secrets.token_hex(4)}", "ns")
            await queue_service.put_queue(db, boot.namespace_id, "q", QueuePut())
            ctx = AppContext(db=db, settings=Settings())
            app = build_app(ctx, _routes(ctx))
            headers = {"Authorization": f"Bearer {boot.key}", "Content-Type": "application/json"}
            async with httpx.AsyncClient(
                transport=httpx.ASGITransport(app=app), base_url="http://orbit.test"
            ) as client:
                for _round in range(args.rounds):
                    for size in args.sizes:
                        for mode in args.mode:
                            figures.append(
                                await _one(db, client, boot, headers, mode, size, args)
                            )
        finally:
            await db.close()
    finally:
        scratch.drop()
    return figures


def _routes(ctx: AppContext) -> Any:
    import pulse.http
    from pulse.runtime import PulseRuntime

    return pulse.http.routes(PulseRuntime.build(ctx))


async def _one(
    db: Database,
    client: httpx.AsyncClient,
    boot: Any,
    headers: dict[str, str],
    mode: str,
    size: int,
    args: argparse.Namespace,
) -> dict[str, Any]:
    with _old_path(mode.endswith("-old")):
        return await _measure(db, client, boot, headers, mode, size, args)


class _old_path:
    """Switch the batch fast path off (the code before docs/performance.md "Batch submit")."""

    def __init__(self, on: bool) -> None:
        self.on = on
        self.saved: list[tuple[Any, str, Any]] = []

    def _patch(self, obj: Any, name: str, value: Any) -> None:
        self.saved.append((obj, name, getattr(obj, name)))
        setattr(obj, name, value)

    def __enter__(self) -> None:
        if not self.on:
            return

        async def insert_and_read_back(tx: Any, rows: Any) -> None:
            await task_store.task_insert_many(tx, rows)
            await task_store.task_get_many(tx, rows[0]["namespace_id"], [r["id"] for r in rows])

        async def events(tx: Any, ns: bytes, evs: Any, *, now: Any) -> Any:
            return await orbit_events.append_events(tx, ns, evs, now=now)

        self._patch(task_store, "task_insert_literal", insert_and_read_back)
        self._patch(orbit_events, "append_events_bulk", events)
        self._patch(submit_rows._FreshViews, "wire", lambda _self, res: res.wire())

    def __exit__(self, *exc: object) -> None:
        for obj, name, value in reversed(self.saved):
            setattr(obj, name, value)


async def _measure(
    db: Database,
    client: httpx.AsyncClient,
    boot: Any,
    headers: dict[str, str],
    mode: str,
    size: int,
    args: argparse.Namespace,
) -> dict[str, Any]:
    n_tasks = 0
    batches = 0
    deadline = time.perf_counter() + args.seconds
    start = time.perf_counter()
    while time.perf_counter() < deadline:
        items = _items(size, args.dedup)
        if mode.startswith("service"):
            raws = [_ENC.encode(i) for i in items]
            res = await submit.submit_batch(db, boot.namespace_id, boot.application_id, raws)
            body = res.json()
        else:
            r = await client.post(
                "/v1/namespaces/ns/tasks:batch", content=_ENC.encode({"tasks": items}),
                headers=headers,
            )  # fmt: skip
            assert r.status_code == 200, r.text[:300]
            body = r.json()
        created = sum(1 for it in body["items"] if it["status"] == 201)
        assert created == size, body["items"][:3]
        n_tasks += created
        batches += 1
    elapsed = time.perf_counter() - start
    fig = {
        "mode": mode,
        "size": size,
        "batches": batches,
        "tasks_per_s": round(n_tasks / elapsed, 1),
        "ms_per_batch": round(1000 * elapsed / batches, 2),
    }
    print(f"{mode:11} size={size:5} batches={batches:4} {fig['tasks_per_s']:>10,.1f} tasks/s "
          f"{fig['ms_per_batch']:8.2f} ms/batch  load={os.getloadavg()[0]:.2f}")  # fmt: skip
    return fig


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(prog="python -m bench.submit_micro")
    p.add_argument("--sizes", default="100,500,1000")
    p.add_argument("--seconds", type=float, default=3.0)
    p.add_argument("--rounds", type=int, default=1)
    p.add_argument("--mode", default="service,http")
    p.add_argument("--dedup", action="store_true")
    p.add_argument("--profile", default=None)
    args = p.parse_args(argv)
    args.sizes = [int(s) for s in args.sizes.split(",")]
    args.mode = [m.strip() for m in args.mode.split(",")]
    print(f"loadavg before: {os.getloadavg()}")
    if args.profile:
        from pyinstrument import Profiler

        profiler = Profiler(async_mode="enabled")
        profiler.start()
        asyncio.run(_run(args))
        profiler.stop()
        out = Path(args.profile)
        out.parent.mkdir(parents=True, exist_ok=True)
        out.write_text(profiler.output_html())
        out.with_suffix(".txt").write_text(profiler.output_text(unicode=False, color=False, show_all=True))
        from bench.output import scrub_file

        scrub_file(out)  # no machine paths in what is written
        scrub_file(out.with_suffix(".txt"))
        print(f"profile: {out}")
    else:
        asyncio.run(_run(args))
    print(f"loadavg after: {os.getloadavg()}")


if __name__ == "__main__":
    main()
