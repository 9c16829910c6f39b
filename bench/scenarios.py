"""Scenarios S1–S4 against the real server process (S5 is bench/fairness.py, S6–S8
bench/run.py and bench/idle.py).

Producers in this (driver) process POST pre-encoded bodies with a lean keep-alive client
(``bench/lean_http.py``; httpx for setup calls), results come through the SDK's
:class:`~orbit_sdk.Subscriber` for results; workers are separate SDK processes
(``bench/worker.py``). Every scenario uses its own queue (and subscription), so their
figures do not mix.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import re
import secrets
import statistics
import subprocess
import tempfile
import time
from collections import Counter
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import msgspec

from bench import ledger
from bench.env import DB, PEERS_DIR, ScratchDatabase, Server, WorkerProcs, proc_sample
from bench.lean_http import LeanClient

_ENC = msgspec.json.Encoder()


def pct(values: list[float], q: float) -> float | None:
    if not values:
        return None
    s = sorted(values)
    return round(s[min(len(s) - 1, int(len(s) * q))], 2)


def lat_summary(values: list[float]) -> dict[str, Any]:
    return {
        "n": len(values),
        "p50_ms": pct(values, 0.50),
        "p90_ms": pct(values, 0.90),
        "p99_ms": pct(values, 0.99),
        "mean_ms": round(statistics.fmean(values), 2) if values else None,
    }


@dataclass
class Tenant:
    url: str
    key: str
    namespace: str
    application_id: str = ""

    @property
    def headers(self) -> dict[str, str]:
        return {"Authorization": f"Bearer {self.key}", "Content-Type": "application/json"}

    def base(self) -> str:
        return f"{self.url}/v1/namespaces/{self.namespace}"


async def put_queue(client: httpx.AsyncClient, t: Tenant, name: str) -> None:
    r = await client.put(f"{t.base()}/queues/{name}", headers=t.headers, content=b"{}")
    r.raise_for_status()


async def put_subscription(client: httpx.AsyncClient, t: Tenant, name: str, queue: str) -> None:
    body = {
        "filter": {"queues": [queue]},
        "start": "latest",
        "ack_timeout_ms": 60_000,
        "max_deliveries": 10,
        "max_in_flight": 5000,
    }
    r = await client.put(f"{t.base()}/subscriptions/{name}", headers=t.headers, json=body)
    r.raise_for_status()


class Results:
    """Consumes a subscription over WebSocket (SDK Subscriber), acks every delivery and keeps
    arrival times by task id."""

    def __init__(self, t: Tenant, subscription: str) -> None:
        self.t = t
        self.subscription = subscription
        self.arrived: dict[str, float] = {}
        self.results: dict[str, bytes] = {}
        self.count = 0
        self._waiters: dict[str, asyncio.Future[float]] = {}
        self._task: asyncio.Task[None] | None = None
        self.error: BaseException | None = None

    def start(self) -> None:
        self._task = asyncio.create_task(self._run())

    async def _run(self) -> None:
        from orbit_sdk import Subscriber

        try:
            async with Subscriber(self.t.url, self.t.key, self.t.namespace,
                                  self.subscription) as sub:  # fmt: skip
                async for d in sub:
                    now = time.time()
                    ev = d.event
                    self.arrived[ev.task_id] = now
                    self.results[ev.task_id] = bytes(ev.result)
                    self.count += 1
                    w = self._waiters.pop(ev.task_id, None)
                    if w is not None and not w.done():
                        w.set_result(now)
                    await d.ack()
        except asyncio.CancelledError:
            raise
        except BaseException as exc:  # pragma: no cover - reported in the figures
            self.error = exc

    async def wait_for(self, task_id: str, limit_s: float) -> float:
        if task_id in self.arrived:
            return self.arrived[task_id]
        fut: asyncio.Future[float] = asyncio.get_running_loop().create_future()
        self._waiters[task_id] = fut
        return await asyncio.wait_for(fut, limit_s)

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(BaseException):
                await self._task


async def count_state(db: ScratchDatabase, namespace: str, queue: str, state: str) -> int:
    # By queue id: a range of the (namespace, queue, state) index. (By queue_name it read
    # every task of the namespace in that state, seconds a call with S4's backlog, and
    # loaded the database during the window.)
    index = await db.queue_state_index()
    ((n,),) = await db.query(
        "SELECT COUNT(*) FROM orbit_namespaces n JOIN pulse_queues q"
        " ON q.namespace_id = n.id AND q.name = %s"
        f" JOIN pulse_tasks t FORCE INDEX ({index})"
        " ON t.namespace_id = q.namespace_id AND t.queue_id = q.id AND t.state = %s"
        " WHERE n.name = %s",
        (queue, state, namespace),
    )
    return int(n)


# -- S1 end to end ---------------------------------------------------------------------------


@dataclass
class S1Config:
    seconds: float = 20.0
    warmup: float = 4.0
    worker_processes: int = 2
    sessions_per_process: int = 4
    concurrency: int = 32
    batch_clients: int = 2
    batch_size: int = 50
    single_clients: int = 4
    #: Producers pause while this many submitted tasks have no result yet (keeps the system
    #: saturated without an unbounded backlog; latency at saturation follows from it).
    max_outstanding: int = 1000
    #: After the window, how long to let the outstanding tail finish before stopping.
    drain_s: float = 60.0
    queue: str = field(default_factory=lambda: f"s1-{secrets.token_hex(3)}")
    #: Record the server with py-spy during the window into this stem (.svg flame graph and
    #: .txt of collapsed stacks), when py-spy is available.
    profile: str | None = None
    #: Read the work-per-task ledger of the window (bench/ledger.py).
    ledger: bool = True


async def s1(server: Server, t: Tenant, db: ScratchDatabase, cfg: S1Config,
             sample_pids: Callable[[], list[int]] | None = None) -> dict[str, Any]:  # fmt: skip
    """End to end: HTTP submit (batch + single) → SDK workers (WebSocket) → subscriber."""
    queue = cfg.queue
    sub_name = f"sub-{queue}"
    limits = httpx.Limits(max_connections=64, max_keepalive_connections=64)
    async with (
        httpx.AsyncClient(timeout=60.0, limits=limits) as client,
        LeanClient(t.url, connections=64) as lean,
    ):
        await put_queue(client, t, queue)
        await put_subscription(client, t, sub_name, queue)
        results = Results(t, sub_name)
        results.start()
        workers = WorkerProcs()
        workers.start(url=t.url, key=t.key, namespace=t.namespace, queue=queue,
                      processes=cfg.worker_processes, sessions=cfg.sessions_per_process,
                      concurrency=cfg.concurrency)  # fmt: skip
        submitted: dict[str, float] = {}
        stop = asyncio.Event()
        errors: list[str] = []
        single_body = _ENC.encode({"queue": queue, "kind": "noop", "payload": {}})
        batch_body = _ENC.encode(
            {"tasks": [{"queue": queue, "kind": "noop", "payload": {}}] * cfg.batch_size}
        )

        def outstanding() -> int:
            return len(submitted) - results.count

        async def batch_client() -> None:
            while not stop.is_set():
                if outstanding() > cfg.max_outstanding:
                    await asyncio.sleep(0.002)
                    continue
                t0 = time.time()
                r = await lean.post(f"{t.base()}/tasks:batch", headers=t.headers,
                                    content=batch_body)  # fmt: skip
                if r.status_code != 200:
                    errors.append(f"batch {r.status_code} {r.text[:200]}")
                    await asyncio.sleep(0.05)
                    continue
                for item in r.json()["items"]:
                    if item.get("task"):
                        submitted[item["task"]["id"]] = t0

        async def single_client() -> None:
            while not stop.is_set():
                if outstanding() > cfg.max_outstanding:
                    await asyncio.sleep(0.002)
                    continue
                t0 = time.time()
                r = await lean.post(f"{t.base()}/tasks", headers=t.headers,
                                    content=single_body)  # fmt: skip
                if r.status_code != 201:
                    errors.append(f"single {r.status_code} {r.text[:200]}")
                    await asyncio.sleep(0.05)
                    continue
                submitted[r.json()["id"]] = t0

        # Wait until the workers take work (one probe task round trip).
        probe = await client.post(f"{t.base()}/tasks", headers=t.headers, content=single_body)
        probe.raise_for_status()
        await results.wait_for(probe.json()["id"], 60)

        producers = [asyncio.create_task(batch_client()) for _ in range(cfg.batch_clients)]
        producers += [asyncio.create_task(single_client()) for _ in range(cfg.single_clients)]
        await asyncio.sleep(cfg.warmup)
        w_start = time.time()
        c0 = results.count
        done0 = await count_state(db, t.namespace, queue, "SUCCEEDED")
        s0 = server.sample()
        pids = sample_pids() if sample_pids else workers.pids()
        w0 = [proc_sample(p) for p in pids]
        mpids = _mariadb_pids()
        m0 = [proc_sample(p) for p in mpids]
        d0 = _self_cpu()
        spy = _start_profile(server, cfg)
        mark = await ledger.current().begin(s0.cpu_s) if cfg.ledger else None
        await asyncio.sleep(cfg.seconds)
        w_end = time.time()
        c1 = results.count
        s1_ = server.sample()
        closed = await ledger.current().end(mark, s1_.cpu_s) if mark is not None else None
        done1 = await count_state(db, t.namespace, queue, "SUCCEEDED")
        w1 = [proc_sample(p) for p in pids]
        m1 = [proc_sample(p) for p in mpids]
        d1 = _self_cpu()
        metrics = await _scrape(client, server, "pulse_group_commit")
        stop.set()
        await asyncio.gather(*producers, return_exceptions=True)
        # Let the tail finish (bounded) so the next scenario starts clean.
        deadline = time.monotonic() + cfg.drain_s
        while outstanding() > 0 and time.monotonic() < deadline:  # noqa: ASYNC110 - a poll
            await asyncio.sleep(0.1)
        tails = await workers.stop()
        await results.stop()
        profile = await _finish_profile(spy)
    window = w_end - w_start
    lat = [
        (results.arrived[tid] - t0) * 1000
        for tid, t0 in submitted.items()
        if w_start <= t0 <= w_end and tid in results.arrived
    ]
    delivered = c1 - c0
    completed = done1 - done0
    led = await ledger.current().report(closed, db.name, completed) if closed else None
    return {
        "config": {k: v for k, v in cfg.__dict__.items()},
        "window_s": round(window, 2),
        "tasks_per_s": round(delivered / window, 1),
        "completed_per_s": round(completed / window, 1),
        "submit_to_result_ms": lat_summary(lat),
        "server_cpu_s_per_1000": round((s1_.cpu_s - s0.cpu_s) / max(completed, 1) * 1000, 3),
        "server_cpu_util": round((s1_.cpu_s - s0.cpu_s) / window, 3),
        "server_rss_mb": round(s1_.rss_kb / 1024, 1),
        "workers_cpu_util": round(
            sum(b.cpu_s - a.cpu_s for a, b in zip(w0, w1, strict=True)) / window, 3
        ),
        "mariadb_cpu_util": round(
            sum(b.cpu_s - a.cpu_s for a, b in zip(m0, m1, strict=False)) / window, 3
        ),
        "driver_cpu_util": round((d1 - d0) / window, 3),
        "load_avg": [round(x, 2) for x in os.getloadavg()],
        "left_outstanding": outstanding(),
        "group_commit": metrics,
        "ledger": led,
        "profile": profile,
        "errors": errors[:5],
        "n_errors": len(errors),
        "subscriber_error": repr(results.error) if results.error else None,
        "worker_stderr_tail": [x[-500:] for x in tails if x.strip()][:2],
    }


def _mariadb_pids() -> list[int]:
    """The database server's process (this run's, bench.env.DB), when it runs here."""
    return [DB.pid] if DB.pid else []


def _self_cpu() -> float:
    t = os.times()
    return t.user + t.system


async def _scrape(client: httpx.AsyncClient, server: Server, prefix: str) -> dict[str, float]:
    """Lines of /metrics starting with ``prefix`` as {series: value}."""
    out: dict[str, float] = {}
    with contextlib.suppress(Exception):
        r = await client.get(server.url + "/metrics")
        for line in r.text.splitlines():
            if line.startswith(prefix):
                name, _, value = line.rpartition(" ")
                out[name] = float(value)
    return out


def _start_profile(server: Server, cfg: S1Config) -> Any:
    """py-spy (from ``ORBIT_BENCH_PEERS/bin``) on the server for the window: a flame graph
    (``<stem>.svg``) and raw collapsed stacks (a temporary file, summarised afterwards into
    ``<stem>-top.txt`` by :func:`write_profile_summary`)."""
    if not cfg.profile or server.proc is None:
        return None
    spy = PEERS_DIR / "bin" / "py-spy"
    if not spy.exists():
        return {"not_measured": f"py-spy not found at {spy} (bench/install-peers)"}
    Path(cfg.profile).parent.mkdir(parents=True, exist_ok=True)
    raw = Path(tempfile.gettempdir()) / f"orbit-bench-{Path(cfg.profile).name}.collapsed"
    common = ["--pid", str(server.proc.pid), "--duration", str(int(cfg.seconds)),
              "--rate", "200", "--nonblocking"]  # fmt: skip
    procs = [
        subprocess.Popen([str(spy), "record", "-o", cfg.profile + ".svg", *common],
                         stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL),
        subprocess.Popen([str(spy), "record", "-f", "raw", "-o", str(raw), *common],
                         stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL),
    ]  # fmt: skip
    return (procs, cfg.profile, raw)


async def _finish_profile(spy: Any) -> dict[str, Any] | None:
    if spy is None or isinstance(spy, dict):
        return spy
    procs, stem, raw = spy
    for p in procs:
        for _ in range(300):
            if p.poll() is not None:
                break
            await asyncio.sleep(0.1)
        if p.poll() is None:
            p.kill()
    summary = write_profile_summary(raw, Path(stem + "-top.txt"))
    with contextlib.suppress(OSError):
        raw.unlink()
    return {"svg": stem + ".svg", "top": stem + "-top.txt", **summary}


_FRAME = re.compile(r"^(?P<fn>.*) \((?P<file>[^:()]*)(?::\d+)?\)$")
_OWN = ("orbit/", "pulse/", "weave/", "orbit_cmd/")
_LOOP = ("Runner.run", "run", "<module>", "main", "_run", "run_until_complete", "run_forever",
         "_run_once", "Handle._run")  # fmt: skip


def _parse_frame(frame: str) -> tuple[str, str]:
    m = _FRAME.match(frame)
    return (m["fn"], m["file"]) if m else (frame, "")


def profile_summary(path: Path, n: int = 25) -> dict[str, Any]:
    """Shares of py-spy's raw collapsed stacks: by asyncio task (the coroutine each sample
    runs under), by Orbit module (the deepest own-code frame), by function inclusive and
    by leaf function (self time)."""
    by_task: Counter[str] = Counter()
    by_module: Counter[str] = Counter()
    incl: Counter[str] = Counter()
    leaf: Counter[str] = Counter()
    total = 0
    if not path.exists():
        return {"samples": 0}
    for line in path.read_text(errors="replace").splitlines():
        stack, _, count = line.rpartition(" ")
        if not count.isdigit() or not stack:
            continue
        c = int(count)
        total += c
        frames = [_parse_frame(f) for f in stack.split(";")]
        task = next((fn for fn, file in frames if fn not in _LOOP and "asyncio/" not in file
                     and "uvloop/" not in file and file != "orbit-server"),
                    f"(loop) {frames[-1][0]}")  # fmt: skip
        by_task[task] += c
        # The deepest own-code frame that is not the storage layer or the entry point: the
        # module whose work this sample is (its queries' driver time included).
        own = [file for _, file in frames if file.startswith(_OWN)
               and not file.startswith(("orbit/storage/", "orbit_cmd/"))]  # fmt: skip
        by_module[own[-1] if own else "(no Orbit frame: driver/HTTP/WebSocket callbacks)"] += c
        seen: set[str] = set()
        for fn, file in frames:
            key = f"{fn} ({file})"
            if key not in seen:
                seen.add(key)
                incl[key] += c
        fn, file = frames[-1]
        leaf[f"{fn} ({file})"] += c

    def top(counter: Counter[str], k: int) -> list[tuple[str, float]]:
        return [(name, round(v / total, 3)) for name, v in counter.most_common(k)] if total else []

    return {"samples": total, "by_task": top(by_task, 15), "by_module": top(by_module, 20),
            "inclusive": top(incl, n), "self": top(leaf, n)}  # fmt: skip


def write_profile_summary(raw: Path, out: Path) -> dict[str, Any]:
    """:func:`profile_summary` of ``raw`` as a short text file ``out``; returns the summary
    (first entries only, for the JSON report)."""
    summ = profile_summary(raw)
    lines = [
        f"py-spy samples of the server ({out.stem.removesuffix('-top')}): {summ['samples']} "
        "(200 Hz, --nonblocking, busy threads only; a sample whose stack was read while it "
        "changed can miss its outer frames: those land under '(loop)' / 'no Orbit frame')",
        "",
    ]
    titles = {"by_task": "by asyncio task (entry coroutine)",
              "by_module": "by Orbit module (deepest own-code frame)",
              "inclusive": "top functions, inclusive", "self": "top functions, self (leaf)"}  # fmt: skip
    for key, title in titles.items():
        lines += [f"## {title}", ""]
        lines += [f"{share:6.1%}  {name}" for name, share in summ.get(key, [])]
        lines.append("")
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text("\n".join(lines), encoding="utf-8")
    return {k: (v[:8] if isinstance(v, list) else v) for k, v in summ.items()}


# -- S2 idle dispatch latency ----------------------------------------------------------------


async def s2(server: Server, t: Tenant, n: int, gap_s: float = 0.05) -> dict[str, Any]:
    """Idle system: one worker session; submit one task at a time; submit → handler start."""
    queue = f"s2-{secrets.token_hex(3)}"
    sub_name = f"sub-{queue}"
    async with httpx.AsyncClient(timeout=30.0) as client, LeanClient(t.url, 1) as lean:
        await put_queue(client, t, queue)
        await put_subscription(client, t, sub_name, queue)
        results = Results(t, sub_name)
        results.start()
        workers = WorkerProcs()
        workers.start(url=t.url, key=t.key, namespace=t.namespace, queue=queue,
                      processes=1, sessions=1, concurrency=4)  # fmt: skip
        start_lat: list[float] = []
        e2e_lat: list[float] = []
        try:
            for i in range(n + 3):
                t0 = time.time()
                body = _ENC.encode({"queue": queue, "kind": "noop", "payload": {"t0": t0}})
                r = await lean.post(f"{t.base()}/tasks", headers=t.headers, content=body)
                if r.status_code != 201:
                    raise RuntimeError(f"S2 submit: {r.status_code} {r.text[:200]}")
                tid = r.json()["id"]
                arrived = await results.wait_for(tid, 60)
                res = msgspec.json.decode(results.results[tid])
                if i >= 3:  # the first ones warm connections up
                    start_lat.append((res["t1"] - res["t0"]) * 1000)
                    e2e_lat.append((arrived - t0) * 1000)
                await asyncio.sleep(gap_s)
        finally:
            await workers.stop()
            await results.stop()
    return {
        "n": n,
        "submit_to_handler_start": lat_summary(start_lat),
        "submit_to_result_delivery": lat_summary(e2e_lat),
    }


# -- S3 submit only --------------------------------------------------------------------------


async def s3(t: Tenant, seconds: float, clients: int = 16, batch_clients: int = 2,
             batch_size: int = 1000) -> dict[str, Any]:  # fmt: skip
    """No workers: single submits from ``clients`` concurrent clients, then batches."""
    queue = f"s3-{secrets.token_hex(3)}"
    limits = httpx.Limits(max_connections=64, max_keepalive_connections=64)
    async with (
        httpx.AsyncClient(timeout=60.0, limits=limits) as client,
        LeanClient(t.url, connections=64) as lean,
    ):
        await put_queue(client, t, queue)
        single_body = _ENC.encode({"queue": queue, "kind": "noop", "payload": {"n": 1}})
        batch_body = _ENC.encode(
            {"tasks": [{"queue": queue, "kind": "noop", "payload": {"n": 1}}] * batch_size}
        )

        async def run(fn: Callable[[], Awaitable[int]], n: int) -> dict[str, Any]:
            stop_at = time.monotonic() + seconds
            lat: list[float] = []
            total = 0
            statuses.clear()

            async def one() -> None:
                nonlocal total
                while time.monotonic() < stop_at:
                    t0 = time.monotonic()
                    got = await fn()  # (not `total += await ...`: that loses updates)
                    total += got
                    lat.append((time.monotonic() - t0) * 1000)

            began = time.monotonic()
            await asyncio.gather(*(one() for _ in range(n)))
            elapsed = time.monotonic() - began
            return {"tasks": total, "per_s": round(total / elapsed, 1),
                    "request_ms": lat_summary(lat), "clients": n,
                    "statuses": {str(k): v for k, v in statuses.items()}}  # fmt: skip

        statuses: Counter[int] = Counter()

        async def single() -> int:
            r = await lean.post(f"{t.base()}/tasks", headers=t.headers, content=single_body)
            statuses[r.status_code] += 1
            return 1 if r.status_code == 201 else 0

        async def batch() -> int:
            r = await lean.post(f"{t.base()}/tasks:batch", headers=t.headers,
                                content=batch_body)  # fmt: skip
            statuses[r.status_code] += 1
            if r.status_code != 200:
                return 0
            return sum(1 for i in r.json()["items"] if i["status"] == 201)

        single_fig = await run(single, clients)
        batch_fig = await run(batch, batch_clients)
        batch_fig["batch_size"] = batch_size
    return {"single": single_fig, "batch": batch_fig, "queue": queue}


# -- S4 backlog ------------------------------------------------------------------------------


async def settle(
    db: ScratchDatabase, *, limit_s: float = 60.0, quiet_s: float = 5.0
) -> dict[str, Any]:
    """Wait until MariaDB has flushed what a bulk insert left dirty in its buffer pool: until
    the dirty-page count stops falling (it fell by less than 2 % of the pool over the last
    ``quiet_s``; an idle MariaDB keeps some dirty pages) or ``limit_s`` passed. S4 measures
    the cost of a backlog in the table, not of the background flush of the rows inserted just
    before the window (the 10k level has almost nothing to flush). Returns what it saw."""

    async def sample() -> tuple[int, int]:
        got = dict(
            await db.query(
                "SHOW GLOBAL STATUS WHERE Variable_name IN"
                " ('Innodb_buffer_pool_pages_dirty', 'Innodb_buffer_pool_pages_total')"
            )
        )
        return int(got["Innodb_buffer_pool_pages_dirty"]), int(
            got["Innodb_buffer_pool_pages_total"]
        )

    began = time.monotonic()
    dirty, total = await sample()
    seen = [dirty]
    window = max(int(quiet_s), 1)
    while time.monotonic() - began < limit_s:
        await asyncio.sleep(1.0)
        dirty, total = await sample()
        seen.append(dirty)
        if len(seen) > window and seen[-1 - window] - dirty < 0.02 * total:
            break
    return {"waited_s": round(time.monotonic() - began, 1), "dirty_pages_before": seen[0],
            "dirty_pages_after": dirty, "pool_pages": total}  # fmt: skip


async def add_backlog(db: ScratchDatabase, t: Tenant, queue: str, n: int) -> float:
    """Add ``n`` WAITING tasks to ``queue`` that are not due for a day (bulk multi-row
    INSERT … SELECT from a template task, 50k rows per statement); counters kept equal to the
    rows. Returns the seconds it took."""
    async with httpx.AsyncClient(timeout=30.0) as client:
        await put_queue(client, t, queue)  # idempotent (200 when it exists)
        body = _ENC.encode({"queue": queue, "kind": "backlog", "payload": {"b": 1},
                            "delay_ms": 86_400_000})  # fmt: skip
        r = await client.post(f"{t.base()}/tasks", headers=t.headers, content=body)
        r.raise_for_status()
        template = bytes.fromhex(r.json()["id"])

    def insert() -> float:
        began = time.monotonic()
        conn = db.connect(unlogged=True)
        try:
            with conn.cursor() as cur:
                cur.execute(
                    "SELECT COLUMN_NAME FROM information_schema.COLUMNS WHERE TABLE_SCHEMA ="
                    " DATABASE() AND TABLE_NAME = 'pulse_tasks' AND EXTRA NOT LIKE '%%GENERATED%%'"
                    " ORDER BY ORDINAL_POSITION"
                )
                cols = [r[0] for r in cur.fetchall()]
                # Increasing ids (a fixed 4-byte prefix, then a counter): the rows append to
                # the clustered index and to every secondary index instead of landing at
                # random pages, which keeps 1M rows to a few minutes. (Real ids are random;
                # what S4 measures — dispatch with a large WAITING backlog — does not
                # depend on where the backlog's ids sort.)
                select = ", ".join(
                    "UNHEX(CONCAT('ffffbe7c', LPAD(HEX(%s + s.seq), 24, '0')))" if c == "id"
                    else f"t.{c}" for c in cols
                )  # fmt: skip
                cur.execute(
                    "SELECT namespace_id, queue_id, owner_id FROM pulse_tasks WHERE id = %s",
                    (template,),
                )
                ns, qid, owner = cur.fetchone()
                cur.execute(
                    "SELECT COUNT(*) FROM pulse_tasks WHERE namespace_id = %s AND id >= %s",
                    (ns, bytes.fromhex("ffffbe7c") + bytes(12)),
                )
                offset = int(cur.fetchone()[0])  # backlog rows already there (earlier levels)
                left = n - 1  # the template is one of them
                while left > 0:
                    chunk = min(left, 50_000)
                    conn.begin()
                    cur.execute(
                        f"INSERT INTO pulse_tasks ({', '.join(cols)}) SELECT {select}"
                        f" FROM pulse_tasks t JOIN seq_1_to_{chunk} s"
                        " WHERE t.namespace_id = %s AND t.id = %s",
                        (offset, ns, template),
                    )
                    offset += chunk
                    cur.execute(
                        "UPDATE pulse_queue_usage SET unfinished_tasks = unfinished_tasks + %s"
                        " WHERE namespace_id = %s AND queue_id = %s",
                        (chunk, ns, qid),
                    )
                    cur.execute(
                        "UPDATE orbit_application_resources SET unfinished_tasks ="
                        " unfinished_tasks + %s WHERE application_id = %s",
                        (chunk, owner),
                    )
                    conn.commit()
                    left -= chunk
        finally:
            conn.close()
        return time.monotonic() - began

    return await asyncio.to_thread(insert)


async def explain_dispatch(db: ScratchDatabase, t: Tenant, queue: str) -> list[dict[str, Any]]:
    """EXPLAIN of one part of the dispatch round's claim on this queue (the subject of a
    task of the queue; must be a range of ix_pulse_tasks_fair)."""
    from pulse.store.dispatch import Q

    def q() -> list[dict[str, Any]]:
        conn = db.connect()
        try:
            with conn.cursor() as cur:
                cur.execute(
                    "SELECT t.namespace_id, t.queue_id, t.fair_subject FROM pulse_tasks t"
                    " JOIN orbit_namespaces n ON n.id = t.namespace_id"
                    " WHERE n.name = %s AND t.queue_name = %s LIMIT 1",
                    (t.namespace, queue),
                )
                ns, qid, subject = cur.fetchone()
                lines = Q.round_claim_part.splitlines()
                sql = "\n".join(x for x in lines if not x.lstrip().startswith("--")).strip()
                sql = sql.removeprefix("(").removesuffix(")")
                sql = sql.replace("FOR UPDATE SKIP LOCKED", "")
                now = time.strftime("%Y-%m-%d %H:%M:%S")
                cur.execute("EXPLAIN " + sql, (ns, qid, subject, now, now, now, 0, 32))
                names = [d[0] for d in cur.description]
                return [dict(zip(names, row, strict=True)) for row in cur.fetchall()]
        finally:
            conn.close()

    rows = await asyncio.to_thread(q)
    return [{k: (v if isinstance(v, int | float | str) or v is None else str(v))
             for k, v in r.items()} for r in rows]  # fmt: skip


async def tenants_via_admin(url: str, admin_key: str, n: int) -> list[Tenant]:
    """``n`` new applications, each with a namespace and an all-actions key (admin API)."""
    h = {"Authorization": f"Bearer {admin_key}"}
    out: list[Tenant] = []
    actions = ["tasks.submit", "tasks.read", "workers.connect", "queues.manage",
               "subscriptions.manage", "subscriptions.consume", "events.read"]  # fmt: skip
    async with httpx.AsyncClient(timeout=30.0, base_url=url) as c:
        for i in range(n):
            name = f"owner-{i}-{secrets.token_hex(3)}"
            r = await c.post("/v1/applications", headers=h, json={"name": name})
            r.raise_for_status()
            app = r.json()["id"]
            r = await c.post(f"/v1/applications/{app}/namespaces", headers=h, json={"name": name})
            r.raise_for_status()
            ns_id = r.json()["id"]
            r = await c.post(
                f"/v1/applications/{app}/credentials",
                headers=h,
                json={"name": "bench", "namespaces": [ns_id], "actions": actions},
            )
            r.raise_for_status()
            out.append(Tenant(url, r.json()["key"], name, app))
    return out


def jdump(obj: Any) -> str:
    return json.dumps(obj, indent=2, default=str)
