"""The bench's S1 (bench/scenarios.py: HTTP submits, single and batch → SDK workers over
WebSocket → a subscriber) on a private 3-node Galera cluster, as ratios to a single server
measured in the same run:

* ``single``: one ``orbit-server`` on one plain private MariaDB (orbit_cmd.devdb: durable
  commits, no binary log) — the reference.
* ``galera_one``: one ``orbit-server`` on node 0 of the cluster; the other two nodes only
  apply its write sets (every commit still waits for the group).
* ``galera_all``: three ``orbit-server``, one per node, each with a third of the load (its
  own tenant and queue, a worker process, a batch and a single-task producer), all at once:
  each namespace is written through one member.
* ``galera_all_one_namespace``: the same, but the three share one namespace (each its own
  queue): the namespace's result-event stream row and the application's quota usage are
  written through every member.

Per leg: results delivered per second, tasks completed per second, submit→result latency,
and the conflicts per task: Orbit's retries by kind (``certification`` = 1213 raised by
COMMIT) and the cluster's ``wsrep_local_cert_failures`` + ``wsrep_local_bf_aborts`` over the
leg, divided by the tasks completed.

    .venv/bin/python tests/cluster/cluster_bench.py --seconds 15   # on an otherwise idle machine

The machine of the report has 2 cores for everything (three database nodes, up to three
servers, workers, producers, the subscriber): the ratios say what replication costs in CPU
and waits there, not what three machines would do; the conflict rate is the figure that
carries over.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import re
import sys
import tempfile
import time
from dataclasses import replace
from pathlib import Path
from typing import Any

import httpx

HERE = Path(__file__).resolve().parent
ROOT = HERE.parents[1]
for extra in (ROOT, HERE):
    if str(extra) not in sys.path:
        sys.path.insert(0, str(extra))

from galera import GaleraCluster  # noqa: E402

from bench.env import ScratchDatabase, Server, proc_sample  # noqa: E402
from bench.scenarios import S1Config, Tenant, s1  # noqa: E402
from orbit.storage.dsn import DSN  # noqa: E402

_KIND = re.compile(r'^orbit_db_transaction_retries_by_kind_total\{kind="(\w+)"\} (\d+(?:\.\d+)?)', re.M)


def _cfg(seconds: float, share: int) -> S1Config:
    """S1's load, or a ``1/share`` part of it (for one of several servers at once)."""
    if share == 1:
        return S1Config(seconds=seconds, warmup=4.0, drain_s=30.0, ledger=False)
    return S1Config(seconds=seconds, warmup=4.0, drain_s=30.0, ledger=False, worker_processes=1,
                    sessions_per_process=3, concurrency=24, batch_clients=1, single_clients=1,
                    max_outstanding=400)  # fmt: skip


async def _retries(url: str) -> dict[str, float]:
    with contextlib.suppress(httpx.HTTPError):
        async with httpx.AsyncClient() as c:
            text = (await c.get(url + "/metrics", timeout=5)).text
        return {k: float(v) for k, v in _KIND.findall(text)}
    return {}


def _galera_conflicts(galera: GaleraCluster | None) -> int:
    if galera is None:
        return 0
    c = galera.counters()
    return c["wsrep_local_cert_failures"] + c["wsrep_local_bf_aborts"]


async def _stack(server_dsn: str, log: Path) -> tuple[ScratchDatabase, Server, Tenant]:
    db = ScratchDatabase(server_dsn=server_dsn)
    await asyncio.to_thread(db.create)
    await asyncio.to_thread(db.migrate)
    boot = await asyncio.to_thread(db.bootstrap, "bench", "bench")
    server = Server(db.url(), log_path=log)
    await server.start()
    return db, server, Tenant(server.url, boot["key"], boot["namespace"], boot["application_id"])


async def _leg(name: str, dsns: list[str], seconds: float, work: Path, galera: GaleraCluster | None,
               db_pids: list[int], *, shared: bool = False) -> dict[str, Any]:  # fmt: skip
    """S1 on one server per DSN at once (each a 1/len share of the load, one database): a
    tenant per server, or (``shared``) one namespace that every server writes (each S1 has
    its own queue and subscription)."""
    stacks = []
    if len(dsns) == 1:
        stacks.append(await _stack(dsns[0], work / f"{name}.log"))
    else:
        db = ScratchDatabase(server_dsn=dsns[0])
        await asyncio.to_thread(db.create)
        await asyncio.to_thread(db.migrate)
        one = await asyncio.to_thread(db.bootstrap, "bench", "bench") if shared else None
        for i, dsn in enumerate(dsns):
            boot = one or await asyncio.to_thread(db.bootstrap, f"bench{i}", f"bench{i}")
            node = DSN.parse(dsn)
            on_node = replace(db.dsn, host=node.host, port=node.port)  # this server's own node
            server = Server(on_node.url(hide_password=False), log_path=work / f"{name}-{i}.log")
            await server.start()
            stacks.append((db, server, Tenant(server.url, boot["key"], boot["namespace"], boot["application_id"])))
    try:
        r0 = [await _retries(s.url) for _, s, _ in stacks]
        g0 = _galera_conflicts(galera)
        c0 = [proc_sample(p).cpu_s for p in db_pids]
        t0 = time.monotonic()
        share = len(stacks)
        outs = await asyncio.gather(*(s1(server, t, db, _cfg(seconds, share)) for db, server, t in stacks))
        elapsed = time.monotonic() - t0
        g1 = _galera_conflicts(galera)
        c1 = [proc_sample(p).cpu_s for p in db_pids]
        r1 = [await _retries(s.url) for _, s, _ in stacks]
    finally:
        for _, server, _ in stacks:
            await server.stop()
        for db, _, _ in stacks[:1] if len(dsns) > 1 else stacks:
            await asyncio.to_thread(db.drop)
    kinds: dict[str, float] = {}
    for a, b in zip(r0, r1, strict=True):
        for k, v in b.items():
            kinds[k] = kinds.get(k, 0.0) + v - a.get(k, 0.0)
    completed = sum(o["completed_per_s"] * o["window_s"] for o in outs)
    lat = [o["submit_to_result_ms"] for o in outs]
    return {
        "servers": len(stacks),
        "tasks_per_s": round(sum(o["tasks_per_s"] for o in outs), 1),
        "completed_per_s": round(sum(o["completed_per_s"] for o in outs), 1),
        "p50_ms": [x.get("p50_ms") for x in lat],
        "p99_ms": [x.get("p99_ms") for x in lat],
        "retries_by_kind": {k: int(v) for k, v in sorted(kinds.items()) if v},
        "orbit_retries_per_task": round(sum(kinds.values()) / max(completed, 1), 4),
        "galera_conflicts": g1 - g0,
        "galera_conflicts_per_task": round((g1 - g0) / max(completed, 1), 4),
        "database_cpu_util": round(sum(b - a for a, b in zip(c0, c1, strict=True)) / elapsed, 2),
        "errors": sum(o["n_errors"] for o in outs),
        "load_avg": outs[0]["load_avg"],
    }


async def run(seconds: float, work: Path) -> dict[str, Any]:
    from orbit_cmd.devdb import start_dev_database

    out: dict[str, Any] = {"seconds": seconds, "legs": {}}
    root = Path(tempfile.mkdtemp(prefix="orbit-cluster-bench-"))
    single = await start_dev_database(root / "single", database="mysql", start_timeout=120)
    try:
        url = single.dsn.with_database("mysql").url(hide_password=False)
        out["legs"]["single"] = await _leg("single", [url], seconds, work, None, [single.pid])
    finally:
        await single.stop()
    galera = GaleraCluster(root / "galera")
    try:
        galera.start()
        urls = [n.dsn("mysql").url(hide_password=False) for n in galera.nodes]
        pids = [n.pid for n in galera.nodes if n.pid]
        out["legs"]["galera_one"] = await _leg("galera_one", urls[:1], seconds, work, galera, pids)
        out["legs"]["galera_all"] = await _leg("galera_all", urls, seconds, work, galera, pids)
        out["legs"]["galera_all_one_namespace"] = await _leg("galera_all_one_namespace", urls, seconds, work,
                                                             galera, pids, shared=True)  # fmt: skip
    finally:
        galera.stop()
    ref = out["legs"]["single"]["tasks_per_s"] or 1.0
    out["ratios"] = {k: round(v["tasks_per_s"] / ref, 3) for k, v in out["legs"].items()}
    return out


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--seconds", type=float, default=15.0)
    args = p.parse_args(argv)
    work = ROOT / ".orbit" / "cluster-bench" / time.strftime("run-%Y%m%d-%H%M%S")
    work.mkdir(parents=True, exist_ok=True)
    out = asyncio.run(run(args.seconds, work))
    (work / "result.json").write_text(json.dumps(out, indent=2, default=str))
    print(json.dumps(out, indent=2, default=str))
    return 0


if __name__ == "__main__":
    sys.exit(main())
