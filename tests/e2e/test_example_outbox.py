"""The outbox example (docs/examples/outbox/) against a real second database on the same
MariaDB server and a real ``orbit-server`` process: business writes and their task
submits commit together or not at all, and each committed row becomes exactly one task —
also when the relay is SIGKILLed holding rows it submitted but had not marked yet."""

from __future__ import annotations

import asyncio
import importlib.util
import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from types import ModuleType

import aiomysql
import pymysql
import pytest
from conftest import create_database, drop_database
from orbit_sdk import OrbitClient
from orbit_sdk.outbox import DDL, OutboxRelay, aenqueue, enqueue
from platform_fixtures import ROOT, PTenant, ServerProcess, new_tenant, process_env, raw_query

from orbit.storage import DSN, Database

pytestmark = pytest.mark.process

EXAMPLE = ROOT / "docs" / "examples" / "outbox" / "orders.py"


def load_example() -> ModuleType:
    spec = importlib.util.spec_from_file_location("outbox_example", EXAMPLE)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module


orders = load_example()


@pytest.fixture(scope="module")
def orbit(dsn: DSN) -> Iterator[ServerProcess]:
    s = ServerProcess(dsn)
    try:
        s.wait_ready()
        yield s
    finally:
        s.stop()


@pytest.fixture
def shop() -> Iterator[DSN]:
    d = create_database("orbit_outbox_shop")
    try:
        yield d
    finally:
        drop_database(d)


def url(d: DSN) -> str:
    return d.url(hide_password=False)


def env(server: ServerProcess, t: PTenant) -> dict[str, str]:
    return process_env(ORBIT_URL=server.url, ORBIT_KEY=t.key)


def _run(argv: list[str], e: dict[str, str]) -> subprocess.CompletedProcess[str]:
    return subprocess.run(argv, env=e, capture_output=True, text=True, timeout=120, check=False)


async def example(*args: str, e: dict[str, str]) -> subprocess.CompletedProcess[str]:
    return await asyncio.to_thread(_run, [sys.executable, str(EXAMPLE), *args], e)


def orbit_cli(*args: str) -> list[str]:
    return [sys.executable, "-m", "orbit_cmd.cli", *args]


async def cli(*args: str, e: dict[str, str]) -> subprocess.CompletedProcess[str]:
    return await asyncio.to_thread(_run, orbit_cli(*args), e)


def tasks_of(dsn: DSN, t: PTenant) -> list[int]:
    """Order ids of the confirmation tasks in Orbit (one per task)."""
    rows = raw_query(
        dsn, "SELECT payload FROM pulse_tasks WHERE namespace_id = %s AND kind = 'order_confirmation'",
        (t.namespace_id,),
    )  # fmt: skip
    return [int(json.loads(str(p))["order_id"]) for (p,) in rows]


async def test_committed_orders_get_exactly_one_task_despite_a_killed_relay(
    orbit: ServerProcess, shop: DSN, dsn: DSN, db: Database
) -> None:
    t = await new_tenant(db)
    async with OrbitClient(orbit.url, t.key, namespace=t.namespace) as client:
        await client.queues.put("emails")
    e = env(orbit, t)
    assert (await example("setup", "--dsn", url(shop), e=e)).returncode == 0
    placed = await example("place", "--dsn", url(shop), "--namespace", t.namespace, "--queue", "emails",
                     "--count", "200", "--rollback-every", "5", e=e)  # fmt: skip
    assert placed.returncode == 0, placed.stderr
    assert json.loads(placed.stdout) == {"placed": 160, "declined": 40}
    committed = {int(i) for (i,) in raw_query(shop, "SELECT id FROM orders")}
    assert len(committed) == 160
    assert raw_query(shop, "SELECT COUNT(*) FROM orbit_outbox") == [(160,)]

    # A relay killed while it holds rows it has submitted but not marked.
    relay = await asyncio.create_subprocess_exec(
        *orbit_cli("outbox", "relay", "--dsn", url(shop), "--batch", "40", "--lease-s", "1",
                   "--concurrency", "2"),
        env=e, stdout=asyncio.subprocess.DEVNULL, stderr=asyncio.subprocess.DEVNULL,
    )  # fmt: skip
    unmarked = 0
    try:
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            made = len(tasks_of(dsn, t))
            (sent,) = raw_query(
                shop, "SELECT COUNT(*) FROM orbit_outbox WHERE sent_at IS NOT NULL"
            )[0]
            if made > int(sent) and made < 160:  # submitted, not marked yet: now
                os.kill(relay.pid, signal.SIGKILL)
                await asyncio.wait_for(relay.wait(), 10)
                (sent,) = raw_query(
                    shop, "SELECT COUNT(*) FROM orbit_outbox WHERE sent_at IS NOT NULL"
                )[0]
                unmarked = len(tasks_of(dsn, t)) - int(sent)
                break
            await asyncio.sleep(0.005)
    finally:
        if relay.returncode is None:
            relay.kill()
            await asyncio.wait_for(relay.wait(), 10)
    assert unmarked > 0, "the relay was not killed between a submit and its mark"

    again = await cli("outbox", "relay", "--dsn", url(shop), "--batch", "40", "--lease-s", "1",
                      "--until-idle", e=e)  # fmt: skip
    assert again.returncode == 0, again.stderr
    # After the lease the killed relay's rows are sent again: Orbit answers with their tasks.
    deadline = time.monotonic() + 30
    while raw_query(shop, "SELECT COUNT(*) FROM orbit_outbox WHERE sent_at IS NULL")[0][0]:
        assert time.monotonic() < deadline, "rows left unsent"
        await asyncio.sleep(0.5)
        rerun = await cli("outbox", "relay", "--dsn", url(shop), "--until-idle", e=e)
        assert rerun.returncode == 0, rerun.stderr
    made = tasks_of(dsn, t)
    assert sorted(made) == sorted(committed)  # one task per committed order, no other
    status = await cli("outbox", "status", "--dsn", url(shop), "--json", e=e)
    assert status.returncode == 0, status.stderr
    counts = json.loads(status.stdout)
    assert counts["pending"] == 0 and counts["failed"] == 0 and counts["sent"] == 160
    checked = await example("check", "--dsn", url(shop), e=e)
    assert json.loads(checked.stdout) == {"orders": 160, "outbox_rows": 160, "sent": 160,
                                          "failed": 0}  # fmt: skip


async def test_the_in_process_relay_an_async_driver_and_a_refused_row(
    orbit: ServerProcess, shop: DSN, dsn: DSN, db: Database
) -> None:
    t = await new_tenant(db)
    conn = await aiomysql.connect(autocommit=False, charset="utf8mb4", **shop.connect_kwargs())
    try:
        async with conn.cursor() as cur:
            for statement in DDL:
                await cur.execute(statement)
        await conn.commit()
        for i in range(12):  # 10 committed, 2 rolled back
            async with conn.cursor() as cur:
                await aenqueue(cur, t.namespace, "async-q", "order_confirmation",
                               {"order_id": i}, priority=3)  # fmt: skip
            await (conn.rollback() if i >= 10 else conn.commit())
        async with conn.cursor() as cur:  # a row Orbit refuses for good: no such queue yet
            await aenqueue(cur, t.namespace, "later-q", "order_confirmation", {"order_id": 99})
        await conn.commit()
    finally:
        conn.close()
    async with OrbitClient(orbit.url, t.key) as client:
        await client.with_namespace(t.namespace).queues.put("async-q")
        relay = OutboxRelay(url(shop), client, batch=5)
        try:
            await relay.run(until_idle=True)
            assert relay.stats.sent == 10 and relay.stats.failed == 1
            counts = await relay.counts()
            assert counts["failed"] == 1 and counts["pending"] == 0
            (error,) = raw_query(
                shop, "SELECT last_error FROM orbit_outbox WHERE failed_at IS NOT NULL"
            )[0]
            assert "404" in str(error)
            await client.with_namespace(t.namespace).queues.put("later-q")
            assert await relay.requeue_failed() == 1
            await relay.run(until_idle=True)
            assert (await relay.counts())["sent"] == 11
        finally:
            await relay.close()
    assert sorted(tasks_of(dsn, t)) == [*range(10), 99]
    prios = raw_query(dsn, "SELECT DISTINCT priority, dedup_key LIKE 'outbox:%%' FROM pulse_tasks"
                      " WHERE namespace_id = %s AND queue_name = 'async-q'", (t.namespace_id,))  # fmt: skip
    assert prios == [(3, 1)]


async def test_the_cli_relay_exit_codes(orbit: ServerProcess, shop: DSN, db: Database) -> None:
    t = await new_tenant(db)
    e = env(orbit, t)
    ddl = await cli("outbox", "ddl", e=e)
    assert ddl.returncode == 0 and "CREATE TABLE IF NOT EXISTS orbit_outbox" in ddl.stdout
    made = await cli("outbox", "relay", "--dsn", url(shop), "--create-table", "--until-idle", e=e)
    assert made.returncode == 0, made.stderr
    assert json.loads(made.stdout)["claimed"] == 0
    conn = pymysql.connect(autocommit=False, **shop.connect_kwargs())
    try:
        with conn.cursor() as cur:
            enqueue(cur, t.namespace, "nowhere", "order_confirmation", {"order_id": 1})
        conn.commit()
    finally:
        conn.close()
    wrong = await cli("outbox", "relay", "--dsn", url(shop), "--until-idle",
                      e={**e, "ORBIT_KEY": "orb_wrong"})  # fmt: skip
    assert wrong.returncode == 1 and "401" in wrong.stderr, wrong.stderr
    assert raw_query(shop, "SELECT COUNT(*) FROM orbit_outbox WHERE failed_at IS NULL") == [(1,)]
    refused = await cli("outbox", "relay", "--dsn", url(shop), "--until-idle", e=e)
    assert json.loads(refused.stdout)["failed"] == 1  # no such queue: failed for good
    status = await cli("outbox", "status", "--dsn", url(shop), e=e)
    assert status.returncode == 1 and "failed" in status.stdout
    assert (await cli("outbox", "requeue-failed", "--dsn", url(shop), e=e)).returncode == 2
    again = await cli("outbox", "requeue-failed", "--dsn", url(shop), "--yes", "--json", e=e)
    assert json.loads(again.stdout) == {"requeued": 1}
    gone = await cli("outbox", "status", "--dsn", "mysql://root@127.0.0.1:1/shop", e=e)
    assert gone.returncode == 3, gone.stderr
    bad = await cli("outbox", "status", "--dsn", "postgres://x/y", e=e)
    assert bad.returncode == 2, bad.stderr
