"""The inbox example (docs/examples/inbox/) gives exactly-once effects on at-least-once
deliveries: under dropped acks, lease-expiry redeliveries, server-side disconnects,
deliberate reordering, a subscriber process that kills itself between commit and ack, and
an external SIGKILL."""

from __future__ import annotations

import asyncio
import contextlib
import importlib.util
import json
import random
import signal
import sys
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from types import ModuleType
from typing import Any

import httpx
import pymysql
import pytest
from conftest import create_database, drop_database
from orbit_sdk import Subscriber
from subscription_fixtures import LiveServer, SubTenant, append_results, make_tenant

from orbit.http.subscription_stream import StreamOptions
from orbit.ids import id_hex, new_id
from orbit.storage import DSN, Database

EXAMPLE = Path(__file__).resolve().parents[2] / "docs" / "examples" / "inbox" / "inbox.py"


def load_example() -> ModuleType:
    spec = importlib.util.spec_from_file_location("inbox_example", EXAMPLE)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module


inbox_mod = load_example()


@pytest.fixture
def inbox_dsn() -> Iterator[DSN]:
    d = create_database("orbit_inbox")
    try:
        yield d
    finally:
        drop_database(d)


def dsn_url(d: DSN) -> str:
    return d.url(hide_password=False)


def inbox_state(d: DSN) -> dict[str, Any]:
    conn = pymysql.connect(autocommit=True, **d.connect_kwargs())
    try:
        with conn.cursor() as cur:
            cur.execute("SELECT COUNT(*), COUNT(DISTINCT event_id) FROM inbox_events")
            events, distinct = cur.fetchone()
            cur.execute("SELECT owner_id, balance, events FROM inbox_balances")
            balances = {r[0]: (int(r[1]), int(r[2])) for r in cur.fetchall()}
            cur.execute("SELECT task_id, seq, state FROM inbox_task_view")
            view = {r[0]: (int(r[1]), r[2]) for r in cur.fetchall()}
    finally:
        conn.close()
    return {"events": events, "distinct": distinct, "balances": balances, "view": view}


async def produce_two_per_task(db: Database, t: SubTenant, tasks: int) -> dict[str, Any]:
    """Each task gets NEEDS_REVIEW (amount 1) and later SUCCEEDED (amount 10), interleaved
    across tasks and batches; returns the expected final state."""
    owner = new_id()
    ids = [new_id() for _ in range(tasks)]
    final: dict[str, tuple[int, str]] = {}
    for chunk in range(0, tasks, 5):
        part = ids[chunk : chunk + 5]
        await append_results(
            db, t.namespace_id, len(part), state="NEEDS_REVIEW", owner_id=owner, task_ids=part,
            result={"amount": 1},
        )  # fmt: skip
    for chunk in range(0, tasks, 7):
        part = ids[chunk : chunk + 7]
        seqs = await append_results(
            db, t.namespace_id, len(part), state="SUCCEEDED", owner_id=owner, task_ids=part,
            result={"amount": 10},
        )  # fmt: skip
        for tid, seq in zip(part, seqs, strict=True):
            final[id_hex(tid)] = (seq, "SUCCEEDED")
    return {"owner": id_hex(owner), "events": 2 * tasks, "balance": 11 * tasks, "view": final}


async def acked_count(http: httpx.AsyncClient, t: SubTenant, name: str) -> int:
    r = await http.get(f"/v1/namespaces/{t.namespace}/subscriptions/{name}", headers=t.auth)
    return int(r.json()["backlog"]["acked"])


def assert_exactly_once(state: dict[str, Any], expected: dict[str, Any]) -> None:
    assert state["events"] == state["distinct"] == expected["events"]
    assert state["balances"] == {expected["owner"]: (expected["balance"], expected["events"])}
    assert state["view"] == expected["view"]  # only ever moved forward


@pytest.fixture
async def server(db: Database) -> AsyncIterator[LiveServer]:
    live = await LiveServer(
        db, options=StreamOptions(ping_interval_s=1, idle_timeout_s=10, poll_s=0.05)
    ).start()
    try:
        yield live
    finally:
        await live.stop()


async def test_exactly_once_under_redelivery_disconnects_and_reordering(
    server: LiveServer, db: Database, inbox_dsn: DSN
) -> None:
    t = await make_tenant(db)
    async with httpx.AsyncClient(base_url=server.base_url, timeout=30) as http:
        r = await http.put(
            f"/v1/namespaces/{t.namespace}/subscriptions/inbox",
            json={
                "start": "earliest",
                "ack_timeout_ms": 400,
                "max_in_flight": 8,
                "max_deliveries": 1000,
            },
            headers=t.auth,
        )
        assert r.status_code == 201
        expected = await produce_two_per_task(db, t, 20)
        inbox = await inbox_mod.Inbox.open(dsn_url(inbox_dsn))
        chaos = inbox_mod.Chaos(drop_ack=0.25, rng=random.Random(7))
        rng = random.Random(11)
        stats = {"applied": 0, "duplicates": 0, "reordered": 0, "disconnects": 0}
        held_back: set[str] = set()
        sub = Subscriber(server.base_url, t.key, t.namespace, "inbox")

        async def consume() -> None:
            async for d in sub:
                ev = d.event
                # Reordering: hold back the first hand-out of each NEEDS_REVIEW event, so its
                # task's SUCCEEDED (a higher seq) is usually applied first.
                if ev.state == "NEEDS_REVIEW" and d.event_id not in held_back:
                    held_back.add(d.event_id)
                    await d.nack(retry_after_ms=300)
                    continue
                view = inbox_state(inbox_dsn)["view"]
                if ev.state == "NEEDS_REVIEW" and view.get(ev.task_id, (0, ""))[1] == "SUCCEEDED":
                    stats["reordered"] += 1
                if await inbox_mod.handle(inbox, d, chaos):
                    stats["applied"] += 1
                else:
                    stats["duplicates"] += 1
                if rng.random() < 0.05:  # drop the connection from the server side
                    stats["disconnects"] += 1
                    for conn in [c for c in server.streams if c.sub.namespace_id == t.namespace_id]:
                        await conn.ws.close(code=1012)

        consumer = asyncio.create_task(consume())
        try:
            async with asyncio.timeout(90):
                while await acked_count(http, t, "inbox") < expected["events"]:
                    assert not consumer.done() or consumer.exception() is None
                    await asyncio.sleep(0.2)
        finally:
            await sub.aclose()
            consumer.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await consumer
            await inbox.close()
    assert_exactly_once(inbox_state(inbox_dsn), expected)
    assert stats["applied"] == expected["events"]
    assert stats["duplicates"] > 0  # redeliveries really happened and were absorbed
    assert stats["reordered"] > 0  # stale events really arrived after newer ones
    assert stats["disconnects"] > 0


async def test_exactly_once_with_killed_subscriber_processes(
    server: LiveServer, db: Database, inbox_dsn: DSN
) -> None:
    t = await make_tenant(db)
    async with httpx.AsyncClient(base_url=server.base_url, timeout=30) as http:
        r = await http.put(
            f"/v1/namespaces/{t.namespace}/subscriptions/inbox",
            json={
                "start": "earliest",
                "ack_timeout_ms": 1_000,
                "max_in_flight": 5,
                "max_deliveries": 1000,
            },
            headers=t.auth,
        )
        assert r.status_code == 201
        expected = await produce_two_per_task(db, t, 15)

        def argv(*extra: str) -> list[str]:
            return [
                sys.executable, str(EXAMPLE), "--url", server.base_url, "--key", t.key,
                "--namespace", t.namespace, "--subscription", "inbox", "--dsn", dsn_url(inbox_dsn),
                "--idle-exit-s", "3", *extra,
            ]  # fmt: skip

        exits: list[int] = []
        outputs: list[dict[str, int]] = []

        async def run_once(*extra: str) -> int:
            proc = await asyncio.create_subprocess_exec(
                *argv(*extra), stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.DEVNULL
            )
            out, _ = await asyncio.wait_for(proc.communicate(), 60)
            if proc.returncode == 0:
                outputs.append(json.loads(out.decode().strip().splitlines()[-1]))
            return proc.returncode or 0

        # 1) a run that dies right after its first COMMIT, before the ack
        exits.append(await run_once("--crash-after-commit", "1.0"))
        # 2) a run killed from outside (SIGKILL) while it is consuming
        proc = await asyncio.create_subprocess_exec(
            *argv(), stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.DEVNULL
        )
        for _ in range(600):  # wait until it has applied a few more events, then kill it
            if inbox_state_safe(inbox_dsn) >= 4:
                break
            await asyncio.sleep(0.05)
        proc.send_signal(signal.SIGKILL)
        exits.append(await proc.wait())
        # 3) runs that may kill themselves between commit and ack, until a clean run saw all
        for seed in range(40):
            exits.append(await run_once("--crash-after-commit", "0.15", "--seed", str(seed)))
            if exits[-1] == 0 and await acked_count(http, t, "inbox") == expected["events"]:
                break
    assert exits[:2] == [3, -signal.SIGKILL]
    assert outputs  # the last run exited cleanly after seeing everything
    assert_exactly_once(inbox_state(inbox_dsn), expected)
    assert history_has_redeliveries(db, t)


def inbox_state_safe(d: DSN) -> int:
    with contextlib.suppress(pymysql.err.ProgrammingError):
        return int(inbox_state(d)["events"])
    return 0


def history_has_redeliveries(db: Database, t: SubTenant) -> bool:
    conn = pymysql.connect(autocommit=True, **db.dsn.connect_kwargs())
    try:
        with conn.cursor() as cur:
            cur.execute(
                "SELECT MAX(attempts), SUM(state = 'ACKED'), COUNT(*) FROM orbit_deliveries WHERE namespace_id = %s",
                (t.namespace_id,),
            )
            most, acked, total = cur.fetchone()
    finally:
        conn.close()
    return bool(int(most) >= 2 and int(acked) == int(total))
