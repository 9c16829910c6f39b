"""A chaos run: several ``orbit-server`` nodes on one database, SDK worker processes, a
producer, a workflow driver, two subscriber processes, a schedule, and faults; then the
history checker (tests/chaos/history.py) over every client's log and the database.

    python tests/chaos/chaos.py --minutes 20          # by hand (a private MariaDB, removed after)
    python tests/chaos/chaos.py --seconds 60 --keep   # keep the private database's folder
    python tests/chaos/chaos.py --shared-db           # on the shared MariaDB (no DB restart)

The CI form is tests/chaos/test_chaos.py. **The database is private**: a ``mariadbd`` started
for the run by :mod:`orbit_cmd.devdb` under its own folder, port and socket (never the shared
server at 127.0.0.1:3306, which other test suites use), so it can be restarted mid-run.

Workload: submits with dedup keys (re-submitting some identities) and ``Idempotency-Key``s
(replaying some), half of them ``retry_safe``, a few cancels; an ``every_ms`` schedule
(1 s) on the same queue; workflow instances of ``task → wait_signal → task`` started with
business keys (some started twice) and signalled (some signals sent twice); a subscriber
process applying every result event to an inbox (the docs/examples/inbox tables, in a
second database of the private server) and acking after commit; a second subscriber on a
subscription that never acks (small ``ack_timeout_ms`` and ``max_deliveries``).

Faults, drawn from a shuffled deck so every kind happens in a bounded run: SIGKILL of a
worker mid-task (restarted a second later); SIGKILL of a server node (restarted on the same
port); ``KILL CONNECTION`` of a server's database connection; SIGSTOP of a worker for longer
than its lease plus recovery, then SIGCONT (its late reports must be refused as stale and
kept as evidence); SIGKILL of the inbox subscriber (restarted); a database restart (the
private ``mariadbd`` stopped — SIGTERM or SIGKILL, alternately — for two seconds and started
again on the same port; the servers are not restarted).

After the faults stop the run pauses the schedule, signals every instance, brings every
process back and waits until the queue, the workflows and both subscriptions settle; then
it checks the history (every check is listed in history.py). Everything counted goes into
the returned :class:`ChaosResult` (and ``--json``).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import random
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import Any

import httpx
import pymysql

HERE = Path(__file__).resolve().parent
ROOT = HERE.parents[1]
for extra in (ROOT / "tests" / "reliability", ROOT / "tests", ROOT, HERE):
    if str(extra) not in sys.path:
        sys.path.insert(0, str(extra))

import history  # noqa: E402
from reliability_support import (  # noqa: E402
    CliTenant,
    OrbitServer,
    cli_tenant,
    process_env,
    put_queue,
    query,
)

from orbit.storage import DSN  # noqa: E402

LEASE_MS = 2000
SCHEDULE_EVERY_MS = 1000
NOACK_BUDGET = 3
#: The producer's pace: at most this many submits a second (ORBIT_CHAOS_SUBMITS_PER_S). The
#: workers' capacity is fixed (about 20 tasks a second here); an unpaced producer on a fast
#: server outruns it, the backlog grows for the whole run and cannot drain in the settle.
SUBMITS_PER_S = float(os.environ.get("ORBIT_CHAOS_SUBMITS_PER_S", "12"))

WORKER = r"""
import asyncio, logging, os, random, sys
sys.path.insert(0, os.environ["CHAOS_DIR"])
from history import Recorder
from orbit_sdk import Worker

base, key, ns, log, name = sys.argv[1:6]
rec = Recorder(log, name)

class Reports(logging.Handler):
    # The SDK logs what the server answered to each report: receipts (DEBUG), stale tokens.
    def emit(self, r):
        msg, a = r.msg, r.args or ()
        if not isinstance(msg, str) or not a:
            return
        if msg.startswith("attempt %s: receipt %s"):
            rec("wreceipt", attempt=a[0], receipt=a[1], outcome=str(a[2]), task_state=str(a[3]))
        elif "execution token is stale" in msg:
            rec("wstale", attempt=a[0])
        elif msg.startswith("attempt %s: report not delivered"):
            rec("wlost", attempt=a[0])
        elif msg.startswith("attempt %s: report rejected:"):
            rec("wrejected", attempt=a[0], code=str(a[1]))

sdk = logging.getLogger("orbit_sdk.worker")
sdk.setLevel(logging.DEBUG)
sdk.addHandler(Reports())
worker = Worker(base, key, namespace=ns, max_concurrency=4, drain_timeout=1)

async def handle(ctx, payload):
    rec("wstart", task=ctx.task_id, gen=ctx.generation, attempt=ctx.attempt_id, pid=os.getpid(), kind=ctx.kind)
    slow = isinstance(payload, dict) and payload.get("slow")
    await asyncio.sleep(1.5 if slow else random.uniform(0.02, 0.6))
    rec("wdone", task=ctx.task_id, gen=ctx.generation, attempt=ctx.attempt_id)
    return {"task": ctx.task_id, "generation": ctx.generation}

for kind in ("job", "wf_a", "wf_b"):
    worker.register("chaos", kind, handle)
asyncio.run(worker.run(install_signal_handlers=False))
"""

SUBSCRIBER = r"""
import asyncio, importlib.util, json, os, sys
sys.path.insert(0, os.environ["CHAOS_DIR"])
from history import Recorder
from orbit_sdk import Subscriber

base, key, ns, sub_name, log, name, inbox_dsn, example = sys.argv[1:9]
rec = Recorder(log, name)

async def open_inbox():
    spec = importlib.util.spec_from_file_location("inbox_example", example)
    mod = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = mod
    spec.loader.exec_module(mod)
    while True:  # the database may be restarting right now
        try:
            return await mod.Inbox.open(inbox_dsn)
        except Exception as exc:
            rec("inbox_error", sub=sub_name, event_id=None, error=type(exc).__name__)
            await asyncio.sleep(0.5)

async def consume(inbox):
    async with Subscriber(base, key, ns, sub_name) as sub:
        async for d in sub:
            rec("delivery", sub=sub_name, delivery_id=d.delivery_id, event_id=d.event_id, seq=d.seq,
                attempt=d.attempt)
            if inbox is None:
                continue  # the subscriber that never acks
            event = json.loads(d.raw_event)
            applied = None
            for _ in range(120):  # the inbox database may be restarting
                try:
                    applied = await inbox.apply(d.event_id, event)
                    break
                except Exception as exc:
                    rec("inbox_error", sub=sub_name, event_id=d.event_id, error=type(exc).__name__)
                    await asyncio.sleep(0.5)
            if applied is None:
                continue  # not applied, not acked: it comes again
            rec("inbox_apply", sub=sub_name, event_id=d.event_id, applied=applied)
            try:
                sent = await d.ack()
                rec("ack", sub=sub_name, delivery_id=d.delivery_id, sent=sent)
            except Exception as exc:
                rec("ack_error", sub=sub_name, delivery_id=d.delivery_id, error=type(exc).__name__)

async def main():
    inbox = await open_inbox() if inbox_dsn != "-" else None
    while True:
        try:
            await consume(inbox)
        except Exception as exc:  # the SDK gave up: note it, start a new Subscriber
            rec("subscriber_error", sub=sub_name, error=f"{type(exc).__name__}: {exc}"[:300])
            await asyncio.sleep(1)

asyncio.run(main())
"""

WORKFLOW = {
    "steps": [
        {"id": "a", "type": "task", "queue": "chaos", "kind": "wf_a", "retry_safe": True},
        {"id": "wait", "type": "wait_signal", "signal": "go"},
        {"id": "b", "type": "task", "queue": "chaos", "kind": "wf_b", "retry_safe": True},
    ]
}


@dataclass
class ChaosResult:
    seconds: float = 0.0
    nodes: int = 0
    workers: int = 0
    private_db: bool = False
    submits: int = 0
    dedup_resubmits: int = 0
    idempotent_replays: int = 0
    cancels: int = 0
    workflow_starts: int = 0
    workflow_dedup_starts: int = 0
    signals: int = 0
    signal_replays: int = 0
    #: Submits whose answer the client never saw (an error, a 5xx) sent again with the same
    #: Idempotency-Key and body; how many of those the server answered as a replay (the
    #: first one had committed after all).
    resends: int = 0
    resends_replayed: int = 0
    tasks: int = 0
    http_errors: int = 0
    http_5xx: Counter[str] = field(default_factory=Counter)
    #: (monotonic time, node base URL, reason) of every 503 a client got ("503 windows").
    unavailable: list[tuple[float, str, str]] = field(default_factory=list)
    faults: Counter[str] = field(default_factory=Counter)
    states: Counter[str] = field(default_factory=Counter)
    attempts: Counter[str] = field(default_factory=Counter)
    operations: int = 0
    result_events: int = 0
    settled: bool = False
    figures: dict[str, Any] = field(default_factory=dict)
    anomalies: list[str] = field(default_factory=list)

    def to_json(self) -> dict[str, Any]:
        d = {f.name: getattr(self, f.name) for f in fields(self) if f.name != "unavailable"}
        for k, v in d.items():
            if isinstance(v, Counter):
                d[k] = dict(v)
        d["figures"] = {k: dict(v) if isinstance(v, Counter) else v for k, v in self.figures.items()}
        d["anomalies_count"] = len(self.anomalies)
        return d


@dataclass
class ChaosHooks:
    """How a run on another database topology (tests/cluster/cluster_chaos.py) extends it.

    ``node_dsns``: server node ``i`` connects to ``node_dsns[i % len]`` (default: every node to
    ``dsn``). ``faults``: extra fault kinds for the deck, each ``fn(cluster, rec, res, rng)``,
    dealt like the others (blocking the fault thread while it lasts). ``revive``: called
    before the settle phase (heal partitions, restart database nodes). ``watchers``: threads
    ``fn(cluster, stop)`` that run for the whole run (e.g. sample counters)."""

    node_dsns: list[DSN] | None = None
    faults: dict[str, Callable[[Any, history.Recorder, ChaosResult, random.Random], None]] = field(default_factory=dict)
    revive: Callable[[Any], None] | None = None
    watchers: list[Callable[[Any, threading.Event], None]] = field(default_factory=list)


# --------------------------------------------------------------------------------------------
# The private database


class PrivateDatabase:
    """A private ``mariadbd`` (orbit_cmd.devdb) that the run may stop and start again."""

    def __init__(self, root: Path, database: str = "orbit_chaos") -> None:
        self.root = root
        self.database = database
        self.dev: Any = None
        self.restarts = 0

    def start(self) -> DSN:
        from orbit_cmd.devdb import start_dev_database

        self.dev = asyncio.run(start_dev_database(self.root, database=self.database, start_timeout=120))
        return self.dev.dsn  # type: ignore[no-any-return]

    def stop(self, kill: bool = False) -> None:
        if self.dev is None:
            return
        if kill:
            with contextlib.suppress(ProcessLookupError):
                os.kill(self.dev.pid, signal.SIGKILL)
        self.dev.stop_sync(grace=30)

    def restart(self, down_s: float, kill: bool) -> DSN:
        before = self.dev.dsn
        self.stop(kill=kill)
        time.sleep(down_s)
        after = self.start()
        self.restarts += 1
        if (after.host, after.port) != (before.host, before.port):
            raise RuntimeError(f"the private database came back on {after.port}, not {before.port}")
        return after

    def create(self, name: str) -> DSN:
        dsn: DSN = self.dev.dsn
        query(dsn.with_database("mysql"),
              f"CREATE DATABASE IF NOT EXISTS `{name}` CHARACTER SET utf8mb4 COLLATE utf8mb4_bin")  # fmt: skip
        return dsn.with_database(name)


# --------------------------------------------------------------------------------------------
# A frozen copy of the code

#: What the server, CLI, SDK processes of a run import. Other engineers edit the working tree
#: while a long run goes on (a migration file changed on disk makes a restarted node refuse
#: to start; a half-edited module would run mixed versions), so a run copies it once.
TREE = ("orbit", "pulse", "weave", "cmd", "migrations", "sdk/python", "docs/examples/inbox")


def freeze_tree(dest: Path) -> dict[str, str]:
    """Copy the code to ``dest``; return the environment that makes child processes use it."""
    for part in TREE:
        shutil.copytree(ROOT / part, dest / part, ignore=shutil.ignore_patterns("__pycache__", "*.pyc"))
    return {
        "PYTHONPATH": os.pathsep.join(str(dest / p) for p in ("", "cmd", "sdk/python")),
        "ORBIT_MIGRATIONS_DIR": str(dest / "migrations"),
        "CHAOS_TREE": str(dest),
    }


def tree_cwd(tree_env: dict[str, str] | None) -> Path | None:
    """The folder child processes run in: the frozen copy (``python -m``/``-c`` put the
    working directory first on ``sys.path``, before ``PYTHONPATH``)."""
    return Path(tree_env["CHAOS_TREE"]) if tree_env and "CHAOS_TREE" in tree_env else None


def migrate_up(dsn: DSN, tree_env: dict[str, str]) -> None:
    r = subprocess.run([sys.executable, "-m", "orbit_cmd.migrate", "--dsn", dsn.url(hide_password=False), "up"],
                       env=process_env(**tree_env), capture_output=True, text=True, timeout=300, check=False,
                       cwd=tree_cwd(tree_env))  # fmt: skip
    if r.returncode != 0:
        raise RuntimeError(f"orbit-migrate up failed: {r.stdout}{r.stderr}")


# --------------------------------------------------------------------------------------------
# The processes


class Cluster:
    """The server nodes, worker and subscriber processes of one run."""

    def __init__(self, dsn: DSN, work: Path, tenant: CliTenant, nodes: int, workers: int,
                 inbox_dsn: DSN | None, tree_env: dict[str, str] | None = None,
                 node_dsns: list[DSN] | None = None) -> None:  # fmt: skip
        self.dsn = dsn
        #: The database each server node connects to (a cluster: one node each).
        self.node_dsns = node_dsns or [dsn]
        self.work = work
        self.tenant = tenant
        self.inbox_dsn = inbox_dsn
        env = {"ORBIT_PULSE_RECOVERY_INTERVAL_MS": "300", "ORBIT_PULSE_DISPATCH_POLL_MS": "100",
               "ORBIT_WEAVE_ADVANCER_POLL_MS": "200", **(tree_env or {})}  # fmt: skip
        self.tree_env = tree_env or {}
        self.cwd = tree_cwd(tree_env)
        self.nodes = [OrbitServer(self.node_dsns[i % len(self.node_dsns)], work, env=env, cwd=self.cwd)
                      for i in range(nodes)]  # fmt: skip
        self.workers: list[subprocess.Popen[bytes] | None] = [None] * workers
        self.worker_logs: list[Path | None] = [None] * workers
        self.subscribers: dict[str, subprocess.Popen[bytes] | None] = {"inbox": None, "noack": None}
        self.logs: list[Path] = []
        self.spawned: Counter[str] = Counter()

    def _log(self, name: str) -> Path:
        path = self.work / f"{name}.jsonl"
        if path not in self.logs:
            self.logs.append(path)
        return path

    def _env(self) -> dict[str, str]:
        return process_env(CHAOS_DIR=str(HERE), **self.tree_env)

    def spawn_worker(self, i: int) -> None:
        node = self.nodes[i % len(self.nodes)]
        self.spawned["worker"] += 1
        name = f"worker-{i}.{self.spawned['worker']}"
        self.worker_logs[i] = self._log(name)
        self.workers[i] = subprocess.Popen(
            [sys.executable, "-c", WORKER, node.url, self.tenant.key, self.tenant.namespace,
             str(self._log(name)), name],
            env=self._env(), stdout=subprocess.DEVNULL, stderr=open(self.work / f"worker-{i}.err", "ab"),  # noqa: SIM115
            cwd=self.cwd,
        )  # fmt: skip

    def spawn_subscriber(self, sub: str) -> None:
        node = self.nodes[1 % len(self.nodes)] if sub == "inbox" else self.nodes[-1]
        self.spawned[sub] += 1
        name = f"sub-{sub}.{self.spawned[sub]}"
        inbox = self.inbox_dsn.url(hide_password=False) if sub == "inbox" and self.inbox_dsn else "-"
        tree = Path(self.tree_env.get("CHAOS_TREE", ROOT))
        example = str(tree / "docs" / "examples" / "inbox" / "inbox.py")
        self.subscribers[sub] = subprocess.Popen(
            [sys.executable, "-c", SUBSCRIBER, node.url, self.tenant.key, self.tenant.namespace, sub,
             str(self._log(name)), name, inbox, example],
            env=self._env(), stdout=subprocess.DEVNULL, stderr=open(self.work / f"{name}.err", "ab"),  # noqa: SIM115
            cwd=self.cwd,
        )  # fmt: skip

    def urls(self) -> list[str]:
        return [n.url for n in self.nodes if n.alive()]

    def revive(self) -> None:
        for n in self.nodes:
            if not n.alive():
                n.start(timeout=60)
        for i, w in enumerate(self.workers):
            if w is None or w.poll() is not None:
                self.spawn_worker(i)
            else:
                os.kill(w.pid, signal.SIGCONT)  # harmless when it runs
        for sub, p in self.subscribers.items():
            if p is None or p.poll() is not None:
                self.spawn_subscriber(sub)

    def stop(self) -> None:
        for p in [*self.workers, *self.subscribers.values()]:
            if p is not None and p.poll() is None:
                p.kill()
                p.wait(10)
        for n in self.nodes:
            n.stop()


# --------------------------------------------------------------------------------------------
# Clients


def _count_5xx(res: ChaosResult, r: httpx.Response, what: str) -> None:
    if r.status_code >= 500:
        res.http_5xx[f"{what} {r.status_code}"] += 1
    if r.status_code == 503:
        try:
            reason = str(r.json()["error"]["details"].get("reason", ""))
        except (ValueError, KeyError, TypeError, AttributeError):
            reason = ""
        res.unavailable.append((time.monotonic(), f"{r.request.url.scheme}://{r.request.url.netloc.decode()}", reason))


def _producer(cluster: Cluster, stop: threading.Event, res: ChaosResult, rec: history.Recorder,
              rng: random.Random) -> None:  # fmt: skip
    t = cluster.tenant
    client = httpx.Client(timeout=10)
    first_body: dict[str, str] = {}
    first_task: list[tuple[str, str]] = []
    unsent: list[tuple[str, str]] = []  # (key, body) of submits whose answer was never seen
    n = 0
    next_at = time.monotonic()
    while not stop.is_set():
        next_at += 1.0 / SUBMITS_PER_S
        if (wait := next_at - time.monotonic()) > 0:
            stop.wait(wait)
        else:
            next_at = time.monotonic()  # behind (a node was down): no burst to catch up
        urls = cluster.urls()
        if not urls:
            time.sleep(0.1)
            continue
        ns = f"{rng.choice(urls)}/v1/namespaces/{t.namespace}"
        n += 1
        headers = {**t.auth, "content-type": "application/json"}
        resend = False
        if unsent and rng.random() < 0.5:
            idem, raw = unsent.pop(rng.randrange(len(unsent)))  # as a client retries a failure
            replay, resend = False, True
        elif rng.random() < 0.2 and first_task:
            idem, _ = rng.choice(first_task)
            raw, replay = first_body[idem], True  # replay: same key, same body as the first time
        else:
            dedup = f"d{rng.randrange(max(1, n // 2 + 1))}" if rng.random() < 0.3 else f"u{n}"
            body = {"queue": "chaos", "kind": "job", "payload": {"n": n, "slow": rng.random() < 0.1}, "dedup_key": dedup,
                    "retry_safe": rng.random() < 0.5}  # fmt: skip
            idem, raw, replay = f"k{n}", json.dumps(body), False
        dedup = json.loads(raw)["dedup_key"]
        t0 = time.monotonic()
        rec("submit", phase="invoke", idem=idem, dedup=dedup, replay=replay, resend=resend)
        try:
            r = client.post(f"{ns}/tasks", content=raw, headers={**headers, "Idempotency-Key": idem})
        except httpx.HTTPError as exc:
            rec("submit", phase="fail", idem=idem, dedup=dedup, error=type(exc).__name__)
            res.http_errors += 1  # a node died under us: the client sends it again later
            if not replay:
                unsent.append((idem, raw))
            continue
        _count_5xx(res, r, "submit")
        if r.status_code not in (200, 201):
            rec("submit", phase="fail", idem=idem, dedup=dedup, status=r.status_code)
            res.http_errors += 1
            if not replay and r.status_code >= 500:
                unsent.append((idem, raw))
            continue
        if resend:
            res.resends += 1
            if r.headers.get("idempotent-replayed") == "true":
                res.resends_replayed += 1
        task = r.json()
        rec("submit", phase="ok", idem=idem, dedup=dedup, task=task["id"], replay=replay,
            deduplicated=bool(task.get("deduplicated")), invoked_at=t0, status=r.status_code)  # fmt: skip
        if replay:
            res.idempotent_replays += 1
            continue
        res.submits += 1
        if task.get("deduplicated"):
            res.dedup_resubmits += 1
        first_body[idem] = raw
        first_task.append((idem, task["id"]))
        if rng.random() < 0.05:
            rec("cancel", phase="invoke", task=task["id"])
            try:
                c = client.post(f"{ns}/tasks/{task['id']}/cancel", headers=t.auth)
            except httpx.HTTPError:
                res.http_errors += 1
                continue
            _count_5xx(res, c, "cancel")
            if c.status_code in (200, 202, 409):
                res.cancels += 1
                state = c.json().get("state") if c.status_code in (200, 202) else None
                rec("cancel", phase="ok", task=task["id"], status=c.status_code, state=state)
        time.sleep(rng.uniform(0.0, 0.03))
    client.close()


class WorkflowDriver:
    """Starts instances (some business keys twice) and signals them (some signals twice)."""

    def __init__(self, cluster: Cluster, res: ChaosResult, rec: history.Recorder, rng: random.Random) -> None:
        self.cluster = cluster
        self.res = res
        self.rec = rec
        self.rng = rng
        self.instances: dict[str, str] = {}  # business key -> instance id
        self.signalled: set[str] = set()
        #: Business keys whose start the client never saw succeed (an error, a 5xx, a node
        #: killed after COMMIT): the instance may exist. Re-started with the same business
        #: key (idempotent: the existing instance comes back) so it gets its signal.
        self.unconfirmed: set[str] = set()
        self.client = httpx.Client(timeout=10)

    def _ns(self) -> str | None:
        urls = self.cluster.urls()
        return f"{self.rng.choice(urls)}/v1/namespaces/{self.cluster.tenant.namespace}" if urls else None

    def start(self, key: str) -> None:
        ns = self._ns()
        if ns is None:
            return
        try:
            r = self.client.post(f"{ns}/workflows/chaos_flow/instances", json={"input": {"k": key}, "business_key": key},
                                 headers=self.cluster.tenant.auth)  # fmt: skip
        except httpx.HTTPError:
            self.res.http_errors += 1
            self.unconfirmed.add(key)
            return
        _count_5xx(self.res, r, "wf_start")
        if r.status_code not in (200, 201):
            self.res.http_errors += 1
            self.unconfirmed.add(key)
            return
        self.unconfirmed.discard(key)
        j = r.json()
        self.rec("wf_start", business_key=key, instance=j["id"], deduplicated=bool(j.get("deduplicated")))
        if j.get("deduplicated"):
            self.res.workflow_dedup_starts += 1
        else:
            self.res.workflow_starts += 1
        self.instances.setdefault(key, j["id"])

    def signal(self, key: str) -> bool:
        ns = self._ns()
        iid = self.instances.get(key)
        if ns is None or iid is None:
            return False
        sig = f"go-{key}"
        try:
            r = self.client.post(f"{ns}/instances/{iid}/signals/go", json={"signal_id": sig, "payload": {"k": key}},
                                 headers=self.cluster.tenant.auth)  # fmt: skip
        except httpx.HTTPError:
            self.res.http_errors += 1
            return False
        _count_5xx(self.res, r, "signal")
        if r.status_code not in (200, 201):
            self.res.http_errors += 1
            return False
        self.rec("signal", phase="ok", instance=iid, signal_id=sig, status=r.status_code)
        if key in self.signalled:
            self.res.signal_replays += 1
        else:
            self.res.signals += 1
        self.signalled.add(key)
        return True

    def run(self, stop: threading.Event) -> None:
        n = 0
        while not stop.wait(self.rng.uniform(0.2, 0.5)):
            n += 1
            key = f"b{n}"
            if self.unconfirmed and self.rng.random() < 0.5:
                key = self.rng.choice(sorted(self.unconfirmed))  # its outcome was never seen
            elif self.instances and self.rng.random() < 0.15:
                key = self.rng.choice(list(self.instances))  # a second start: the same instance
            self.start(key)
            pending = [k for k in self.instances if k not in self.signalled]
            if pending and self.rng.random() < 0.7:
                self.signal(self.rng.choice(pending))
            if self.signalled and self.rng.random() < 0.1:
                self.signal(self.rng.choice(sorted(self.signalled)))  # a duplicate signal: 200

    def signal_all(self, deadline: float) -> None:
        while time.monotonic() < deadline:
            for k in sorted(self.unconfirmed):
                self.start(k)
            pending = [k for k in self.instances if k not in self.signalled]
            if not pending and not self.unconfirmed:
                return
            for k in pending:
                self.signal(k)


# --------------------------------------------------------------------------------------------
# Faults

DECK = ["worker", "worker", "node", "connection", "sigstop", "subscriber", "db_restart"]


def _busy_workers(cluster: Cluster) -> list[int]:
    """Workers whose log shows a handler running now (started, not returned)."""
    busy = []
    for i, path in enumerate(cluster.worker_logs):
        if path is None or not path.exists():
            continue
        open_: set[str] = set()
        for line in path.read_text(errors="replace").splitlines()[-100:]:
            try:
                r = json.loads(line)
            except ValueError:
                continue
            if r["op"] == "wstart":
                open_.add(r["attempt"])
            elif r["op"] == "wdone":
                open_.discard(r["attempt"])
        if open_:
            busy.append(i)
    return busy


def _faults(cluster: Cluster, stop: threading.Event, res: ChaosResult, rec: history.Recorder,
            rng: random.Random, db: PrivateDatabase | None, dealt: threading.Event,
            hooks: ChaosHooks | None = None) -> None:  # fmt: skip
    extra = hooks.faults if hooks is not None else {}
    deck: list[str] = []
    kill_db = False
    rounds = 0
    while not stop.wait(rng.uniform(1.5, 3.0)):
        if not deck:
            if rounds:
                dealt.set()  # every kind of fault has happened at least once
            rounds += 1
            deck = [k for k in DECK if k != "db_restart" or db is not None] + list(extra)
            rng.shuffle(deck)
        kind = deck.pop()
        if kind in extra:
            extra[kind](cluster, rec, res, rng)
        elif kind in ("worker", "sigstop"):
            busy = _busy_workers(cluster)
            i = rng.choice(busy) if busy else rng.randrange(len(cluster.workers))
            w = cluster.workers[i]
            if w is None or w.poll() is not None:
                res.figures["found_dead"] = res.figures.get("found_dead", 0) + 1
                cluster.spawn_worker(i)
                deck.insert(0, kind)  # deal it again later
                continue
            if kind == "worker":
                os.kill(w.pid, signal.SIGKILL)
                w.wait(10)
                rec("fault", kind="sigkill_worker", worker=i)
                res.faults["sigkill_worker"] += 1
                time.sleep(1.0)
                cluster.spawn_worker(i)
            else:
                # Paused past its lease (2 s) and the recovery that takes it (0.3 s rounds):
                # its attempts are LOST and offered again; its late reports must be refused.
                os.kill(w.pid, signal.SIGSTOP)
                rec("fault", kind="sigstop_worker", worker=i)
                res.faults["sigstop_worker"] += 1
                time.sleep(LEASE_MS / 1000 * 2 + 1.0)
                os.kill(w.pid, signal.SIGCONT)
                rec("fault", kind="sigcont_worker", worker=i)
        elif kind == "node":
            node = rng.choice(cluster.nodes)
            if not node.alive():
                res.figures["found_dead"] = res.figures.get("found_dead", 0) + 1
                node.start(timeout=60)
                deck.insert(0, kind)
            else:
                node.stop(sig_kill=True)
                rec("fault", kind="sigkill_node", port=node.port)
                res.faults["sigkill_node"] += 1
                time.sleep(2.0)
                node.start(timeout=60)
        elif kind == "connection":
            target = rng.choice(cluster.node_dsns)  # on a cluster: one database node's list
            try:
                ids = query(target, "SELECT ID FROM information_schema.PROCESSLIST WHERE DB = %s"
                                    " AND ID <> CONNECTION_ID()", (target.database,))  # fmt: skip
            except pymysql.MySQLError:
                ids = []
            if ids:
                victim = rng.choice(ids)[0]
                try:
                    query(target, f"KILL CONNECTION {int(victim)}")
                    rec("fault", kind="kill_db_connection")
                    res.faults["kill_db_connection"] += 1
                except pymysql.MySQLError:
                    pass
        elif kind == "subscriber":
            p = cluster.subscribers.get("inbox")
            if p is not None and p.poll() is not None:
                res.figures["found_dead"] = res.figures.get("found_dead", 0) + 1
                cluster.spawn_subscriber("inbox")
                deck.insert(0, kind)
            elif p is not None:
                p.kill()
                p.wait(10)
                rec("fault", kind="sigkill_subscriber")
                res.faults["sigkill_subscriber"] += 1
                time.sleep(1.0)
                cluster.spawn_subscriber("inbox")
        elif kind == "db_restart" and db is not None:
            kill_db = not kill_db
            rec("fault", kind="db_stop", sigkill=kill_db)
            db.restart(down_s=2.0, kill=kill_db)
            rec("fault", kind="db_started")
            res.faults["db_restart_sigkill" if kill_db else "db_restart_sigterm"] += 1


# --------------------------------------------------------------------------------------------
# The run


def _wait(predicate: Any, deadline: float, every: float = 0.5) -> bool:
    while time.monotonic() < deadline:
        try:
            if predicate():
                return True
        except pymysql.MySQLError:
            pass
        time.sleep(every)
    return False


def run_chaos(dsn: DSN, work: Path, *, seconds: float, nodes: int = 3, workers: int = 3,
              seed: int | None = None, settle_s: float = 90.0, db: PrivateDatabase | None = None,
              inbox_dsn: DSN | None = None, full_deck: bool = True,
              tree_env: dict[str, str] | None = None, hooks: ChaosHooks | None = None) -> ChaosResult:  # fmt: skip
    """One run on the migrated database ``dsn`` (``db``: its private server, restartable;
    ``inbox_dsn``: an empty database for the inbox subscriber's tables)."""
    rng = random.Random(seed)
    work.mkdir(parents=True, exist_ok=True)
    res = ChaosResult(nodes=nodes, workers=workers, private_db=db is not None)
    t = cli_tenant(dsn, namespace="chaos", env=tree_env, cwd=tree_cwd(tree_env))
    cluster = Cluster(dsn, work, t, nodes, workers, inbox_dsn, tree_env,
                      node_dsns=hooks.node_dsns if hooks is not None else None)  # fmt: skip
    started = time.monotonic()
    cluster.nodes[0].start(timeout=60)
    base = cluster.nodes[0].url
    ns_url = f"{base}/v1/namespaces/{t.namespace}"
    put_queue(base, t, "chaos", lease_ms=LEASE_MS,
              retry={"max_attempts": 6, "backoff_initial_ms": 100, "backoff_max_ms": 500,
                     "backoff_multiplier": 2})  # fmt: skip
    subs = {"noack": {"start": "earliest", "ack_timeout_ms": 500, "max_deliveries": NOACK_BUDGET,
                      "max_in_flight": 5000}}  # fmt: skip
    if inbox_dsn is not None:
        subs["inbox"] = {"start": "earliest", "ack_timeout_ms": 3000, "max_deliveries": 1000, "max_in_flight": 200}
    else:
        cluster.subscribers.pop("inbox")
    for name, body in subs.items():
        r = httpx.put(f"{ns_url}/subscriptions/{name}", json=body, headers=t.auth, timeout=30)
        assert r.status_code in (200, 201), r.text
    r = httpx.post(f"{ns_url}/workflows/chaos_flow/versions", json={"definition": WORKFLOW}, headers=t.auth, timeout=30)
    assert r.status_code in (200, 201), r.text
    r = httpx.put(f"{ns_url}/schedules/tick", headers=t.auth, timeout=30,
                  json={"queue": "chaos", "every_ms": SCHEDULE_EVERY_MS,
                        "task": {"kind": "job", "payload": {"scheduled": True}, "retry_safe": True,
                                 "dedup_key": "{schedule}@{fire_at}"}})  # fmt: skip
    assert r.status_code in (200, 201), r.text
    for n in cluster.nodes[1:]:
        n.start(timeout=60)
    for i in range(workers):
        cluster.spawn_worker(i)
    for sub in cluster.subscribers:
        cluster.spawn_subscriber(sub)
    stop = threading.Event()
    dealt = threading.Event()
    prod_rec = history.Recorder(cluster._log("producer"), "producer")
    wf_rec = history.Recorder(cluster._log("workflows"), "workflows")
    fault_rec = history.Recorder(cluster._log("faults"), "faults")
    driver = WorkflowDriver(cluster, res, wf_rec, random.Random(rng.random()))
    threads = [
        threading.Thread(target=_producer, args=(cluster, stop, res, prod_rec, random.Random(rng.random()))),
        threading.Thread(target=driver.run, args=(stop,)),
        threading.Thread(target=_faults, args=(cluster, stop, res, fault_rec, random.Random(rng.random()), db,
                                               dealt, hooks)),
        *(threading.Thread(target=w, args=(cluster, stop)) for w in (hooks.watchers if hooks is not None else [])),
    ]
    app = t.application_id
    try:
        for th in threads:
            th.start()
        time.sleep(seconds)
        if full_deck:
            # A bounded run goes on until every kind of fault happened once. On a busy
            # machine a Galera restart or a node's start takes long, so the bound is ample
            # (ORBIT_CHAOS_DEAL_S); a quiet machine deals the deck well within it.
            dealt.wait(float(os.environ.get("ORBIT_CHAOS_DEAL_S", "300")))
        stop.set()
        for th in threads:
            th.join(120)
        # Settle: everything back, the schedule paused, every instance signalled, then wait.
        if hooks is not None and hooks.revive is not None:
            hooks.revive(cluster)
        cluster.revive()
        deadline = time.monotonic() + settle_s
        _wait(lambda: httpx.post(f"{cluster.nodes[0].url}/v1/namespaces/{t.namespace}/schedules/tick/pause",
                                 headers=t.auth, timeout=10).status_code == 200, deadline)  # fmt: skip
        driver.signal_all(deadline)

        def quiet() -> bool:
            busy = query(dsn, "SELECT COUNT(*) FROM pulse_tasks t JOIN orbit_namespaces n ON n.id = t.namespace_id"
                              " WHERE n.application_id = UNHEX(%s) AND t.state IN ('WAITING','LEASED','RUNNING')",
                         (app,))[0][0]  # fmt: skip
            running = query(dsn, "SELECT COUNT(*) FROM weave_instances i JOIN orbit_namespaces n ON n.id = i.namespace_id"
                                 " WHERE n.application_id = UNHEX(%s) AND i.state = 'RUNNING'", (app,))[0][0]  # fmt: skip
            last = query(dsn, "SELECT COALESCE(MAX(e.seq), 0) FROM orbit_result_events e JOIN orbit_namespaces n"
                              " ON n.id = e.namespace_id WHERE n.application_id = UNHEX(%s)", (app,))[0][0]  # fmt: skip
            open_deliveries = query(
                dsn, "SELECT COUNT(*) FROM orbit_deliveries d JOIN orbit_namespaces n ON n.id = d.namespace_id"
                     " WHERE n.application_id = UNHEX(%s) AND d.state IN ('PENDING','LEASED')", (app,))[0][0]  # fmt: skip
            open_deliveries += query(
                dsn, "SELECT COALESCE(SUM(r.open_n), 0) FROM orbit_delivery_ranges r JOIN orbit_namespaces n"
                     " ON n.id = r.namespace_id WHERE n.application_id = UNHEX(%s) AND r.state = 'LEASED'",
                (app,))[0][0]  # fmt: skip
            behind = query(dsn, "SELECT COUNT(*) FROM orbit_subscriptions s JOIN orbit_namespaces n ON n.id = s.namespace_id"
                                " WHERE n.application_id = UNHEX(%s) AND s.after_seq < %s", (app, last))[0][0]  # fmt: skip
            return busy == 0 and running == 0 and open_deliveries == 0 and behind == 0

        res.settled = _wait(quiet, deadline)
    finally:
        stop.set()
        cluster.stop()
        for r_ in (prod_rec, wf_rec, fault_rec):
            r_.close()
    res.seconds = round(time.monotonic() - started, 1)
    records = history.load(cluster.logs)
    res.operations = sum(1 for r_ in records if r_["op"] != "fault")
    records += history.snapshot(dsn, app, t.namespace, inbox_dsn=inbox_dsn, every_ms={"tick": SCHEDULE_EVERY_MS})
    history.write_jsonl(work / "history.jsonl", records)
    figures: dict[str, Any] = {}
    res.anomalies = history.check(records, inbox_sub="inbox" if inbox_dsn is not None else None, figures=figures)
    figures.update(res.figures)
    res.figures = figures
    res.states = Counter(figures.get("states", {}))
    res.attempts = Counter(figures.get("attempt_states", {}))
    res.tasks = sum(res.states.values())
    res.result_events = sum(1 for r_ in records if r_["op"] == "db.event")
    for what, n in res.http_5xx.items():
        if not what.endswith(" 503"):
            res.anomalies.append(f"http_5xx: {n} × {what} (only 503 + Retry-After is allowed)")
    for i, node in enumerate(cluster.nodes):
        unhandled = node.logs().count("unhandled error in request")
        if unhandled:
            res.anomalies.append(f"server_500: node {i} logged {unhandled} unhandled request errors")
    if not res.settled:
        res.anomalies.append("not_settled: the run did not settle in time (see the anomalies above)")
    return res


# --------------------------------------------------------------------------------------------
# Command line


def private_run(seconds: float, *, nodes: int = 3, workers: int = 3, seed: int | None = None,
                keep: bool = False, settle_s: float = 90.0, work: Path | None = None) -> tuple[ChaosResult, Path]:  # fmt: skip
    """A run on a private mariadbd created for it (and removed after unless ``keep``)."""
    root = Path(tempfile.mkdtemp(prefix="orbit-chaos-db-"))
    db = PrivateDatabase(root / "db")
    work = work or ROOT / ".orbit" / "chaos" / time.strftime("run-%Y%m%d-%H%M%S")
    try:
        tree_env = freeze_tree(root / "src")
        dsn = db.start().with_database("orbit_chaos")
        migrate_up(dsn, tree_env)
        inbox = db.create("chaos_inbox")
        res = run_chaos(dsn, work, seconds=seconds, nodes=nodes, workers=workers, seed=seed, db=db,
                        inbox_dsn=inbox, settle_s=settle_s, tree_env=tree_env)  # fmt: skip
    finally:
        db.stop()
        if not keep:
            shutil.rmtree(root, ignore_errors=True)
    return res, work


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--minutes", type=float, default=None, help="length of the fault phase")
    p.add_argument("--seconds", type=float, default=60.0)
    p.add_argument("--nodes", type=int, default=3)
    p.add_argument("--workers", type=int, default=3)
    p.add_argument("--seed", type=int, default=None)
    p.add_argument("--settle", type=float, default=120.0, help="longest wait for the run to settle")
    p.add_argument("--keep", action="store_true", help="keep the database afterwards")
    p.add_argument("--shared-db", action="store_true", help="use the shared MariaDB (no database restart)")
    p.add_argument("--json", action="store_true")
    args = p.parse_args(argv)
    seconds = args.minutes * 60 if args.minutes is not None else args.seconds
    if args.shared_db:
        from conftest import create_database, drop_database

        dsn = create_database("orbit_chaos")
        inbox = create_database("chaos_inbox")
        work = ROOT / ".orbit" / "chaos" / dsn.database
        tree = Path(tempfile.mkdtemp(prefix="orbit-chaos-src-"))
        try:
            tree_env = freeze_tree(tree / "src")
            migrate_up(dsn, tree_env)
            res = run_chaos(dsn, work, seconds=seconds, nodes=args.nodes, workers=args.workers, seed=args.seed,
                            inbox_dsn=inbox, settle_s=args.settle, tree_env=tree_env)  # fmt: skip
        finally:
            shutil.rmtree(tree, ignore_errors=True)
            if not args.keep:
                drop_database(dsn)
                drop_database(inbox)
    else:
        res, work = private_run(seconds, nodes=args.nodes, workers=args.workers, seed=args.seed, keep=args.keep,
                                settle_s=args.settle)  # fmt: skip
    out = res.to_json()
    from reliability_support import record_figures

    record_figures("chaos_by_hand", **out)
    print(json.dumps(out, indent=None if args.json else 2, default=str))
    print(f"{res.tasks} tasks, {res.operations} client operations, {sum(res.faults.values())} faults, "
          f"{len(res.anomalies)} anomalies (logs and history.jsonl in {work})", file=sys.stderr)  # fmt: skip
    return 1 if res.anomalies else 0


if __name__ == "__main__":
    sys.exit(main())
