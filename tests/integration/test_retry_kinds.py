"""Retries counted by kind (``db.stats.retry_kinds``, ``orbit_db_transaction_retries_by_kind_total``).

A Galera node reports a write set that failed certification as 1213 *from COMMIT*; a single
server reports deadlocks from the statement that asked for the lock. ``Database.transaction``
retries both within the same bounds and counts them apart: ``certification`` vs
``deadlock``. The real certification failure on a 3-node cluster is in
tests/cluster/test_galera_orbit.py; here COMMIT is made to answer what a Galera node answers
(the server's transaction rolled back, 1213 raised), and a real deadlock is made with two
connections. A node outside the primary component (1047) is a 503, not a 500."""

from __future__ import annotations

import asyncio
from typing import Any

import aiomysql
import pymysql
import pytest
from hypothesis import given
from hypothesis import strategies as st

from orbit.storage import DSN, Database, Tx
from orbit.storage.errors import CONNECTION_ERRORS, RETRYABLE, retry_kind


@given(st.sampled_from(sorted(RETRYABLE | CONNECTION_ERRORS)), st.booleans())
def test_every_retried_code_has_a_kind(code: int, at_commit: bool) -> None:
    kind = retry_kind(code, at_commit=at_commit)
    assert kind != "other"
    assert (kind == "certification") == (code == 1213 and at_commit)


async def _table(db: Database, name: str) -> None:
    async def create(tx: Tx) -> None:
        await tx.execute(f"CREATE TABLE IF NOT EXISTS {name} (k INT PRIMARY KEY, n INT NOT NULL) ENGINE=InnoDB")
        await tx.execute(f"REPLACE INTO {name} VALUES (1, 0), (2, 0)")

    await db.transaction(create)


async def test_a_commit_refused_like_a_certification_failure_is_retried_and_counted(
    dsn: DSN, monkeypatch: pytest.MonkeyPatch
) -> None:
    db = await Database.connect(dsn, maxsize=2)
    try:
        await _table(db, "rk_cert")
        real_commit = aiomysql.Connection.commit
        armed = {"n": 1}

        async def certification_failure(self: aiomysql.Connection) -> None:
            if armed["n"]:
                armed["n"] -= 1
                await self.rollback()  # what the node did with the losing write set
                raise pymysql.err.OperationalError(1213, "Deadlock found when trying to get lock; try restarting transaction")
            await real_commit(self)

        monkeypatch.setattr(aiomysql.Connection, "commit", certification_failure)
        runs = 0

        async def bump(tx: Tx) -> None:
            nonlocal runs
            runs += 1
            await tx.execute("UPDATE rk_cert SET n = n + 1 WHERE k = 1")

        await db.transaction(bump)
        assert runs == 2
        assert dict(db.stats.retry_kinds) == {"certification": 1} and db.stats.retries[1213] == 1
        assert await db.fetchone("SELECT n FROM rk_cert WHERE k = 1") == {"n": 1}
    finally:
        await db.close()


async def test_a_real_deadlock_is_counted_as_deadlock(dsn: DSN) -> None:
    db = await Database.connect(dsn, maxsize=4)
    try:
        await _table(db, "rk_dead")
        first_locked = [asyncio.Event(), asyncio.Event()]

        def crossing(me: int) -> Any:
            async def fn(tx: Tx) -> None:
                a, b = (1, 2) if me == 0 else (2, 1)
                await tx.execute("UPDATE rk_dead SET n = n + 1 WHERE k = %s", (a,))
                first_locked[me].set()
                await first_locked[1 - me].wait()
                await tx.execute("UPDATE rk_dead SET n = n + 1 WHERE k = %s", (b,))

            return fn

        await asyncio.gather(db.transaction(crossing(0)), db.transaction(crossing(1)))
        assert db.stats.retry_kinds["deadlock"] >= 1 and "certification" not in db.stats.retry_kinds
        assert await db.fetchall("SELECT n FROM rk_dead ORDER BY k") == [{"n": 2}, {"n": 2}]
    finally:
        await db.close()


async def test_metrics_expose_retries_by_kind(db: Database) -> None:
    from platform_fixtures import asgi_client, make_app

    db.stats.retry_kinds["certification"] += 0  # the series exists once a kind was seen
    app = make_app(db)
    async with asgi_client(app) as client:
        body = (await client.get("/metrics")).text
    assert "orbit_db_transaction_retries_by_kind_total" in body


async def test_a_node_outside_the_primary_component_answers_503(db: Database) -> None:
    from platform_fixtures import asgi_client, make_app
    from starlette.routing import Route

    async def refuse(_: Any) -> Any:
        async def run(tx: Any) -> None:  # the driver's error, as the node would raise it
            raise pymysql.err.OperationalError(
                1047, "WSREP has not yet prepared node for application use"
            )

        await db.transaction(run)  # leaves the storage layer as NodeNotReady

    app = make_app(db, [Route("/t/refuse", refuse)])
    async with asgi_client(app) as client:
        r = await client.get("/t/refuse")
    assert r.status_code == 503 and r.headers.get("retry-after") == "1"
    err = r.json()["error"]
    assert err["code"] == "not_ready" and err["details"]["reason"] == "cluster_not_primary"


async def test_a_commit_the_node_could_not_replicate_is_an_unknown_outcome(
    dsn: DSN, monkeypatch: pytest.MonkeyPatch
) -> None:
    """1180 from COMMIT: a Galera node lost the primary component while replicating it (the
    20-minute cluster run met it four times, then as a 500). Not retried blindly: the
    caller re-reads (HTTP: 503 outcome_unknown; clients re-send with their keys)."""
    from orbit.storage import OutcomeUnknown

    db = await Database.connect(dsn, maxsize=2)
    try:
        await _table(db, "rk_1180")
        real_commit = aiomysql.Connection.commit
        armed = {"n": 1}

        async def not_replicated(self: aiomysql.Connection) -> None:
            if armed["n"]:
                armed["n"] -= 1
                await self.rollback()
                raise pymysql.err.OperationalError(
                    1180, "Error while appending streaming replication fragment(provider status: "
                    "Not connected to Primary Component)")  # fmt: skip
            await real_commit(self)

        monkeypatch.setattr(aiomysql.Connection, "commit", not_replicated)

        async def bump(tx: Tx) -> None:
            await tx.execute("UPDATE rk_1180 SET n = n + 1 WHERE k = 1")

        with pytest.raises(OutcomeUnknown):
            await db.transaction(bump)
        assert db.stats.outcome_unknown == 1 and dict(db.stats.retry_kinds) == {}
        await db.transaction(bump)  # the re-send, after a re-read, goes through
        assert await db.fetchone("SELECT n FROM rk_1180 WHERE k = 1") == {"n": 1}
    finally:
        await db.close()
