"""A report refused as *transient* is sent again (reliability bug 10, docs/sdk.md "Reports
refused as not ready").

The real server (uvicorn + Pulse routes and loops in the test's event loop, as in
test_sdk_worker_lease.py) runs on its own small connection pool with a short acquire
timeout, like ``orbit-server --pool-size/--pool-timeout``. ``Outage`` takes the database
away from it (nothing of the server is replaced): ``pool`` holds every connection of that
pool (answers: ``error`` ``not_ready``, 503), ``connection_limit`` runs the server as an
account with ``MAX_USER_CONNECTIONS``, kills its connections and takes every slot from
outside, so MariaDB refuses its new connections (1226). Every request that needs the
database — the worker's ``complete``, its heartbeats — is refused meanwhile.

* the handler finishes while the report is refused; once the database is available again
  the re-sent identical report is applied: SUCCEEDED with the handler's result, one
  attempt, exactly one receipt;
* when the database stays unavailable past the lease, the worker gives up (``report_lost``)
  *before* the lease can expire, stops sending, and the server recovers the attempt.

The retry/give-up decision itself (:func:`orbit_sdk._execution.report_retry_wait`) is
checked at unit level at the end.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import secrets
import time
from collections.abc import AsyncIterator
from dataclasses import replace
from datetime import UTC, datetime
from typing import Any

import msgspec
import pymysql
import pytest
from orbit_sdk import TaskContext, Worker
from orbit_sdk._backoff import Backoff
from orbit_sdk._execution import (
    TRANSIENT_REPORT_CODES,
    report_refusal_is_transient,
    report_retry_wait,
)
from orbit_sdk.errors import (
    InvalidRequest,
    NotFound,
    NotReady,
    OrbitConnectionError,
    OrbitError,
    RateLimited,
    StaleToken,
    error_from_code,
)
from test_pulse_worker_ws import Live

from orbit.storage import DSN, Database, Tx

POOL = 3
LIMIT = 4  # MAX_USER_CONNECTIONS of the server's account in the connection-limit variant


class Outage:
    """The server's database: ``take()`` makes it unavailable to the server, ``release()``
    gives it back. ``pool``: the test holds every connection of the server's pool (an
    exhausted pool, ``not_ready`` / ``pool_exhausted``). ``connection_limit``: the server
    runs as an account with ``MAX_USER_CONNECTIONS``; the test kills the server's
    connections and holds every slot from outside, so MariaDB refuses the server's new
    connections (1226), as in tests/reliability/test_max_user_connections.py."""

    def __init__(self, dsn: DSN, kind: str) -> None:
        self.kind = kind
        self.root = dsn
        self.account = dsn
        self.db: Database | None = None
        self.pooled: list[Any] = []
        self.outside: list[pymysql.connections.Connection] = []

    async def open(self) -> None:
        if self.kind == "connection_limit":
            user, password = f"orbit_rr_{secrets.token_hex(4)}", secrets.token_urlsafe(16)
            await asyncio.to_thread(
                self._root_sql,
                f"CREATE USER '{user}'@'%' IDENTIFIED BY '{password}'"
                f" WITH MAX_USER_CONNECTIONS {LIMIT}",
                f"GRANT ALL PRIVILEGES ON `{self.root.database}`.* TO '{user}'@'%'",
            )
            self.account = replace(self.root, user=user, password=password)
        self.db = await Database.connect(self.account, maxsize=POOL, acquire_timeout=0.3)

    async def close(self) -> None:
        self.release()
        if self.db is not None:
            await self.db.close()
        if self.account is not self.root:
            await asyncio.to_thread(
                self._root_sql, f"DROP USER IF EXISTS '{self.account.user}'@'%'"
            )

    def _root_sql(self, *statements: str) -> list[tuple[Any, ...]]:
        conn = pymysql.connect(autocommit=True, **self.root.connect_kwargs())
        try:
            rows: list[tuple[Any, ...]] = []
            with conn.cursor() as cur:
                for sql in statements:
                    cur.execute(sql)
                    rows = list(cur.fetchall())
            return rows
        finally:
            conn.close()

    async def take(self) -> None:
        assert self.db is not None
        if self.kind == "pool":
            async with asyncio.timeout(10):
                for pool in self.db.pools:  # the read pool's share too
                    while pool.freesize or pool.size < pool.maxsize:
                        self.pooled.append((pool, await pool.acquire()))
        else:
            await asyncio.to_thread(self._take_every_slot)

    def _take_every_slot(self) -> None:
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            for victim in self._server_connections():
                with contextlib.suppress(pymysql.MySQLError):  # already gone
                    self._root_sql(f"KILL CONNECTION {victim}")
            while len(self.outside) < LIMIT + 1:
                try:
                    self.outside.append(
                        pymysql.connect(autocommit=True, **self.account.connect_kwargs())
                    )
                except pymysql.MySQLError as exc:
                    assert exc.args[0] in (1226, 1203, 1040), exc
                    break
            if len(self.outside) >= LIMIT and not self._server_connections():
                return
            time.sleep(0.05)
        raise AssertionError(f"could not take every slot (held {len(self.outside)})")

    def _server_connections(self) -> list[int]:
        mine = {c.thread_id() for c in self.outside}
        rows = self._root_sql(
            f"SELECT ID FROM information_schema.PROCESSLIST WHERE USER = '{self.account.user}'"
        )
        return [int(r[0]) for r in rows if int(r[0]) not in mine]

    def release(self) -> None:
        assert self.db is not None
        for pool, conn in self.pooled:
            pool.release(conn)
        self.pooled.clear()
        for outside in self.outside:
            outside.close()
        self.outside.clear()


@pytest.fixture
async def outage(request: pytest.FixtureRequest, dsn: DSN) -> AsyncIterator[Outage]:
    held = Outage(dsn, getattr(request, "param", "pool"))
    await held.open()
    try:
        yield held
    finally:
        await held.close()


@pytest.fixture
async def live(outage: Outage) -> AsyncIterator[Live]:
    assert outage.db is not None
    server = Live(outage.db)
    await server.start()
    try:
        yield server
    finally:
        await server.stop()


def _worker(url: str, t: Any) -> Worker:
    return Worker(
        url, t.key, namespace=t.namespace, max_concurrency=1, drain_timeout=2.0,
        report_timeout=2.0, backoff=Backoff(initial=0.05, maximum=0.2),
    )  # fmt: skip


async def _row(db: Database, sql: str, args: tuple[Any, ...]) -> list[dict[str, Any]]:
    async def run(tx: Tx) -> list[dict[str, Any]]:
        return await tx.fetchall(sql, args)

    return await db.read(run)


async def _task(db: Database, t: Any, task_id: str) -> dict[str, Any]:
    (row,) = await _row(
        db,
        "SELECT state, attempts, result, effect_uncertain FROM pulse_tasks"
        " WHERE namespace_id = %s AND id = %s",
        (t.namespace_id, bytes.fromhex(task_id)),
    )
    return row


async def _attempts(db: Database, t: Any, task_id: str) -> list[dict[str, Any]]:
    return await _row(
        db,
        "SELECT id, state, lease_expires_at FROM pulse_attempts"
        " WHERE namespace_id = %s AND task_id = %s ORDER BY generation",
        (t.namespace_id, bytes.fromhex(task_id)),
    )


async def _receipts(db: Database, t: Any, attempt_id: bytes) -> list[dict[str, Any]]:
    return await _row(
        db,
        "SELECT receipt_op AS operation, receipt_task_state AS task_state FROM pulse_attempts"
        " WHERE namespace_id = %s AND id = %s AND receipt_id IS NOT NULL",
        (t.namespace_id, attempt_id),
    )


def _refusals(caplog: pytest.LogCaptureFixture) -> list[str]:
    """The error code of every refused report the worker logged (and re-sent)."""
    marker = "report refused: "
    return [
        r.getMessage().split(marker, 1)[1].split(" ", 1)[0]
        for r in caplog.records
        if r.name == "orbit_sdk.worker" and marker in r.getMessage()
    ]


def _heartbeats_refused(caplog: pytest.LogCaptureFixture) -> int:
    return sum(
        1
        for r in caplog.records
        if r.name == "orbit_sdk.worker" and "heartbeat rejected: " in r.getMessage()
    )


@pytest.mark.parametrize("outage", ["pool", "connection_limit"], indirect=True)
async def test_a_report_refused_not_ready_is_resent_and_applied_once(
    live, outage, db, tenant, caplog
) -> None:
    t = await tenant(lease_ms=9000)  # heartbeat every 3 s; give up 1.5 s before the lease
    worker = _worker(live.http, t)
    entered, finish = asyncio.Event(), asyncio.Event()

    @worker.task(t.queue, "work")
    async def work(ctx: TaskContext, payload: Any) -> dict[str, Any]:
        entered.set()
        await finish.wait()
        return {"answer": payload["n"] * 2}

    task = await t.submit(kind="work", payload={"n": 21})
    caplog.set_level(logging.INFO, logger="orbit_sdk")
    runner = asyncio.create_task(worker.run(max_tasks=1, install_signal_handlers=False))
    try:
        await asyncio.wait_for(entered.wait(), 15)
        await outage.take()  # from now on the server answers not_ready to everything
        finish.set()  # the handler returns: its `complete` is refused
        # Unavailable for 3.5 s: longer than a heartbeat interval, shorter than what is
        # left of the lease (at most 3 s passed since the last extension).
        await asyncio.sleep(3.5)
        assert len(_refusals(caplog)) >= 2  # refused, re-sent, refused again ...
        assert _heartbeats_refused(caplog) >= 1  # ... while it kept heartbeating
        assert not runner.done()  # still retrying, not given up
        outage.release()  # the database is available again
        stats = await asyncio.wait_for(runner, 30)
    finally:
        outage.release()
        finish.set()
        if not runner.done():
            worker.drain()
            await asyncio.wait_for(runner, 30)
    assert stats.outcomes == {"succeeded": 1}, stats
    row = await _task(db, t, task["id"])
    assert row["state"] == "SUCCEEDED" and row["attempts"] == 1, row
    assert msgspec.json.decode(row["result"]) == {"answer": 42}
    (attempt,) = await _attempts(db, t, task["id"])
    assert attempt["state"] == "SUCCEEDED"
    assert await _receipts(db, t, attempt["id"]) == [
        {"operation": "complete", "task_state": "SUCCEEDED"}
    ]
    codes = set(_refusals(caplog))
    if outage.kind == "pool":
        assert codes == {"not_ready"}, codes
    else:
        # Over HTTP a refused connection is 503 not_ready (reliability fix 9); over the
        # worker stream the server answers `internal` (its frame handler does not map
        # 1226), which the worker treats as transient too.
        assert codes and codes <= {"not_ready", "internal"}, codes


async def test_a_report_refused_past_the_lease_is_given_up_before_the_lease_expires(
    live, outage, db, tenant, caplog
) -> None:
    t = await tenant(lease_ms=3000)  # heartbeat every 1 s; give up 0.5 s before the lease
    worker = _worker(live.http, t)
    entered, finish = asyncio.Event(), asyncio.Event()

    @worker.task(t.queue, "work")
    async def work(ctx: TaskContext, payload: Any) -> dict[str, Any]:
        entered.set()
        await finish.wait()
        return {"ok": True}

    task = await t.submit(kind="work", payload={})
    caplog.set_level(logging.INFO, logger="orbit_sdk")
    runner = asyncio.create_task(worker.run(max_tasks=1, install_signal_handlers=False))
    try:
        await asyncio.wait_for(entered.wait(), 15)
        await outage.take()  # the database stays unavailable longer than the lease
        finish.set()
        async with asyncio.timeout(10):
            while True:
                if "report_lost" in worker.stats.outcomes:
                    break
                await asyncio.sleep(0.02)
        gave_up_at = datetime.now(UTC).replace(tzinfo=None)
        sent = len(_refusals(caplog))
        assert set(_refusals(caplog)) == {"not_ready"}
        await asyncio.sleep(1.0)
        assert len(_refusals(caplog)) == sent, "a report was sent again after giving up"
        outage.release()
        stats = await asyncio.wait_for(runner, 30)
    finally:
        outage.release()
        finish.set()
        if not runner.done():
            worker.drain()
            await asyncio.wait_for(runner, 30)
    assert stats.outcomes == {"report_lost": 1}, stats
    assert sent >= 1
    # Given up while the server still held the lease for this worker: never reported late.
    (attempt,) = await _attempts(db, t, task["id"])
    assert gave_up_at < attempt["lease_expires_at"], (gave_up_at, attempt)
    assert await _receipts(db, t, attempt["id"]) == []
    async with asyncio.timeout(20):  # recovery (or the session close) loses the attempt
        while True:
            row = await _task(db, t, task["id"])
            if row["state"] in {"NEEDS_REVIEW", "WAITING"}:
                break
            await asyncio.sleep(0.05)
    (attempt,) = await _attempts(db, t, task["id"])
    assert attempt["state"] == "LOST" and row["attempts"] == 1, (attempt, row)


# -- the decision, at unit level ------------------------------------------------------------


@pytest.mark.parametrize(
    "exc",
    [
        NotReady("database restarting"),
        RateLimited("slow down"),
        error_from_code("not_ready", "pool", details={"reason": "pool_exhausted"}),
        error_from_code("quota_exceeded", "q"),
        error_from_code("internal", "internal error"),
    ],
)
def test_transient_refusals_are_retried_after_backoff_or_retry_after(exc: OrbitError) -> None:
    assert exc.code in TRANSIENT_REPORT_CODES and report_refusal_is_transient(exc)
    assert report_retry_wait(exc, now=10.0, give_up_at=20.0, backoff_delay=0.3) == 0.3
    exc.retry_after = 2  # type: ignore[attr-defined]  # Retry-After wins when longer
    assert report_retry_wait(exc, now=10.0, give_up_at=20.0, backoff_delay=0.3) == 2
    assert report_retry_wait(exc, now=10.0, give_up_at=20.0, backoff_delay=4.0) == 4.0
    exc.retry_after = None  # type: ignore[attr-defined]
    # Never past the moment the lease can no longer be held: one last try there ...
    assert report_retry_wait(exc, now=19.5, give_up_at=20.0, backoff_delay=0.3) == 0.3
    assert report_retry_wait(exc, now=19.5, give_up_at=20.0, backoff_delay=3.0) == 0.5
    # ... and none after it.
    assert report_retry_wait(exc, now=20.0, give_up_at=20.0, backoff_delay=0.3) is None
    assert report_retry_wait(exc, now=25.0, give_up_at=20.0, backoff_delay=0.3) is None


@pytest.mark.parametrize(
    "exc",
    [
        StaleToken("stale"),
        error_from_code("stale_token", "stale", status=409),
        error_from_code("conflict", "state"),
        InvalidRequest("bad result"),
        error_from_code("payload_too_large", "big"),
        NotFound("attempt"),
        error_from_code("unauthenticated", "gone"),
        OrbitConnectionError("lost"),
    ],
)
def test_final_refusals_are_never_retried(exc: OrbitError) -> None:
    assert not report_refusal_is_transient(exc)
    assert report_retry_wait(exc, now=0.0, give_up_at=100.0, backoff_delay=0.1) is None
