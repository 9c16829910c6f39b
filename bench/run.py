"""``python -m bench [--quick] [--only S1,S2,...] [--publish]``: run the suite; write its
report (JSON, markdown, PNG plots when matplotlib is installed) to ``.orbit/bench/``, or
with ``--publish`` to ``reports/bench/<name>.*`` plus one line in
``reports/bench/history.jsonl``.

Full run (default): DB-limit baselines, peers (when installed, see bench/README.md), S1
(with ``--baseline-tree``: S1 of that checkout too), S2, S3, S5 (1 vs 100 owners, fairness
key), S4 (10k / 100k / 1M backlog), S6, S8, S7. ``--quick`` (CI's regression guard, about
a minute): a short DB limit, S1 and S2; prints the ratios and never fails on timing (exit 0
unless the suite itself broke). Everything runs on the bench's own MariaDB (bench/mariadb.py)
unless ``--dsn`` names another server.
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

from bench import dblimit, fairness, idle, output, peers, report
from bench.env import (
    DB,
    DEFAULT_SERVER_DSN,
    ROOT,
    RUNS_DIR,
    ScratchDatabase,
    Server,
    machine,
    server_pid,
)
from bench.fairness import S5Config
from bench.mariadb import PrivateMariaDB
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

ALL = ("DB", "PEERS", "S1", "S2", "S3", "S4", "S5", "S6", "S7", "S8")
QUICK = ("DB", "S1", "S2")
REPORTS = ROOT / "reports" / "bench"
PROFILES = ROOT / "reports" / "profiles"


def parse(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="python -m bench", description=__doc__.splitlines()[0])
    p.add_argument("--quick", action="store_true", help="DB limit + S1 + S2 short, for CI")
    p.add_argument("--only", default=None, help=f"comma list of {','.join(ALL)}")
    p.add_argument("--publish", action="store_true",
                   help="write reports/bench/<name>.* (+ profiles) and append to "
                   "reports/bench/history.jsonl; without it the run writes to .orbit/bench/")  # fmt: skip
    p.add_argument("--label", default="", help="suffix of an unpublished run's file names")
    p.add_argument("--out-dir", default=None, help="where an unpublished run writes")
    p.add_argument("--s1-seconds", type=float, default=None)
    p.add_argument("--s8-events", type=int, default=1_000_000,
                   help="result events in S8's namespace before the subscription")  # fmt: skip
    p.add_argument("--s7-namespaces", type=int, default=1000,
                   help="idle namespaces in S7 (fewer for a quick look; the target is at 1,000)")  # fmt: skip
    p.add_argument("--no-write", action="store_true", help="print only")
    p.add_argument("--profile", action="store_true",
                   help="py-spy the server during S1, S5 and S7's window at rest")  # fmt: skip
    p.add_argument(
        "--dsn",
        default="private",
        help="the database server: 'private' (default: the bench's own mariadbd, see "
        "bench/mariadb.py), 'shared' (ORBIT_BENCH_DSN / ORBIT_TEST_DSN / 127.0.0.1:3306), or "
        "a mysql:// URL; on another server than the bench's own, the ledger's counters "
        "include other clients' work and its index entries are not measured",
    )
    p.add_argument("--no-binlog", action="store_true",
                   help="the bench's own MariaDB without its binary log (no index entries)")  # fmt: skip
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
        help="serve another checkout (its server, migrations and bootstrap; the workers and "
        "clients stay this tree's SDK)",
    )
    p.add_argument(
        "--baseline-tree",
        default=None,
        help="also run S1 on this checkout (its own scratch database, migrated by it) right "
        "after S1: the s1_vs_baseline ratio (e.g. `git worktree add /tmp/orbit-main main`)",
    )
    return p.parse_args(argv)


async def _database(args: argparse.Namespace) -> tuple[PrivateMariaDB | None, dict[str, Any]]:
    """Point bench.env.DB at the run's database server; (the private instance, its
    description)."""
    if args.dsn == "private":
        inst = PrivateMariaDB(RUNS_DIR / f"mariadb-{os.getpid()}", binlog=not args.no_binlog)
        try:
            await inst.start()
        except Exception as exc:
            await inst.stop()
            url = DEFAULT_SERVER_DSN
            DB.use(url, pid=server_pid(url), exclusive=False, binlog=False, kind="shared")
            return None, {"kind": "shared", "description": f"the shared server at "
                          f"{DB.dsn.host}:{DB.dsn.port} (the bench's own MariaDB could not "
                          f"start: {exc})"}  # fmt: skip
        DB.use(inst.dsn.url(hide_password=False), pid=inst.pid, exclusive=True,
               binlog=inst.binlog, kind="private")  # fmt: skip
        log = "binary log ROW (NOBLOB) for the ledger" if inst.binlog else "no binary log"
        return inst, {"kind": "private", "version": inst.version, "description":
                      f"the bench's own MariaDB {inst.version} (mariadbd --no-defaults with "
                      f"utf8mb4 and no name resolution, compiled-in defaults otherwise; {log}), "
                      "fresh data folder, nothing else connected"}  # fmt: skip
    url = DEFAULT_SERVER_DSN if args.dsn == "shared" else args.dsn
    DB.use(url, pid=server_pid(url), exclusive=False, binlog=False, kind="shared")
    return None, {"kind": "shared", "description": f"the server at {DB.dsn.host}:{DB.dsn.port}, "
                  "shared with other clients (the ledger's counters include their work)"}  # fmt: skip


async def _run(args: argparse.Namespace) -> dict[str, Any]:
    want = set(QUICK if args.quick else ALL)
    if args.only:
        want = {x.strip().upper() for x in args.only.split(",")}
    quick = args.quick
    out: dict[str, Any] = {
        "started_at": dt.datetime.now(dt.UTC).isoformat(timespec="seconds"),
        "mode": "quick" if quick else "full",
        "raw": {},
        "load_by_step": {},
        "notes": [],
    }
    raw = out["raw"]
    instance, out["database"] = await _database(args)
    out["machine"] = machine()
    tree = args.server_tree_path
    out["commit"] = output.commit(tree)
    db = ScratchDatabase(tree=tree)
    server: Server | None = None
    log_dir = Path(tempfile.gettempdir()) / "orbit-bench-logs"  # the servers' stderr
    driver = args.driver or os.environ.get("ORBIT_DB_DRIVER") or "aiomysql"
    server_env = {"ORBIT_DB_DRIVER": driver}
    try:
        await asyncio.to_thread(db.create)
        await asyncio.to_thread(log_dir.mkdir, parents=True, exist_ok=True)
        await asyncio.to_thread(db.migrate)
        boot = await asyncio.to_thread(db.bootstrap, "bench", "bench", True)  # S5 makes owners
        server = Server(db.url(), log_path=log_dir / "server.log", tree=tree, env=server_env)
        out["server_tree"] = "another checkout (--server-tree)" if tree else "this checkout"
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
            cfg = _s1_config(args, quick)
            if args.profile:
                cfg.profile = str(args.profile_stem("s1-server"))
            raw["s1"] = await step("S1", s1(server, t, db, cfg))
            if args.baseline_tree:
                raw["s1_baseline"] = await step("S1 baseline", _s1_baseline(args, quick, log_dir,
                                                                            server_env))  # fmt: skip
                out["baseline_commit"] = output.commit(args.baseline_tree_path)
                if out["baseline_commit"] and out["baseline_commit"] == out["commit"]:
                    out["notes"].append(
                        "The baseline tree is the same commit as the served tree: "
                        "`s1_vs_baseline` is the run-to-run spread of S1, not a comparison."
                    )
        if "S3" in want:
            raw["s3"] = await step("S3", s3(t, 4.0 if quick else 8.0))
        if "S5" in want:  # before S4: S4 leaves a 1M backlog behind
            s5cfg = S5Config(seconds=6.0, warmup=2.0, drain_s=10.0) if quick else S5Config()
            if args.profile:
                s5cfg.profile = str(args.profile_stem("s5"))
            raw["s5"] = await step("S5", fairness.s5(server, t, db, s5cfg))
        if "S4" in want:
            raw["s4"] = await step("S4", _s4(server, t, db))
        if "S6" in want:
            raw["s6"] = await step("S6", _s6(server, t, db))
        if server.proc is not None:
            raw["server_final_rss_mb"] = round(server.sample().rss_kb / 1024, 1)
        await server.stop()
        if "S8" in want:
            raw["s8"] = await step(
                "S8", idle.s8(events=args.s8_events, log_path=log_dir / "server-s8.log", tree=tree)
            )
        if "S7" in want:
            s7_profile = str(args.profile_stem("s7-server")) if args.profile else None
            raw["s7"] = await step("S7", idle.s7(namespaces=args.s7_namespaces,
                                                 log_path=log_dir / "server-s7.log", tree=tree,
                                                 window_s=10.0 if quick else 30.0,
                                                 profile=s7_profile))  # fmt: skip
    finally:
        if server is not None:
            await server.stop()
        await asyncio.to_thread(db.drop)
        if instance is not None:
            await instance.stop()
    out["finished_at"] = dt.datetime.now(dt.UTC).isoformat(timespec="seconds")
    out["machine"]["load_avg_end"] = [round(x, 2) for x in os.getloadavg()]
    out["ratios"] = report.ratios(raw)
    return out


def _s1_config(args: argparse.Namespace, quick: bool) -> S1Config:
    cfg = S1Config(seconds=20.0, warmup=4.0)
    if quick:
        cfg = S1Config(seconds=6.0, warmup=2.0, max_outstanding=300, drain_s=5.0)
    if args.s1_seconds:
        cfg.seconds = args.s1_seconds
    return cfg


async def _s1_baseline(args: argparse.Namespace, quick: bool, log_dir: Path,
                       env: dict[str, str]) -> dict[str, Any]:  # fmt: skip
    """S1 on the ``--baseline-tree`` checkout: its own scratch database and server."""
    tree = args.baseline_tree_path
    async with idle.fresh_stack(log_dir / "server-baseline.log", tree, env) as (db, server, t):
        return await s1(server, t, db, _s1_config(args, quick))


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
    args.baseline_tree_path = Path(args.baseline_tree).resolve() if args.baseline_tree else None
    only = [x.strip() for x in args.only.split(",")] if args.only else None
    name = output.run_name("quick" if args.quick else "full", only)
    stamp = dt.datetime.now().strftime("%Y-%m-%dT%H%M")
    stem = name if args.publish else f"{stamp}-{args.label or name}"
    out_dir = REPORTS if args.publish else Path(args.out_dir or RUNS_DIR)
    prof_dir = PROFILES if args.publish else out_dir / f"{stem}-profiles"
    args.profile_stem = lambda part: prof_dir / part
    out = asyncio.run(_run(args))
    for fig in _profiles(out):
        for key in ("svg", "top"):
            if isinstance(fig.get(key), str):
                output.scrub_file(Path(fig[key]))
    text = report.markdown(output.scrub_obj(out))
    print(output.scrub(text))
    print("ratios: " + json.dumps(out["ratios"]))
    if not args.no_write:
        paths = report.write(out, out_dir, stem)
        if args.publish:
            output.append_history(REPORTS / "history.jsonl", output.history_line(out, name))
            paths.append(REPORTS / "history.jsonl")
        for p in paths:
            print(f"wrote {output.scrub(str(p))}")
    return 0


def _profiles(out: dict[str, Any]) -> list[dict[str, Any]]:
    raw = out.get("raw") or {}
    found = [report._get(raw, "s1", "profile"), report._get(raw, "s5", "owners_1", "profile"),
             report._get(raw, "s5", "owners_100", "profile"), report._get(raw, "s7", "profile")]  # fmt: skip
    return [f for f in found if isinstance(f, dict)]


if __name__ == "__main__":
    sys.exit(main())
