"""Several dispatchers on one database — separate connection pools in this process, and
separate server processes — never offer or start the same task twice and lose none."""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from pulse_worker_support import FakeConn, check_invariants, open_session

from orbit.ids import id_hex, parse_id
from orbit.storage import Database, Tx
from pulse import attempts, sessions, wire
from pulse.attempts import Report
from pulse.dispatch import Dispatcher
from pulse.hub import Hub

ROOT = Path(__file__).resolve().parents[2]


async def _work_until_done(db: Database, hub: Hub, conns: list[FakeConn], ns: bytes, total: int,
                           seen: list[str], timeout_s: float = 60) -> None:  # fmt: skip
    """Dispatch, start and complete through ``conns`` until the namespace has ``total``
    SUCCEEDED tasks. Every started attempt id goes to ``seen``."""
    d = Dispatcher(db, hub)
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout_s
    while loop.time() < deadline:
        progressed = 0
        for conn in conns:
            progressed += await d.dispatch_to(conn)
            for offer in conn.take_offers():
                aid = parse_id(offer.attempt_id)
                reply = await attempts.start(db, ns, conn.info.session_id, aid)
                if isinstance(reply, wire.Started):
                    seen.append(offer.task.id)
                    await attempts.report(
                        db, ns, Report("complete", aid, reply.execution_token,
                                       result=_result(offer.task.id)),
                    )  # fmt: skip
        if progressed == 0:
            if await _succeeded(db, ns) >= total:
                return
            await asyncio.sleep(0.01)
    raise AssertionError("workers did not finish in time")


def _result(task_id: str):
    import msgspec

    return msgspec.Raw(json.dumps({"task": task_id}).encode())


async def _succeeded(db: Database, ns: bytes) -> int:
    async def run(tx: Tx) -> int:
        return int(
            await tx.fetchval(
                "SELECT COUNT(*) FROM pulse_tasks WHERE namespace_id = %s AND state = 'SUCCEEDED'",
                (ns,),
            )
        )

    return await db.read(run)


async def _attempt_summary(db: Database, ns: bytes) -> list[dict]:
    async def run(tx: Tx) -> list[dict]:
        return await tx.fetchall(
            "SELECT t.id, t.state, t.attempts, t.result,"
            " SUM(a.started_at IS NOT NULL) AS started, COUNT(a.id) AS offered"
            " FROM pulse_tasks t LEFT JOIN pulse_attempts a"
            "  ON a.namespace_id = t.namespace_id AND a.task_id = t.id"
            " WHERE t.namespace_id = %s GROUP BY t.id, t.state, t.attempts, t.result",
            (ns,),
        )

    return await db.read(run)


async def test_dispatchers_on_separate_pools_never_double_start(db, dsn, tenant) -> None:
    t = await tenant()
    n_tasks = 60
    for _ in range(n_tasks):
        await t.submit()
    pools = [await Database.connect(dsn, maxsize=4) for _ in range(4)]
    try:
        hubs = [Hub(f"pool-node-{i}") for i in range(len(pools))]
        seen: list[str] = []
        workers = []
        for pool, hub in zip(pools, hubs, strict=True):
            conns = []
            for _ in range(2):
                info, _ = await open_session(pool, t, max_concurrency=5)
                queues = await sessions.resolve_queues(pool, info.namespace_id, info.queues)
                conn = FakeConn(info, queues)
                assert await sessions.attach_node(
                    pool, t.namespace_id, info.session_id, hub.node_id
                )
                hub.register(conn)
                conns.append(conn)
            workers.append(_work_until_done(pool, hub, conns, t.namespace_id, n_tasks, seen))
        await asyncio.gather(*workers)
    finally:
        for p in pools:
            await p.close()
    assert len(seen) == n_tasks and len(set(seen)) == n_tasks  # each started exactly once
    rows = await _attempt_summary(db, t.namespace_id)
    assert len(rows) == n_tasks
    for r in rows:
        assert r["state"] == "SUCCEEDED" and r["attempts"] == 1
        assert int(r["started"]) == 1 and int(r["offered"]) == 1
        assert json.loads(r["result"]) == {"task": id_hex(r["id"])}
    await check_invariants(db, t.namespace_id)


CHILD = r"""
import asyncio, json, os, sys
sys.path[:0] = [os.environ["ORBIT_ROOT"], os.path.join(os.environ["ORBIT_ROOT"], "tests"),
                os.path.join(os.environ["ORBIT_ROOT"], "tests", "integration")]
from orbit.storage import DSN, Database
from pulse.hub import Hub
from pulse_fixtures import Tenant
from pulse_worker_support import FakeConn, open_session
from pulse import sessions
from test_pulse_dispatch_concurrency import _work_until_done

async def main():
    a = json.loads(sys.argv[1])
    db = await Database.connect(DSN.parse(a["dsn"]), maxsize=4)
    t = Tenant(db=db, application_id=bytes.fromhex(a["app"]), application="x",
               namespace_id=bytes.fromhex(a["ns"]), namespace=a["ns_name"],
               credential_id=bytes.fromhex(a["cred"]), key="", queue=a["queue"])
    hub = Hub(f"proc-{os.getpid()}")
    conns = []
    for _ in range(2):
        info, _ = await open_session(db, t, max_concurrency=4)
        queues = await sessions.resolve_queues(db, info.namespace_id, info.queues)
        conn = FakeConn(info, queues)
        await sessions.attach_node(db, info.namespace_id, info.session_id, hub.node_id)
        hub.register(conn)
        conns.append(conn)
    seen = []
    await _work_until_done(db, hub, conns, t.namespace_id, a["total"], seen, timeout_s=90)
    await db.close()
    print(json.dumps(seen))

asyncio.run(main())
"""


@pytest.mark.process
async def test_server_processes_never_double_start(db, dsn, tenant) -> None:
    t = await tenant()
    n_tasks = 60
    for _ in range(n_tasks // 2):
        await t.submit()
    args = json.dumps({
        "dsn": dsn.url(hide_password=False), "app": id_hex(t.application_id),
        "ns": id_hex(t.namespace_id), "ns_name": t.namespace,
        "cred": id_hex(t.credential_id), "queue": t.queue, "total": n_tasks,
    })  # fmt: skip
    env = {**os.environ, "ORBIT_ROOT": str(ROOT)}
    procs = [
        await asyncio.create_subprocess_exec(
            sys.executable,
            "-c",
            CHILD,
            args,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            env=env,
        )
        for _ in range(3)
    ]
    # More work arrives while they run (they find it by polling).
    for _ in range(n_tasks - n_tasks // 2):
        await t.submit()
    seen: list[str] = []
    for p in procs:
        out, err = await asyncio.wait_for(p.communicate(), 110)
        assert p.returncode == 0, err.decode()[-3000:]
        seen.extend(json.loads(out.decode().strip().splitlines()[-1]))
    assert len(seen) == n_tasks and len(set(seen)) == n_tasks
    rows = await _attempt_summary(db, t.namespace_id)
    assert len(rows) == n_tasks
    assert all(r["state"] == "SUCCEEDED" and int(r["started"]) == 1 for r in rows)
    await check_invariants(db, t.namespace_id)
