"""S5, the cost of fairness: S1 with 100 owners vs. the same load from one owner, and a
fairness-key leg (one queue, one subject flooding it, bench/fairness_key.py).

An owner is an application (a task's owner is the application whose key submitted it, and
``{ns}`` in a path is resolved in the key's own application — so every owner has its own
namespace: 100 owners are 100 applications, each with a namespace, a key, a queue of the same
name, a subscription and a worker session). Both legs have the same shape and the same total
load; only the number of owners differs:

* the same worker topology: ``sessions`` worker sessions (``concurrency`` each) over 2
  processes — one per owner in the 100-owner leg, all in the one namespace in the 1-owner
  leg;
* the same producers: 2 batch clients (50 tasks a request) + 4 single-submit clients; each
  request goes to the owner offered the fewest tasks so far (the next in turn among equals),
  so every owner is offered the same load, within one batch, whatever mix of batch and
  single requests it drew;
* the same backlog: producers pause at ``max_outstanding`` tasks without a result (5,000 =
  50 per owner of the 100), so every owner has due work queued throughout the window and
  what each gets out is the server's choice, not its arrival pattern;
* results through a subscription per namespace over WebSocket (the SDK Subscriber; 100
  connections vs. 1).

The window is steady state: it opens ``warmup`` seconds after the backlog first reached
``max_outstanding`` and closes after ``seconds``, or earlier when an owner's backlog ran out
(its tasks without a result fell to what its own sessions hold: from then on it could not
take its share, and its count would measure the producers). Figures per leg: results
delivered/s, tasks completed/s, submit → result p50/p99 (queued behind the backlog),
server CPU per 1,000 tasks, and how evenly the owners were served (per-owner results in the
window: min, max, Jain's index — 1.0 = perfectly even — the sorted counts, and the sums per
worker process).
"""

from __future__ import annotations

import asyncio
import os
import secrets
import time
from dataclasses import dataclass
from typing import Any

import httpx
import msgspec

from bench import ledger
from bench.env import ScratchDatabase, Server, WorkerProcs, proc_sample
from bench.lean_http import LeanClient
from bench.scenarios import (
    Results,
    Tenant,
    _finish_profile,
    _start_profile,
    lat_summary,
    put_queue,
    put_subscription,
)

_ENC = msgspec.json.Encoder()


@dataclass
class S5Config:
    seconds: float = 12.0
    warmup: float = 3.0
    sessions: int = 100
    concurrency: int = 3
    worker_processes: int = 2
    batch_clients: int = 2
    batch_size: int = 50
    single_clients: int = 4
    #: tasks without a result at which producers pause: the backlog every leg keeps queued
    max_outstanding: int = 5000
    #: longest wait for the backlog to first reach ``max_outstanding``
    fill_limit_s: float = 60.0
    drain_s: float = 30.0
    #: py-spy the server during each leg's window into ``<profile>-<n>owners`` (.svg, -top.txt)
    profile: str | None = None
    #: The fairness-key leg: tasks of the flooding subject, and of each other subject.
    flood: int = 10_000
    others_each: int = 3


@dataclass
class _ProfileCfg:  # what scenarios._start_profile reads
    seconds: float
    profile: str | None


class EvenOffer:
    """Deals requests to owners so that each is offered the same load: a request of ``n``
    tasks goes to the owner offered the fewest tasks so far, the next in turn among equals,
    so no owner's offered count runs more than one request ahead of another's."""

    def __init__(self, owners: int) -> None:
        self.offered = [0] * owners
        self._turn = 0

    def take(self, tasks: int) -> int:
        """The owner (index) the next request of ``tasks`` tasks goes to."""
        n = len(self.offered)
        low = min(self.offered)
        i = next(j % n for j in range(self._turn, self._turn + n) if self.offered[j % n] == low)
        self._turn = i + 1
        self.offered[i] += tasks
        return i


async def make_owners(url: str, admin_key: str, n: int) -> list[Tenant]:
    """``n`` new applications, each with a namespace and a key for it (admin API)."""
    actions = ["tasks.submit", "tasks.read", "workers.connect", "queues.manage",
               "subscriptions.manage", "subscriptions.consume", "events.read"]  # fmt: skip
    h = {"Authorization": f"Bearer {admin_key}"}
    tag = secrets.token_hex(3)
    sem = asyncio.Semaphore(8)

    async def one(c: httpx.AsyncClient, i: int) -> Tenant:
        name = f"owner-{tag}-{i:03d}"
        async with sem:
            r = await c.post("/v1/applications", headers=h, json={"name": name})
            r.raise_for_status()
            app = r.json()["id"]
            r = await c.post(f"/v1/applications/{app}/namespaces", headers=h, json={"name": name})
            r.raise_for_status()
            r = await c.post(f"/v1/applications/{app}/credentials", headers=h,
                             json={"name": "bench", "namespaces": [name], "actions": actions})  # fmt: skip
            r.raise_for_status()
            return Tenant(url, r.json()["key"], name, app)

    async with httpx.AsyncClient(timeout=60.0, base_url=url) as c:
        return list(await asyncio.gather(*(one(c, i) for i in range(n))))


async def _count_done(db: ScratchDatabase, namespaces: list[str], queue: str) -> int:
    index = await db.queue_state_index()
    ((n,),) = await db.query(
        "SELECT COUNT(*) FROM orbit_namespaces n JOIN pulse_queues q"
        " ON q.namespace_id = n.id AND q.name = %s"
        f" JOIN pulse_tasks t FORCE INDEX ({index})"
        " ON t.namespace_id = q.namespace_id AND t.queue_id = q.id"
        " AND t.state = 'SUCCEEDED' WHERE n.name IN %s",
        (queue, list(namespaces)),
    )
    return int(n)


def jain(values: list[int]) -> float | None:
    """Jain's fairness index: 1.0 when every owner got the same, 1/n when one got all."""
    if not values or not any(values):
        return None
    return round(sum(values) ** 2 / (len(values) * sum(v * v for v in values)), 3)


async def leg(
    server: Server, owners: list[Tenant], db: ScratchDatabase, cfg: S5Config
) -> dict[str, Any]:
    """One leg: ``owners`` (distinct namespaces) share the load and the worker sessions."""
    queue = f"s5-{secrets.token_hex(3)}"
    sub_name = f"sub-{queue}"
    limits = httpx.Limits(max_connections=64, max_keepalive_connections=64)
    async with (
        httpx.AsyncClient(timeout=60.0, limits=limits) as client,
        LeanClient(server.url, connections=64) as lean,
    ):
        sem = asyncio.Semaphore(8)

        async def setup(t: Tenant) -> None:
            async with sem:
                await put_queue(client, t, queue)
                await put_subscription(client, t, sub_name, queue)

        await asyncio.gather(*(setup(t) for t in owners))
        results = {t.namespace: Results(t, sub_name) for t in owners}
        for r in results.values():
            r.start()
        targets = [{"key": owners[i % len(owners)].key,
                    "namespace": owners[i % len(owners)].namespace} for i in range(cfg.sessions)]  # fmt: skip
        workers = WorkerProcs()
        workers.start(url=server.url, key="", namespace="", queue=queue,
                      processes=cfg.worker_processes, sessions=0, concurrency=cfg.concurrency,
                      targets=targets)  # fmt: skip
        submitted: dict[str, float] = {}
        owner_of: dict[str, str] = {}
        stop = asyncio.Event()
        errors: list[str] = []
        deal = EvenOffer(len(owners))
        single_body = _ENC.encode({"queue": queue, "kind": "noop", "payload": {}})
        batch_body = _ENC.encode(
            {"tasks": [{"queue": queue, "kind": "noop", "payload": {}}] * cfg.batch_size}
        )

        def delivered() -> int:
            return sum(r.count for r in results.values())

        def outstanding() -> int:
            return len(submitted) - delivered()

        async def batch_client() -> None:
            while not stop.is_set():
                if outstanding() > cfg.max_outstanding:
                    await asyncio.sleep(0.002)
                    continue
                t = owners[deal.take(cfg.batch_size)]
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
                        owner_of[item["task"]["id"]] = t.namespace

        async def single_client() -> None:
            while not stop.is_set():
                if outstanding() > cfg.max_outstanding:
                    await asyncio.sleep(0.002)
                    continue
                t = owners[deal.take(1)]
                t0 = time.time()
                r = await lean.post(f"{t.base()}/tasks", headers=t.headers,
                                    content=single_body)  # fmt: skip
                if r.status_code != 201:
                    errors.append(f"single {r.status_code} {r.text[:200]}")
                    await asyncio.sleep(0.05)
                    continue
                submitted[r.json()["id"]] = t0
                owner_of[r.json()["id"]] = t.namespace

        # One probe per owner: every owner's workers and subscriber are up.
        async def probe(t: Tenant) -> None:
            async with sem:
                r = await client.post(f"{t.base()}/tasks", headers=t.headers, content=single_body)
                r.raise_for_status()
            await results[t.namespace].wait_for(r.json()["id"], 120)

        await asyncio.gather(*(probe(t) for t in owners))
        base_counts = {ns: r.count for ns, r in results.items()}
        producers = [asyncio.create_task(batch_client()) for _ in range(cfg.batch_clients)]
        producers += [asyncio.create_task(single_client()) for _ in range(cfg.single_clients)]
        fill_began = time.monotonic()
        while (outstanding() < cfg.max_outstanding  # noqa: ASYNC110 - a poll
               and time.monotonic() - fill_began < cfg.fill_limit_s):  # fmt: skip
            await asyncio.sleep(0.05)
        fill_s = time.monotonic() - fill_began
        await asyncio.sleep(cfg.warmup)
        names = [t.namespace for t in owners]
        sent_by: dict[str, int] = dict.fromkeys(names, 0)
        counted = 0
        held = max(1, cfg.sessions // len(owners)) * cfg.concurrency  # an owner's own sessions

        def backlog() -> dict[str, int]:
            nonlocal counted
            items = list(owner_of.values())
            for ns in items[counted:]:
                sent_by[ns] += 1
            counted = len(items)
            return {ns: sent_by[ns] - (results[ns].count - base_counts[ns]) for ns in names}

        w_start = time.time()
        c0 = {ns: r.count for ns, r in results.items()}
        done0 = await _count_done(db, names, queue)
        s0 = server.sample()
        w0 = [proc_sample(p) for p in workers.pids()]
        b0 = time.process_time()  # the bench process: producers and every subscriber
        spy = _start_profile(server, _ProfileCfg(cfg.seconds, _profile_stem(cfg.profile, len(owners)))
                             if cfg.profile else _ProfileCfg(cfg.seconds, None))  # fmt: skip
        mark = await ledger.current().begin(s0.cpu_s)
        min_backlog = min(backlog().values())
        ran_out: str | None = None
        while time.time() - w_start < cfg.seconds:
            await asyncio.sleep(min(0.25, max(0.0, cfg.seconds - (time.time() - w_start))))
            now_backlog = backlog()
            low_ns = min(now_backlog, key=now_backlog.__getitem__)
            min_backlog = min(min_backlog, now_backlog[low_ns])
            if now_backlog[low_ns] <= held:
                ran_out = low_ns
                break
        w_end = time.time()
        c1 = {ns: r.count for ns, r in results.items()}
        s1_ = server.sample()
        closed = await ledger.current().end(mark, s1_.cpu_s)
        done1 = await _count_done(db, names, queue)
        w1 = [proc_sample(p) for p in workers.pids()]
        b1 = time.process_time()
        stop.set()
        await asyncio.gather(*producers, return_exceptions=True)
        deadline = time.monotonic() + cfg.drain_s
        while outstanding() > 0 and time.monotonic() < deadline:  # noqa: ASYNC110 - a poll
            await asyncio.sleep(0.1)
        tails = await workers.stop()
        for r in results.values():
            await r.stop()
        profile = await _finish_profile(spy)
    window = w_end - w_start
    arrived: dict[str, float] = {}
    for r in results.values():
        arrived.update(r.arrived)
    lat = [(arrived[tid] - t0) * 1000 for tid, t0 in submitted.items()
           if w_start <= t0 <= w_end and tid in arrived]  # fmt: skip
    per_owner = [c1[ns] - c0[ns] for ns in names]
    completed = done1 - done0
    led = await ledger.current().report(closed, db.name, completed)
    sub_errors = [repr(r.error) for r in results.values() if r.error]
    return {
        "owners": len(owners),
        "sessions": cfg.sessions,
        "concurrency": cfg.concurrency,
        "queue": queue,
        "window_s": round(window, 2),
        "tasks_per_s": round(sum(per_owner) / window, 1),
        "completed_per_s": round(completed / window, 1),
        "submit_to_result_ms": lat_summary(lat),
        "server_cpu_s_per_1000": round((s1_.cpu_s - s0.cpu_s) / max(completed, 1) * 1000, 3),
        "server_cpu_util": round((s1_.cpu_s - s0.cpu_s) / window, 3),
        "workers_cpu_util": round(
            sum(b.cpu_s - a.cpu_s for a, b in zip(w0, w1, strict=True)) / window, 3
        ),
        "bench_cpu_util": round((b1 - b0) / window, 3),
        "profile": profile,
        "ledger": led,
        "per_owner_results": {
            "min": min(per_owner),
            "max": max(per_owner),
            "jain_index": jain(per_owner),
            "sorted": sorted(per_owner),
            # Owner i's session runs in worker process i % worker_processes.
            "by_worker_process": [
                sum(per_owner[i :: cfg.worker_processes]) for i in range(cfg.worker_processes)
            ],
        },
        "backlog": {
            "max_outstanding": cfg.max_outstanding,
            "fill_s": round(fill_s, 1),
            "filled": fill_s < cfg.fill_limit_s,
            "min_owner_backlog_in_window": min_backlog,
            "ran_out": ran_out,
            "offered_per_owner": [min(deal.offered), max(deal.offered)],
        },
        "probe_results": sum(base_counts.values()),
        "load_avg": [round(x, 2) for x in os.getloadavg()],
        "left_outstanding": outstanding(),
        "errors": errors[:5],
        "n_errors": len(errors),
        "subscriber_errors": sub_errors[:3],
        "worker_stderr_tail": [x[-500:] for x in tails if x.strip()][:2],
    }


def _profile_stem(profile: str | None, owners: int) -> str | None:
    if not profile:
        return None
    return f"{profile}-{'1owner' if owners == 1 else f'{owners}owners'}-server"


async def s5(server: Server, admin: Tenant, db: ScratchDatabase, cfg: S5Config | None = None,
             owners: int = 100) -> dict[str, Any]:  # fmt: skip
    """Both owner legs, the 1-owner leg first (same session count, same load), each owner a
    new application made with the global-admin key ``admin``; then the fairness-key leg."""
    from bench.fairness_key import fairness_key_leg

    cfg = cfg or S5Config()
    made = await make_owners(server.url, admin.key, owners + 2)  # fresh namespaces for all
    single, many, keyed = made[0], made[1:-1], made[-1]
    one = await leg(server, [single], db, cfg)
    print(f"[bench]   S5 1 owner: {one['tasks_per_s']} tasks/s", flush=True)
    hundred = await leg(server, many, db, cfg)
    print(f"[bench]   S5 {owners} owners: {hundred['tasks_per_s']} tasks/s", flush=True)
    fk = await fairness_key_leg(server, keyed, db, flood=cfg.flood, others_each=cfg.others_each)
    print(f"[bench]   S5 fairness key: {fk.get('wait_dispatches') or fk.get('not_measured')}",
          flush=True)  # fmt: skip
    return {"owners_1": one, f"owners_{owners}": hundred, "fairness_key": fk,
            "config": dict(cfg.__dict__)}  # fmt: skip
