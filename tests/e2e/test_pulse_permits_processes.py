"""Permits with several server processes racing: three real ``orbit-server`` processes on
one database, six SDK worker processes (two per server) on a queue with ``max_concurrency``
and keyed tasks. A sampler reads the database all along: running attempts never exceed the
queue's permits, a key never runs twice at once; afterwards the attempts' start/finish
intervals say the same, tokens strictly increase per key, and every counter equals its
recount."""

from __future__ import annotations

import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from orbit.storage import DSN

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "tests" / "reliability"))
from reliability_support import (  # noqa: E402
    OrbitServer,
    cli_tenant,
    connect,
    process_env,
    put_queue,
    query,
    submit,
)

pytestmark = pytest.mark.process

PERMITS = 3
KEYS = ["acct-0", "acct-1", "acct-2"]

WORKER = r"""
import asyncio, random, sys
from orbit_sdk import Worker

base, key, ns = sys.argv[1:4]
worker = Worker(base, key, namespace=ns, max_concurrency=4, drain_timeout=2,
                concurrency_keys=True)

async def handler(ctx, payload):
    await asyncio.sleep(random.uniform(0.02, 0.12))
    return {"token": ctx.concurrency_token, "generation": ctx.generation}

worker.register("permits", "k", handler)
asyncio.run(worker.run(install_signal_handlers=True))
"""


@pytest.fixture(scope="module")
def servers(dsn: DSN, tmp_path_factory: pytest.TempPathFactory) -> Iterator[list[OrbitServer]]:
    logs = tmp_path_factory.mktemp("permit-servers")
    started: list[OrbitServer] = []
    try:
        for _ in range(3):
            started.append(OrbitServer(dsn, logs, log_level="warning").start(timeout=60))
        yield started
    finally:
        for s in started:
            s.stop()


class Sampler(threading.Thread):
    """Reads the queue's RUNNING tasks (total and per key) and the key rows continuously."""

    def __init__(self, dsn: DSN, namespace_id: bytes, queue_id: bytes) -> None:
        super().__init__(daemon=True)
        self.conn = connect(dsn)
        self.ns, self.queue_id = namespace_id, queue_id
        self.stop = threading.Event()
        self.samples = 0
        self.max_running = 0
        self.max_per_key = 0
        self.max_held = 0
        self.max_counter = 0

    def run(self) -> None:
        with self.conn.cursor() as cur:
            while not self.stop.is_set():
                self.conn.commit()  # a fresh snapshot per sample
                cur.execute(
                    "SELECT COUNT(*) FROM pulse_tasks WHERE namespace_id = %s AND queue_id = %s"
                    " AND state = 'RUNNING'",
                    (self.ns, self.queue_id),
                )
                running = int(cur.fetchone()[0])
                cur.execute(
                    "SELECT COALESCE(MAX(n), 0) FROM (SELECT COUNT(*) AS n FROM pulse_tasks"
                    " WHERE namespace_id = %s AND queue_id = %s AND state = 'RUNNING'"
                    " AND concurrency_key IS NOT NULL GROUP BY concurrency_key) x",
                    (self.ns, self.queue_id),
                )
                per_key = int(cur.fetchone()[0])
                cur.execute(
                    "SELECT COALESCE(MAX(held), 0) FROM pulse_concurrency_limits"
                    " WHERE namespace_id = %s",
                    (self.ns,),
                )
                held = int(cur.fetchone()[0])
                cur.execute(
                    "SELECT active_attempts FROM pulse_queue_usage WHERE namespace_id = %s"
                    " AND queue_id = %s",
                    (self.ns, self.queue_id),
                )
                counter = int(cur.fetchone()[0])
                self.samples += 1
                self.max_running = max(self.max_running, running)
                self.max_per_key = max(self.max_per_key, per_key)
                self.max_held = max(self.max_held, held)
                self.max_counter = max(self.max_counter, counter)
                time.sleep(0.005)
        self.conn.close()


def _max_overlap(intervals: list[tuple[Any, Any]]) -> int:
    """Most intervals [start, end) open at once."""
    events = sorted(
        [(s, 1) for s, _ in intervals] + [(e, -1) for _, e in intervals], key=lambda x: (x[0], x[1])
    )  # fmt: skip  (an end before a start at a tie)
    best = cur = 0
    for _, d in events:
        cur += d
        best = max(best, cur)
    return best


@pytest.mark.timeout(300)  # three servers and six workers: slow on a loaded machine
def test_permits_hold_with_three_servers_and_racing_workers(
    servers: list[OrbitServer], dsn: DSN
) -> None:
    t = cli_tenant(dsn)
    q = put_queue(servers[0].url, t, "permits", max_concurrency=PERMITS, lease_ms=30000)
    ns_id = bytes.fromhex(query(dsn, "SELECT HEX(namespace_id) FROM pulse_queues WHERE id = %s",
                                (bytes.fromhex(q["id"]),))[0][0])  # fmt: skip
    queue_id = bytes.fromhex(q["id"])
    ids: list[str] = []
    for i in range(48):
        key = KEYS[i % 3] if i % 2 == 0 else None
        server = servers[i % 3]
        ids.append(submit(server.url, t, "permits", kind="k", payload={"i": i},
                          concurrency_key=key)["id"])  # fmt: skip
    sampler = Sampler(dsn, ns_id, queue_id)
    sampler.start()
    workers = [
        subprocess.Popen(
            [sys.executable, "-c", WORKER, servers[i % 3].url, t.key, t.namespace],
            env=process_env(),
            stdout=subprocess.DEVNULL,
            stderr=subprocess.PIPE,
            text=True,
        )
        for i in range(6)
    ]
    try:
        deadline = time.monotonic() + 180
        while time.monotonic() < deadline:
            (done,) = query(dsn, "SELECT COUNT(*) FROM pulse_tasks WHERE namespace_id = %s"
                            " AND queue_id = %s AND state = 'SUCCEEDED'", (ns_id, queue_id))  # fmt: skip
            if int(done[0]) == len(ids):
                break
            for w in workers:
                assert w.poll() is None, f"worker exited: {w.stderr.read() if w.stderr else ''}"
            time.sleep(0.2)
        else:
            raise AssertionError(f"not all tasks succeeded: {done[0]} of {len(ids)}")
    finally:
        sampler.stop.set()
        sampler.join(10)
        for w in workers:
            w.terminate()
        for w in workers:
            try:
                w.wait(15)
            except subprocess.TimeoutExpired:
                w.kill()
                w.wait(5)
    # 1. What the sampler saw while it ran.
    assert sampler.samples > 20
    assert 1 <= sampler.max_running <= PERMITS
    assert sampler.max_counter <= PERMITS
    assert sampler.max_per_key <= 1 and sampler.max_held <= 1
    # 2. The attempts' intervals (database clock): never more than the permits at once, and
    # never two attempts of one key at once.
    attempts = query(
        dsn,
        "SELECT t.concurrency_key, a.started_at, a.finished_at, a.concurrency_token"
        " FROM pulse_attempts a JOIN pulse_tasks t ON t.namespace_id = a.namespace_id"
        " AND t.id = a.task_id WHERE a.namespace_id = %s AND t.queue_id = %s"
        " AND a.started_at IS NOT NULL ORDER BY a.started_at",
        (ns_id, queue_id),
    )
    assert len(attempts) >= len(ids)
    assert _max_overlap([(s, f) for _, s, f, _ in attempts]) <= PERMITS
    for key in KEYS:
        mine = [(s, f, tok) for k, s, f, tok in attempts if k == key]
        assert len(mine) >= 8
        assert _max_overlap([(s, f) for s, f, _ in mine]) == 1
        tokens = [tok for _, _, tok in mine]
        assert tokens == sorted(tokens) and len(set(tokens)) == len(tokens)  # strictly up
    assert all(tok is None for k, _, _, tok in attempts if k is None)
    # 3. Every counter equals its recount; nothing is held any more.
    ((active, running),) = query(
        dsn,
        "SELECT u.active_attempts, (SELECT COUNT(*) FROM pulse_tasks t WHERE t.namespace_id ="
        " u.namespace_id AND t.queue_id = u.queue_id AND t.state = 'RUNNING') FROM"
        " pulse_queue_usage u WHERE u.namespace_id = %s AND u.queue_id = %s",
        (ns_id, queue_id),
    )
    assert int(active) == int(running) == 0
    limits = query(
        dsn,
        "SELECT l.held, (SELECT COUNT(*) FROM pulse_permits p WHERE p.namespace_id ="
        " l.namespace_id AND p.holder_ref = l.id), l.grant_revision FROM"
        " pulse_concurrency_limits l WHERE l.namespace_id = %s",
        (ns_id,),
    )
    assert len(limits) == 3
    for held, rows_held, revision in limits:
        assert int(held) == int(rows_held) == 0 and int(revision) >= 8
    ((app_active, app_running),) = query(
        dsn,
        "SELECT r.active_attempts, (SELECT COUNT(*) FROM pulse_tasks t WHERE t.namespace_id = %s"
        " AND t.owner_id = r.application_id AND t.state = 'RUNNING')"
        " FROM orbit_application_resources r WHERE r.application_id = %s",
        (ns_id, bytes.fromhex(t.application_id)),
    )
    assert int(app_active) == int(app_running) == 0
    # 4. The denials were explicit, counted on the queue, and visible in its GET.
    view = httpx.get(f"{servers[1].url}/v1/namespaces/{t.namespace}/queues/permits",
                     headers=t.auth, timeout=30).json()  # fmt: skip
    assert view["usage"]["active_attempts"] == 0
    denials = view["usage"]["denials"]
    assert set(denials) >= {"permits", "key", "rate", "application"}
    print(f"samples={sampler.samples} max_running={sampler.max_running}"
          f" max_per_key={sampler.max_per_key} attempts={len(attempts)} denials={denials}")  # fmt: skip
