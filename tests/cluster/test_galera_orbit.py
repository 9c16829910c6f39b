"""Orbit's own transactions with writes on every node of a private 3-node Galera cluster.

Row locks and ``SKIP LOCKED`` are node-local on Galera: two nodes lock "the same" row at once
and the conflict surfaces at COMMIT as a certification failure (1213). These tests drive
real Orbit services through three pools, one per node, at the rows that every submit of a
queue shares (the queue's and the application's usage counters) and at one dedup identity,
and check the invariants the checker of the chaos run also checks: one task per identity,
counters equal to a recount, every commit-time conflict retried within the usual bounds and
counted as ``certification``."""

from __future__ import annotations

import asyncio
import sys
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import msgspec
import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent))
from galera import GaleraCluster, galera_cluster, require_galera

from orbit import migrate
from orbit.storage import Database, TransientExhausted
from pulse import submit as submit_service
from pulse.types import TaskSubmit

pytestmark = [pytest.mark.process, pytest.mark.timeout(600)]


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[GaleraCluster]:
    require_galera()
    with galera_cluster(tmp_path_factory.mktemp("galera-orbit")) as c:
        c.create_database("orbit")
        migrate.up(c.nodes[0].dsn("orbit"))
        yield c


@pytest.fixture
async def pools(cluster: GaleraCluster) -> AsyncIterator[list[Database]]:
    dbs = [await Database.connect(d, maxsize=6) for d in cluster.dsns("orbit")]
    try:
        yield dbs
    finally:
        for d in dbs:
            await d.close()


def _body(queue: str, n: int, dedup: str | None = None) -> TaskSubmit:
    raw = {"queue": queue, "kind": "k", "payload": {"n": n}}
    if dedup is not None:
        raw["dedup_key"] = dedup
    return msgspec.json.decode(msgspec.json.encode(raw), type=TaskSubmit)


async def test_submits_on_every_node_keep_counters_exact(pools: list[Database]) -> None:
    from pulse_fixtures import make_tenant

    t = await make_tenant(pools[0])
    per_node, concurrency = 40, 4
    refused = 0

    async def submit(db: Database, n: int) -> None:
        nonlocal refused
        while True:  # as an HTTP client does with the 503 + Retry-After it would get
            try:
                await submit_service.submit_one(db, t.namespace_id, t.application_id, _body(t.queue, n))
                return
            except TransientExhausted:  # rolled back: nothing was written, sending again is safe
                refused += 1
                await asyncio.sleep(0.2)

    async def producer(db: Database, base: int) -> None:
        for k in range(0, per_node, concurrency):
            await asyncio.gather(*(submit(db, base + k + j) for j in range(concurrency)))

    outs = await asyncio.gather(*(producer(db, 1000 * i) for i, db in enumerate(pools)), return_exceptions=True)
    assert [o for o in outs if o is not None] == []
    total = per_node * len(pools)
    for db in pools:  # every node reads the same, exact state (wsrep_sync_wait=1)
        n = await db.fetchone("SELECT COUNT(*) AS n FROM pulse_tasks WHERE namespace_id = %s", (t.namespace_id,))
        usage = await db.fetchone("SELECT SUM(unfinished_tasks) AS n FROM pulse_queue_usage WHERE namespace_id = %s",
                                  (t.namespace_id,))  # fmt: skip
        app = await db.fetchone("SELECT unfinished_tasks AS n FROM orbit_application_resources"
                                " WHERE application_id = %s", (t.application_id,))  # fmt: skip
        assert (n["n"], int(usage["n"]), app["n"]) == (total, total, total)
    kinds = sum((db.stats.retry_kinds for db in pools), start=type(pools[0].stats.retry_kinds)())
    # The hot usage rows conflicted across nodes: at COMMIT (certification) or, when another
    # node's write set arrived first, as an abort of the local transaction (deadlock).
    assert kinds["certification"] + kinds["deadlock"] > 0, kinds
    assert sum(db.stats.exhausted for db in pools) == refused  # every refusal was a 503, counted


async def test_one_dedup_identity_submitted_on_three_nodes_is_one_task(pools: list[Database]) -> None:
    from pulse_fixtures import make_tenant

    t = await make_tenant(pools[0])
    for round_ in range(10):
        key = f"same-{round_}"
        async def submit(db: Database, n: int = round_, key: str = key) -> Any:
            while True:
                try:
                    return await submit_service.submit_one(db, t.namespace_id, t.application_id,
                                                           _body(t.queue, n, key))  # fmt: skip
                except TransientExhausted:
                    await asyncio.sleep(0.2)

        outs = await asyncio.gather(*(submit(db) for db in pools for _ in range(2)))
        ids = {o.json()["id"] for o in outs}
        assert len(ids) == 1, outs
        assert sorted(o.status for o in outs) == [200] * 5 + [201]
    n = await pools[2].fetchone("SELECT COUNT(*) AS n FROM pulse_tasks WHERE namespace_id = %s", (t.namespace_id,))
    assert n["n"] == 10
