"""``python -m bench [--quick] [--only S1,S2,...] [--label NAME]``: run the suite and write
``reports/bench/<date>[-label].json`` and ``.md`` (+ PNG plots when matplotlib is
installed).

Full run (default, a few minutes): DB-limit baselines, peers (when installed, see
bench/README.md), S1, S2, S3, S4 (10k / 100k / 1M backlog), S5 (100 owners vs 1), S6.
``--quick`` (CI's regression guard, < 60 s): S1 and S2 short plus a short DB-limit; prints
the ratios and never fails on timing (exit 0 unless the suite itself broke).
"""

from __future__ import annotations

import argparse
import asyncio
import datetime as dt
import json
import os
import sys
import tempfile
import time
import traceback
from pathlib import Path
from typing import Any

from bench import dblimit, fairness, peers, report
from bench.env import ROOT, ScratchDatabase, Server, machine
from bench.fairness import S5Config
from bench.scenarios import (
    S1Config,
    Tenant,
    add_backlog,
    explain_dispatch,
    s1,
    s2,
    s3,
    settle,
)
from bench.subscriber_leg import subscriber_leg

ALL = ("DB", "PEERS", "S1", "S2", "S3", "S4", "S5", "S6")
QUICK = ("DB", "S1", "S2")


def parse(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="python -m bench", description=__doc__.splitlines()[0])
    p.add_argument("--quick", action="store_true", help="S1+S2 short (< 60 s), for CI")
    p.add_argument("--only", default=None, help=f"comma list of {','.join(ALL)}")
    p.add_argument("--label", default="", help="suffix of the report file names")
    p.add_argument("--out-dir", default=str(ROOT / "reports" / "bench"))
    p.add_argument("--s1-seconds", type=float, default=None)
    p.add_argument("--no-write", action="store_true", help="print only")
    p.add_argument("--profile", action="store_true", help="py-spy the server during S1")
    p.add_argument("--profile-dir", default=str(ROOT / "reports" / "profiles"),
                   help="where --profile writes s1-<label>.svg and s1-<label>-top.txt")  # fmt: skip
    p.add_argument(
        "--driver",
        default=None,
        choices=("aiomysql", "asyncmy"),
        help="the server's database driver (ORBIT_DB_DRIVER; default: the environment's, "
        "else aiomysql); the DB-limit baseline stays raw aiomysql",
    )
    p.add_argument(
        "--server-tree",
        default=None,
        help="serve (and run workers from) another checkout, e.g. a copy of the tree before "
        "a change, for a side-by-side run on the same machine state",
    )
    return p.parse_args(argv)


async def _run(args: argparse.Namespace) -> dict[str, Any]:
    want = set(QUICK if args.quick else ALL)
    if args.only:
        want = {x.strip().upper() for x in args.only.split(",")}
    quick = args.quick
    out: dict[str, Any] = {
        "started_at": dt.datetime.now(dt.UTC).isoformat(timespec="seconds"),
        "mode": "quick" if quick else "full",
        "machine": machine(),
        "raw": {},
        "load_by_step": {},
        "notes": [],
    }
    raw = out["raw"]
    db = ScratchDatabase()
    db.create()
    server: Server | None = None
    try:
        db.migrate()
        boot = db.bootstrap("bench", "bench", global_admin=True)  # S5 makes owners
        log_dir = Path(tempfile.gettempdir()) / "orbit-bench-logs"  # the server's stderr
        await asyncio.to_thread(log_dir.mkdir, parents=True, exist_ok=True)
        tree = args.server_tree_path
        driver = args.driver or os.environ.get("ORBIT_DB_DRIVER") or "aiomysql"
        server = Server(db.url(), log_path=log_dir / "server.log", tree=tree,
                        env={"ORBIT_DB_DRIVER": driver})  # fmt: skip
        out["server_tree"] = str(tree or ROOT)
        out["db_driver"] = driver
        await server.start()
        t = Tenant(server.url, boot["key"], boot["namespace"], boot["application_id"])
        raw["server_idle_rss_mb"] = round(server.sample().rss_kb / 1024, 1)

        async def step(name: str, coro: Any) -> Any:
            print(f"[bench] {name} ...", flush=True)
            began = time.monotonic()
            load0 = round(os.getloadavg()[0], 2)
            try:
                value = await coro
            except Exception as exc:
                traceback.print_exc()
                value = {"error": f"{type(exc).__name__}: {exc}"}
            print(f"[bench] {name} done in {time.monotonic() - began:.1f}s", flush=True)
            # How loaded the shared box was during this step (1-minute load average).
            out["load_by_step"][name] = [load0, round(os.getloadavg()[0], 2)]
            return value

        if "DB" in want:
            raw["db_limit"] = await step("DB limit", dblimit.run(db.dsn, 2.0 if quick else 6.0))
        if "PEERS" in want:
            raw["peers"] = await step("peers", peers.run_all(quick=quick))
        if "S2" in want:
            raw["s2"] = await step("S2", s2(server, t, n=30 if quick else 200))
        if "S1" in want:
            cfg = S1Config(seconds=20.0, warmup=4.0)
            if quick:
                cfg = S1Config(seconds=6.0, warmup=2.0, max_outstanding=300, drain_s=5.0)
            if args.s1_seconds:
                cfg.seconds = args.s1_seconds
            if args.profile:
                cfg.profile = str(Path(args.profile_dir) / f"s1-{args.label or 'run'}")
            raw["s1"] = await step("S1", s1(server, t, db, cfg))
        if "S3" in want:
            raw["s3"] = await step("S3", s3(t, 4.0 if quick else 8.0))
        if "S5" in want:  # before S4: S4 leaves a 1M backlog behind
            s5cfg = S5Config(seconds=6.0, warmup=2.0, drain_s=10.0) if quick else S5Config()
            if args.profile:
                s5cfg.profile = str(Path(args.profile_dir) / f"s5-{args.label or 'run'}")
            raw["s5"] = await step("S5", fairness.s5(server, t, db, s5cfg))
        if "S4" in want:
            raw["s4"] = await step("S4", _s4(server, t, db))
        if "S6" in want:
            raw["s6"] = await step("S6", _s6(server, t, db))
        if server.proc is not None:
            raw["server_final_rss_mb"] = round(server.sample().rss_kb / 1024, 1)
    finally:
        if server is not None:
            await server.stop()
        db.drop()
    out["finished_at"] = dt.datetime.now(dt.UTC).isoformat(timespec="seconds")
    out["machine"]["load_avg_end"] = [round(x, 2) for x in os.getloadavg()]
    out["ratios"] = report.ratios(raw)
    return out


async def _s4(server: Server, t: Tenant, db: ScratchDatabase) -> dict[str, Any]:
    """S1 (short) with 10k, 100k and 1M WAITING tasks (not due) in the same queue."""
    cfg_base = S1Config(seconds=10.0, warmup=3.0, max_outstanding=1000)
    queue = cfg_base.queue
    levels = [10_000, 100_000, 1_000_000]
    have = 0
    out: dict[str, Any] = {"queue": queue, "levels": {}}
    for level in levels:
        took = await add_backlog(db, t, queue, level - have)
        settled = await settle(db)  # the window measures the backlog, not its flush
        have = level
        cfg = S1Config(seconds=cfg_base.seconds, warmup=cfg_base.warmup, queue=queue,
                       max_outstanding=cfg_base.max_outstanding)  # fmt: skip
        fig = await s1(server, t, db, cfg)
        fig["backlog_insert_s"] = round(took, 1)
        fig["settle"] = settled
        fig["explain"] = await explain_dispatch(db, t, queue)
        # The subscriber leg alone at this backlog: a burst of result events handed out and
        # acked through one WebSocket subscriber (bench/subscriber_leg.py).
        fig["subscriber_leg"] = await subscriber_leg(server, t, db)
        out["levels"][str(level)] = fig
        print(f"[bench]   S4 {level}: {fig['tasks_per_s']} tasks/s; subscriber leg alone "
              f"{fig['subscriber_leg'].get('acked_per_s')} acks/s", flush=True)  # fmt: skip
    out["server_rss_mb_at_1m"] = round(server.sample().rss_kb / 1024, 1)
    return out


async def _s6(
    server: Server, t: Tenant, db: ScratchDatabase, sessions: int = 200
) -> dict[str, Any]:
    """Server RSS with ``sessions`` connected (idle) worker sessions, after S4 left its
    backlog (up to 1M WAITING tasks) in the table; CPU per 1,000 tasks comes from S1."""
    import httpx

    from bench.env import WorkerProcs
    from bench.scenarios import put_queue

    queue = "s6-idle"
    async with httpx.AsyncClient(timeout=30.0) as client:
        await put_queue(client, t, queue)
    before = server.sample().rss_kb
    procs = WorkerProcs()
    per_proc = 50
    procs.start(url=t.url, key=t.key, namespace=t.namespace, queue=queue,
                processes=max(1, sessions // per_proc), sessions=per_proc, concurrency=1)  # fmt: skip
    peak = before
    connected = 0
    try:
        for _ in range(60):  # up to 60 s for every session to connect
            await asyncio.sleep(1.0)
            peak = max(peak, server.sample().rss_kb)
            connected = await _connected_sessions(db)
            if connected >= sessions:
                break
        for _ in range(5):  # a few heartbeats' worth
            await asyncio.sleep(1.0)
            peak = max(peak, server.sample().rss_kb)
    finally:
        await procs.stop()
    return {
        "sessions_connected": connected,
        "rss_mb_before": round(before / 1024, 1),
        "rss_mb_with_sessions": round(peak / 1024, 1),
        "rss_mb_now": round(server.sample().rss_kb / 1024, 1),
    }


async def _connected_sessions(db: ScratchDatabase) -> int:
    ((n,),) = await db.query(
        "SELECT COUNT(*) FROM pulse_worker_sessions WHERE state = 'ACTIVE' AND node_id IS NOT NULL"
    )
    return int(n)


def main(argv: list[str] | None = None) -> int:
    args = parse(argv)
    args.server_tree_path = Path(args.server_tree).resolve() if args.server_tree else None
    out = asyncio.run(_run(args))
    text = report.markdown(out)
    print(text)
    print("ratios: " + json.dumps(out["ratios"]))
    if not args.no_write:
        paths = report.write(out, Path(args.out_dir), args.label or out["mode"])
        for p in paths:
            print(f"wrote {p}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
