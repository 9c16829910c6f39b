"""A bounded chaos run: several ``orbit-server`` nodes on one database, SDK worker processes,
a producer, and faults; then checks of the history from the database and the workers' logs.

    python tests/chaos/chaos.py --minutes 20          # by hand (creates and drops a database)
    python tests/chaos/chaos.py --seconds 60 --keep   # keep the database for inspection

The CI form is tests/chaos/test_chaos.py (about a minute). Faults, at random moments:
SIGKILL of a worker mid-task (restarted a second later), SIGKILL of a server node (restarted
on the same port after two seconds; its workers reconnect to it), and ``KILL CONNECTION`` of
a server's database connection. The producer submits tasks with dedup keys (re-submitting
some identities) and ``Idempotency-Key``s (replaying some), half of them ``retry_safe``, and
cancels a few. After the faults stop, the run waits for the queue to settle and checks:

1. no task was started twice without a recorded lost attempt (started attempts ≤ 1 + LOST);
2. every SUCCEEDED task has exactly one applied receipt, on its last attempt;
3. every task is terminal, or NEEDS_REVIEW with ``effect_uncertain`` and a LOST attempt;
4. the queue and application usage counters equal a recount of the rows;
5. result event sequences of the namespace are 1..n without gap or duplicate, and every
   finished task has exactly one result event, of its final state;
6. no (task, generation) was started by two worker processes (the workers' own logs);
7. no dedup identity exists twice, and every Idempotency-Key replay returned the same task.

Everything counted goes into the returned :class:`ChaosResult` (and ``--json``).
"""

from __future__ import annotations

import argparse
import json
import os
import random
import signal
import subprocess
import sys
import threading
import time
from collections import Counter
from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import Any

import httpx

HERE = Path(__file__).resolve().parent
ROOT = HERE.parents[1]
for extra in (ROOT / "tests" / "reliability", ROOT / "tests", ROOT):
    if str(extra) not in sys.path:
        sys.path.insert(0, str(extra))

from reliability_support import (  # noqa: E402
    CliTenant,
    OrbitServer,
    cli_tenant,
    process_env,
    put_queue,
    query,
)

from orbit.storage import DSN  # noqa: E402

WORKER = r"""
import asyncio, os, random, sys
from orbit_sdk import Worker

base, key, ns, log = sys.argv[1:5]
out = open(log, "a", buffering=1)
worker = Worker(base, key, namespace=ns, max_concurrency=4, drain_timeout=1)

async def handle(ctx, payload):
    out.write(f"START {ctx.task_id} {ctx.generation} {os.getpid()}\n")
    await asyncio.sleep(random.uniform(0.02, 0.6))
    out.write(f"DONE {ctx.task_id} {ctx.generation} {os.getpid()}\n")
    return {"task": ctx.task_id, "generation": ctx.generation}

worker.register("chaos", "job", handle)
asyncio.run(worker.run(install_signal_handlers=False))
"""

TERMINAL = ("SUCCEEDED", "FAILED", "CANCELLED")


@dataclass
class ChaosResult:
    seconds: float = 0.0
    nodes: int = 0
    workers: int = 0
    submits: int = 0
    dedup_resubmits: int = 0
    idempotent_replays: int = 0
    cancels: int = 0
    tasks: int = 0
    http_errors: int = 0
    faults: Counter[str] = field(default_factory=Counter)
    states: Counter[str] = field(default_factory=Counter)
    attempts: Counter[str] = field(default_factory=Counter)
    starts_logged: int = 0
    result_events: int = 0
    anomalies: list[str] = field(default_factory=list)

    def to_json(self) -> dict[str, Any]:
        # (dataclasses.asdict would rebuild each Counter from (key, value) pairs)
        d = {f.name: getattr(self, f.name) for f in fields(self)}
        for k, v in d.items():
            if isinstance(v, Counter):
                d[k] = dict(v)
        d["anomalies_count"] = len(self.anomalies)
        return d


class Cluster:
    """The server nodes and worker processes of one run."""

    def __init__(self, dsn: DSN, work: Path, tenant: CliTenant, nodes: int, workers: int) -> None:
        self.dsn = dsn
        self.work = work
        self.tenant = tenant
        env = {"ORBIT_PULSE_RECOVERY_INTERVAL_MS": "300", "ORBIT_PULSE_DISPATCH_POLL_MS": "100"}
        self.nodes = [OrbitServer(dsn, work, env=env) for _ in range(nodes)]
        self.worker_logs = [work / f"worker-{i}.log" for i in range(workers)]
        self.workers: list[subprocess.Popen[bytes] | None] = [None] * workers
        self.lock = threading.Lock()

    def spawn_worker(self, i: int) -> None:
        node = self.nodes[i % len(self.nodes)]
        self.workers[i] = subprocess.Popen(
            [sys.executable, "-c", WORKER, node.url, self.tenant.key, self.tenant.namespace,
             str(self.worker_logs[i])],
            env=process_env(), stdout=subprocess.DEVNULL, stderr=open(self.work / f"worker-{i}.err", "ab"),  # noqa: SIM115
        )  # fmt: skip

    def urls(self) -> list[str]:
        return [n.url for n in self.nodes if n.alive()]

    def stop(self) -> None:
        for w in self.workers:
            if w is not None and w.poll() is None:
                w.kill()
                w.wait(10)
        for n in self.nodes:
            n.stop()


def _producer(cluster: Cluster, stop: threading.Event, res: ChaosResult, seen: dict[str, str],
              replays: list[tuple[str, str]], rng: random.Random) -> None:  # fmt: skip
    t = cluster.tenant
    client = httpx.Client(timeout=10)
    n = 0
    while not stop.is_set():
        urls = cluster.urls()
        if not urls:
            time.sleep(0.1)
            continue
        base = rng.choice(urls)
        ns = f"{base}/v1/namespaces/{t.namespace}"
        n += 1
        dedup = f"d{rng.randrange(max(1, n // 2 + 1))}" if rng.random() < 0.3 else f"u{n}"
        body = {"queue": "chaos", "kind": "job", "payload": {"n": n}, "dedup_key": dedup,
                "retry_safe": rng.random() < 0.5}  # fmt: skip
        headers = dict(t.auth)
        idem = f"k{n}"
        if rng.random() < 0.2 and replays:
            idem, _ = rng.choice(replays)
            body = None  # replay: same key, same body as the first time (stored below)
        try:
            if body is None:
                first_body = seen[f"idem:{idem}"]
                r = client.post(f"{ns}/tasks", content=first_body, headers={**headers, "Idempotency-Key": idem,
                                                                            "content-type": "application/json"})  # fmt: skip
                if r.status_code in (200, 201):
                    res.idempotent_replays += 1
                    task_id = r.json()["id"]
                    want = dict(replays)[idem]
                    if task_id != want:
                        res.anomalies.append(f"idempotency replay {idem} gave {task_id}, first {want}")
                else:
                    res.http_errors += 1
                continue
            raw = json.dumps(body)
            r = client.post(f"{ns}/tasks", content=raw, headers={**headers, "Idempotency-Key": idem,
                                                                 "content-type": "application/json"})  # fmt: skip
            if r.status_code not in (200, 201):
                res.http_errors += 1
                continue
            res.submits += 1
            task = r.json()
            if task.get("deduplicated"):
                res.dedup_resubmits += 1
            seen[f"idem:{idem}"] = raw
            replays.append((idem, task["id"]))
            seen[task["id"]] = dedup
            if rng.random() < 0.05:
                c = client.post(f"{ns}/tasks/{task['id']}/cancel", headers=headers)
                if c.status_code in (200, 202, 409):
                    res.cancels += 1
        except httpx.HTTPError:
            res.http_errors += 1  # a node died under us: the client retries elsewhere
        time.sleep(rng.uniform(0.0, 0.03))
    client.close()


def _faults(cluster: Cluster, stop: threading.Event, res: ChaosResult, rng: random.Random) -> None:
    while not stop.wait(rng.uniform(1.5, 3.0)):
        kind = rng.choice(["worker", "worker", "node", "connection"])
        if kind == "worker":
            i = rng.randrange(len(cluster.workers))
            w = cluster.workers[i]
            if w is not None and w.poll() is None:
                os.kill(w.pid, signal.SIGKILL)
                w.wait(10)
                res.faults["sigkill_worker"] += 1
                time.sleep(1.0)
                cluster.spawn_worker(i)
        elif kind == "node":
            node = rng.choice(cluster.nodes)
            if node.alive():
                node.stop(sig_kill=True)
                res.faults["sigkill_node"] += 1
                time.sleep(2.0)
                node.start()
        else:
            ids = query(cluster.dsn, "SELECT ID FROM information_schema.PROCESSLIST WHERE DB = %s"
                                     " AND ID <> CONNECTION_ID()", (cluster.dsn.database,))  # fmt: skip
            if ids:
                victim = rng.choice(ids)[0]
                try:
                    query(cluster.dsn, f"KILL CONNECTION {int(victim)}")
                    res.faults["kill_db_connection"] += 1
                except Exception:
                    pass


def check(dsn: DSN, t: CliTenant, res: ChaosResult, logs: list[Path]) -> None:
    """The history checks (module docstring), from the database and the workers' logs."""
    ns_row = query(dsn, "SELECT id FROM orbit_namespaces WHERE application_id = UNHEX(%s) AND name = %s",
                   (t.application_id, t.namespace))  # fmt: skip
    ns = ns_row[0][0]
    tasks = query(dsn, "SELECT id, state, effect_uncertain, attempts, dedup_key, owner_id, kind,"
                       " pipeline_version FROM pulse_tasks WHERE namespace_id = %s", (ns,))  # fmt: skip
    atts = query(dsn, "SELECT task_id, id, generation, state, started_at FROM pulse_attempts"
                      " WHERE namespace_id = %s", (ns,))  # fmt: skip
    receipts = query(dsn, "SELECT a.task_id, r.attempt_id, a.generation FROM pulse_attempt_receipts r"
                          " JOIN pulse_attempts a ON a.namespace_id = r.namespace_id AND a.id = r.attempt_id"
                          " WHERE r.namespace_id = %s", (ns,))  # fmt: skip
    events = query(dsn, "SELECT seq, task_id, state FROM orbit_result_events WHERE namespace_id = %s"
                        " ORDER BY seq", (ns,))  # fmt: skip
    res.tasks = len(tasks)
    res.result_events = len(events)
    by_task: dict[bytes, list[tuple[Any, ...]]] = {}
    for a in atts:
        by_task.setdefault(a[0], []).append(a)
        res.attempts[a[3]] += 1
    rec_by_task: dict[bytes, list[tuple[Any, ...]]] = {}
    for r in receipts:
        rec_by_task.setdefault(r[0], []).append(r)
    ev_by_task: dict[bytes, list[str]] = {}
    for _seq, tid, state in events:
        ev_by_task.setdefault(tid, []).append(state)
    identities = Counter((row[5], row[6], row[7], row[4]) for row in tasks if row[4] is not None)
    for ident, n in identities.items():
        if n > 1:
            res.anomalies.append(f"dedup identity {ident[3]} exists {n} times")
    for tid, state, uncertain, n_attempts, *_ in tasks:
        res.states[state] += 1
        hx = tid.hex()
        mine = by_task.get(tid, [])
        started = [a for a in mine if a[4] is not None]
        lost = [a for a in mine if a[3] == "LOST"]
        if len(started) > 1 + len(lost):
            res.anomalies.append(f"{hx}: {len(started)} starts, {len(lost)} lost")
        gens = [a[2] for a in started]
        if len(gens) != len(set(gens)):
            res.anomalies.append(f"{hx}: generation started twice {gens}")
        recs = rec_by_task.get(tid, [])
        if state == "SUCCEEDED" and (len(recs) != 1 or recs[0][2] != n_attempts):
            res.anomalies.append(f"{hx}: SUCCEEDED with receipts {recs} (attempts {n_attempts})")
        if state in TERMINAL and uncertain:
            res.anomalies.append(f"{hx}: {state} with effect_uncertain")
        if state == "NEEDS_REVIEW" and not (uncertain and lost):
            res.anomalies.append(f"{hx}: NEEDS_REVIEW without a lost attempt")
        if state not in (*TERMINAL, "NEEDS_REVIEW"):
            res.anomalies.append(f"{hx}: left {state}")
        evs = ev_by_task.get(tid, [])
        if state in (*TERMINAL, "NEEDS_REVIEW") and evs[-1:] != [state]:
            res.anomalies.append(f"{hx}: {state} but result events {evs}")
        if len(evs) != len(set(evs)) or len([e for e in evs if e in TERMINAL]) > 1:
            res.anomalies.append(f"{hx}: result events {evs}")
    seqs = [e[0] for e in events]
    if seqs != list(range(1, len(seqs) + 1)):
        res.anomalies.append(f"result event sequence not 1..{len(seqs)}: gaps/dups")
    # Usage counters = recount (queue usage; application usage).
    usage = query(dsn, "SELECT unfinished_tasks, reservations, active_attempts FROM pulse_queue_usage"
                       " WHERE namespace_id = %s", (ns,))  # fmt: skip
    recount = query(dsn, "SELECT COALESCE(SUM(state IN ('WAITING','LEASED','RUNNING','NEEDS_REVIEW')),0),"
                         " COALESCE(SUM(state = 'LEASED'),0), COALESCE(SUM(state = 'RUNNING'),0)"
                         " FROM pulse_tasks WHERE namespace_id = %s", (ns,))  # fmt: skip
    if [tuple(int(x) for x in u) for u in usage] != [tuple(int(x) for x in recount[0])]:
        res.anomalies.append(f"queue usage {usage} != recount {recount}")
    app = query(dsn, "SELECT unfinished_tasks, active_attempts, reservations FROM orbit_application_resources"
                     " WHERE application_id = UNHEX(%s)", (t.application_id,))  # fmt: skip
    want = recount[0]
    if app and (int(app[0][0]), int(app[0][1]), int(app[0][2])) != (int(want[0]), int(want[2]), int(want[1])):
        res.anomalies.append(f"application usage {app} != recount {want}")
    # The workers' own view: a (task, generation) started by one process only.
    starts: dict[tuple[str, str], set[str]] = {}
    for log in logs:
        if not log.exists():
            continue
        for line in log.read_text().splitlines():
            parts = line.split()
            if len(parts) == 4 and parts[0] == "START":
                res.starts_logged += 1
                starts.setdefault((parts[1], parts[2]), set()).add(parts[3])
    for (task, gen), pids in starts.items():
        if len(pids) > 1:
            res.anomalies.append(f"{task} generation {gen} started by {sorted(pids)}")


def run_chaos(dsn: DSN, work: Path, *, seconds: float, nodes: int = 3, workers: int = 3,
              seed: int | None = None, settle_s: float = 45.0) -> ChaosResult:  # fmt: skip
    rng = random.Random(seed)
    work.mkdir(parents=True, exist_ok=True)
    res = ChaosResult(nodes=nodes, workers=workers)
    t = cli_tenant(dsn, namespace="chaos")
    cluster = Cluster(dsn, work, t, nodes, workers)
    started = time.monotonic()
    cluster.nodes[0].start()
    put_queue(cluster.nodes[0].url, t, "chaos", lease_ms=2000,
              retry={"max_attempts": 6, "backoff_initial_ms": 100, "backoff_max_ms": 500,
                     "backoff_multiplier": 2})  # fmt: skip
    for n in cluster.nodes[1:]:
        n.start()
    for i in range(workers):
        cluster.spawn_worker(i)
    stop = threading.Event()
    seen: dict[str, str] = {}
    replays: list[tuple[str, str]] = []
    threads = [
        threading.Thread(target=_producer, args=(cluster, stop, res, seen, replays, rng)),
        threading.Thread(target=_faults, args=(cluster, stop, res, random.Random(rng.random()))),
    ]
    try:
        for th in threads:
            th.start()
        time.sleep(seconds)
        stop.set()
        for th in threads:
            th.join(30)
        # Settle: every node up, every worker alive, until nothing is WAITING/LEASED/RUNNING.
        for n in cluster.nodes:
            if not n.alive():
                n.start()
        for i, w in enumerate(cluster.workers):
            if w is None or w.poll() is not None:
                cluster.spawn_worker(i)
        deadline = time.monotonic() + settle_s
        while time.monotonic() < deadline:
            rows = query(dsn, "SELECT COUNT(*) FROM pulse_tasks t JOIN orbit_namespaces n ON n.id = t.namespace_id"
                              " WHERE n.application_id = UNHEX(%s) AND t.state IN ('WAITING','LEASED','RUNNING')",
                         (t.application_id,))  # fmt: skip
            if rows[0][0] == 0:
                break
            time.sleep(0.5)
    finally:
        stop.set()
        cluster.stop()
    res.seconds = round(time.monotonic() - started, 1)
    check(dsn, t, res, cluster.worker_logs)
    for i, node in enumerate(cluster.nodes):
        if "Traceback" in node.logs():
            res.anomalies.append(f"node {i} logged a traceback")
    return res


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--minutes", type=float, default=None, help="length of the fault phase")
    p.add_argument("--seconds", type=float, default=60.0)
    p.add_argument("--nodes", type=int, default=3)
    p.add_argument("--workers", type=int, default=3)
    p.add_argument("--seed", type=int, default=None)
    p.add_argument("--keep", action="store_true", help="keep the database afterwards")
    p.add_argument("--json", action="store_true")
    args = p.parse_args(argv)
    from conftest import create_database, drop_database

    from orbit import migrate

    dsn = create_database("orbit_chaos")
    migrate.up(dsn)
    work = ROOT / ".orbit" / "chaos" / dsn.database
    try:
        seconds = args.minutes * 60 if args.minutes is not None else args.seconds
        res = run_chaos(dsn, work, seconds=seconds, nodes=args.nodes, workers=args.workers, seed=args.seed)
    finally:
        if not args.keep:
            drop_database(dsn)
    out = res.to_json()
    print(json.dumps(out, indent=None if args.json else 2, default=str))
    print(f"{res.tasks} tasks, {sum(res.faults.values())} faults, {len(res.anomalies)} anomalies"
          f" (logs in {work})", file=sys.stderr)  # fmt: skip
    return 1 if res.anomalies else 0


if __name__ == "__main__":
    sys.exit(main())
