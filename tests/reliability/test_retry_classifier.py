"""The retry classifier of ``Database.transaction`` against docs/mysql-notes.md#errors-and-retries.

Faults are real where the database can be made to produce them (a duplicate submit race,
a CHECK violation, the immutability trigger, a statement time limit) and injected
otherwise: a ``Tx`` subclass raises the driver's own exception (``pymysql`` error with the
MySQL code) *at statement N of a real Orbit transaction* — every statement of a task submit
in turn — and a patched ``commit`` loses the connection during COMMIT.

Expected, per code:

| code | rule | checked |
| --- | --- | --- |
| 1213, 1020 | retry the whole transaction | retried once (``db.stats.retries``), exactly one task |
| 1205 | ROLLBACK, retry the whole transaction | same; the first try's writes are gone |
| 2013 before COMMIT | connection discarded, retried | same |
| 2013 during COMMIT | outcome unknown: ``OutcomeUnknown``, never retried; re-read decides | a re-submit (dedup key) yields exactly one task whether the commit happened or not; HTTP 503 + ``Retry-After`` |
| 1062 | expected for dedup: read the existing row | concurrent duplicate submits → one task, the others ``deduplicated`` |
| 4025/3819 CHECK, 1644 trigger, 1969 time limit | surfaced, never retried | no retry counted, nothing committed |
"""

from __future__ import annotations

import asyncio
from typing import Any

import aiomysql
import msgspec
import pymysql
import pytest
from reliability_support import query, record_figures

import orbit.storage.db as storage_db
from orbit.storage import DSN, Database, DatabaseError, OutcomeUnknown, Tx
from pulse import submit as submit_service
from pulse.types import TaskSubmit

RETRIED = (1213, 1205, 1020, 2013)


class Plan:
    """Raise ``code`` at statement ``at`` (0-based) of the first transaction attempt."""

    def __init__(self, code: int | None = None, at: int = 0) -> None:
        self.code = code
        self.at = at
        self.armed = code is not None
        self.counts: list[int] = []  # statements per attempt


PLAN = Plan()


class FaultTx(storage_db.Tx):
    __slots__ = ("_inject", "_n")

    def __init__(self, conn: Any, cur: Any) -> None:
        super().__init__(conn, cur)
        self._n = 0
        self._inject = PLAN.armed
        PLAN.armed = False
        PLAN.counts.append(0)

    def _tick(self) -> None:
        if self._inject and self._n == PLAN.at:
            assert PLAN.code is not None
            cls = pymysql.err.IntegrityError if PLAN.code == 1062 else pymysql.err.OperationalError
            msg = "Duplicate entry 'x' for key 'uq_injected'" if PLAN.code == 1062 else "injected"
            raise cls(PLAN.code, msg)
        self._n += 1
        PLAN.counts[-1] += 1

    async def execute(self, sql: str, args: Any = None) -> int:
        self._tick()
        return await super().execute(sql, args)

    async def executemany(self, sql: str, args: Any) -> int:
        self._tick()
        return await super().executemany(sql, args)

    async def execute_batch(self, statements: Any) -> list[int]:
        if len(statements) == 1:
            return [await self.execute(*statements[0])]
        self._tick()
        return await super().execute_batch(statements)


def _body(t: Any, dedup: str) -> TaskSubmit:
    raw = msgspec.json.encode({"queue": t.queue, "kind": "k", "dedup_key": dedup, "payload": {"d": dedup}})
    return msgspec.json.decode(raw, type=TaskSubmit)


def _count(dsn: DSN, t: Any, dedup: str) -> int:
    return int(query(dsn, "SELECT COUNT(*) FROM pulse_tasks WHERE namespace_id = %s AND dedup_key = %s",
                     (t.namespace_id, dedup))[0][0])  # fmt: skip


@pytest.fixture
def fault_tx(monkeypatch: pytest.MonkeyPatch) -> Plan:
    global PLAN
    PLAN = Plan()
    monkeypatch.setattr(storage_db, "Tx", FaultTx)
    return PLAN


async def test_transient_codes_at_every_statement_of_a_submit_are_retried(
    dsn: DSN, tenant: Any, fault_tx: Plan
) -> None:
    global PLAN
    t = await tenant()
    db = await Database.connect(dsn, maxsize=4)
    try:
        await submit_service.submit_one(db, t.namespace_id, t.application_id, _body(t, "probe"))
        statements = PLAN.counts[-1]
        assert statements >= 3
        injected = 0
        for code in RETRIED:
            for at in range(statements):
                PLAN = Plan(code, at)
                before = dict(db.stats.retries)
                dedup = f"d-{code}-{at}"
                res = await submit_service.submit_one(db, t.namespace_id, t.application_id, _body(t, dedup))
                injected += 1
                assert res.status == 201, (code, at)
                assert db.stats.retries[code] == before.get(code, 0) + 1, (code, at)
                assert len(PLAN.counts) == 2 and PLAN.counts[-1] == statements, (code, at, PLAN.counts)
                assert _count(dsn, t, dedup) == 1, (code, at)
        assert db.stats.exhausted == 0 and db.stats.outcome_unknown == 0
    finally:
        await db.close()
    record_figures("retry_classifier_transient", statements_per_submit=statements,
                   faults_injected=injected, codes=list(RETRIED))  # fmt: skip


async def test_injected_duplicate_key_is_surfaced_not_retried(dsn: DSN, tenant: Any, fault_tx: Plan) -> None:
    """A 1062 on an index the service does not expect is an error: surfaced as
    ``DuplicateKey`` (or the service's translation of it), never retried, nothing
    committed."""
    global PLAN
    t = await tenant()
    db = await Database.connect(dsn, maxsize=2)
    try:
        PLAN = Plan(1062, 1)
        with pytest.raises(Exception) as err:
            await submit_service.submit_one(db, t.namespace_id, t.application_id, _body(t, "dup"))
        assert "uq_injected" in repr(err.value) or "Duplicate" in repr(err.value) or err.type.__name__ == "DuplicateKey"
        assert dict(db.stats.retries) == {} and len(PLAN.counts) == 1
        assert _count(dsn, t, "dup") == 0
    finally:
        await db.close()


async def test_concurrent_duplicate_submits_read_the_existing_row(dsn: DSN, tenant: Any) -> None:
    """Real 1062 on the dedup index: eight concurrent submits of one identity → one task
    (201 once, 200 ``deduplicated`` seven times, all the same id)."""
    t = await tenant()
    db = await Database.connect(dsn, maxsize=8)
    try:
        results = await asyncio.gather(*(
            submit_service.submit_one(db, t.namespace_id, t.application_id, _body(t, "race"))
            for _ in range(8)
        ))  # fmt: skip
    finally:
        await db.close()
    statuses = sorted(r.status for r in results)
    ids = {msgspec.json.decode(r.reply.body)["id"] if isinstance(r.reply.body, bytes) else r.reply.body["id"]
           for r in results}  # fmt: skip
    assert statuses == [200] * 7 + [201]
    assert len(ids) == 1 and _count(dsn, t, "race") == 1


async def test_commit_lost_is_outcome_unknown_and_a_re_read_decides(
    dsn: DSN, tenant: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """2013 during COMMIT, both ways it can happen: the COMMIT reached the server (the
    answer was lost) or it did not. Either way ``OutcomeUnknown`` (counted, never retried);
    re-submitting the same identity then yields exactly one task."""
    t = await tenant()
    real_commit = aiomysql.Connection.commit
    mode: dict[str, str | None] = {"v": None}

    async def lossy_commit(self: aiomysql.Connection) -> None:
        how, mode["v"] = mode["v"], None
        if how == "after":
            await real_commit(self)
        if how is not None:
            self.close()
            raise pymysql.err.OperationalError(2013, "Lost connection to server during query")
        await real_commit(self)

    monkeypatch.setattr(aiomysql.Connection, "commit", lossy_commit)
    db = await Database.connect(dsn, maxsize=2)
    try:
        for how in ("after", "before"):
            dedup = f"commit-{how}"
            mode["v"] = how
            with pytest.raises(OutcomeUnknown):
                await submit_service.submit_one(db, t.namespace_id, t.application_id, _body(t, dedup))
            assert _count(dsn, t, dedup) == (1 if how == "after" else 0)
            again = await submit_service.submit_one(db, t.namespace_id, t.application_id, _body(t, dedup))
            assert again.status == (200 if how == "after" else 201)
            assert _count(dsn, t, dedup) == 1
        assert db.stats.outcome_unknown == 2 and dict(db.stats.retries) == {}
    finally:
        await db.close()


async def test_outcome_unknown_over_http_is_503_with_retry_after(
    db: Database, tenant: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    from platform_fixtures import asgi_client, make_app, pulse_routes


    t = await tenant()
    real_commit = aiomysql.Connection.commit
    armed = {"v": False}

    async def lossy_commit(self: aiomysql.Connection) -> None:
        if armed["v"]:
            armed["v"] = False
            self.close()
            raise pymysql.err.OperationalError(2013, "Lost connection to server during query")
        await real_commit(self)

    monkeypatch.setattr(aiomysql.Connection, "commit", lossy_commit)
    async with asgi_client(make_app(db, pulse_routes)) as c:
        armed["v"] = True
        r = await c.post(f"/v1/namespaces/{t.namespace}/tasks", headers=t.auth,
                         json={"queue": t.queue, "kind": "k", "dedup_key": "http-commit"})  # fmt: skip
    assert r.status_code == 503, r.text
    assert r.json()["error"]["code"] == "not_ready" and int(r.headers["retry-after"]) >= 1


async def _raises_code(db: Database, fn: Any) -> int | None:
    try:
        await db.transaction(fn)
    except DatabaseError as exc:
        return exc.code
    return None


async def test_check_trigger_and_time_limit_errors_are_surfaced_not_retried(
    dsn: DSN, tenant: Any
) -> None:
    t = await tenant()
    task = await t.submit()
    tid = bytes.fromhex(task["id"])
    db = await Database.connect(dsn, maxsize=2)
    marker = f"surfaced-{task['id'][:8]}"

    async def check_violation(tx: Tx) -> None:
        await tx.execute("UPDATE pulse_tasks SET kind = %s, revision = revision + 1"
                         " WHERE namespace_id = %s AND id = %s", (marker, t.namespace_id, tid))  # fmt: skip
        await tx.execute("UPDATE pulse_tasks SET priority = 42 WHERE namespace_id = %s AND id = %s",
                         (t.namespace_id, tid))  # fmt: skip

    async def trigger(tx: Tx) -> None:
        await tx.execute("UPDATE pulse_tasks SET kind = %s, revision = revision + 1"
                         " WHERE namespace_id = %s AND id = %s", (marker, t.namespace_id, tid))  # fmt: skip
        await tx.execute("UPDATE orbit_event_batches SET type = type WHERE namespace_id = %s LIMIT 1",
                         (t.namespace_id,))  # fmt: skip

    async def time_limit(tx: Tx) -> None:
        # (BENCHMARK() and SLEEP() are interrupted silently; a big join raises 1969)
        await tx.execute("SET STATEMENT max_statement_time = 0.01 FOR SELECT COUNT(*) FROM"
                         " information_schema.COLLATIONS a, information_schema.COLLATIONS b,"
                         " information_schema.COLLATIONS c")  # fmt: skip

    try:
        codes = {
            "check": await _raises_code(db, check_violation),
            "trigger": await _raises_code(db, trigger),
            "time_limit": await _raises_code(db, time_limit),
        }
        retries = dict(db.stats.retries)
    finally:
        await db.close()
    assert codes["check"] in (4025, 3819), codes
    assert codes["trigger"] == 1644, codes
    assert codes["time_limit"] in (1969, 3024), codes
    assert retries == {}
    kind = query(dsn, "SELECT kind, priority FROM pulse_tasks WHERE namespace_id = %s AND id = %s",
                 (t.namespace_id, tid))  # fmt: skip
    assert kind == [("k", task["priority"])]  # the first statements were rolled back
    record_figures("retry_classifier_surfaced", codes=codes, retries=retries)


async def test_a_saturated_pool_raises_pool_exhausted_and_leaks_nothing(dsn: DSN) -> None:
    """``Database(acquire_timeout=...)``: with every connection busy, a transaction gives up
    after the timeout with ``PoolExhausted`` (nothing run, not retried, HTTP maps it to 503);
    an acquire that wins the race with its cancellation is given back, so the pool keeps its
    size and serves again once the holder finishes."""
    from orbit.storage import PoolExhausted

    db = await Database.connect(dsn, maxsize=1, acquire_timeout=0.2)
    hold, release = asyncio.Event(), asyncio.Event()

    async def holder(tx: Tx) -> None:
        await tx.execute("SELECT 1")
        hold.set()
        await release.wait()

    ran = []

    async def other(tx: Tx) -> None:
        ran.append(1)

    try:
        busy = asyncio.create_task(db.transaction(holder))
        await hold.wait()
        loop = asyncio.get_running_loop()
        t0 = loop.time()
        for _ in range(5):
            with pytest.raises(PoolExhausted):
                await db.transaction(other)
        waited = loop.time() - t0
        release.set()
        await busy
        await db.transaction(other)
        assert ran == [1] and 0.9 <= waited < 3.0
        assert db.pool_usage()[0] == 1 and db.pool_usage()[1] == 1  # size 1, free again
        assert dict(db.stats.retries) == {}
    finally:
        release.set()
        await db.close()
