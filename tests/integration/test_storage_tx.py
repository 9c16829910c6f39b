"""The transaction helper against the real server: session settings, retries, CAS, bytes."""

from __future__ import annotations

import asyncio

import pytest

from orbit import ids
from orbit.storage import CasConflict, Database, DuplicateKey, TransientExhausted, Tx
from orbit.storage.dsn import DSN


@pytest.fixture
async def scratch(empty_db: DSN):
    db = await Database.connect(empty_db, maxsize=6, max_retries=5)

    async def mk(tx: Tx) -> None:
        await tx.execute(
            "CREATE TABLE t (id BINARY(16) NOT NULL PRIMARY KEY, v INT NOT NULL,"
            " revision BIGINT UNSIGNED NOT NULL DEFAULT 1, UNIQUE KEY uq_t_v (v))"
        )

    await db.transaction(mk)
    try:
        yield db
    finally:
        await db.close()


async def test_session_runs_utc_and_read_committed(scratch: Database) -> None:
    row = await scratch.fetchone("SELECT @@session.time_zone AS tz, @@session.tx_isolation AS iso")
    assert row == {"tz": "+00:00", "iso": "READ-COMMITTED"}


async def test_binary_ids_round_trip(scratch: Database) -> None:
    raw = bytes(range(16))
    await scratch.transaction(lambda tx: tx.execute("INSERT INTO t (id, v) VALUES (%s, 1)", (raw,)))
    row = await scratch.fetchone("SELECT id FROM t WHERE id = %s", (raw,))
    assert row == {"id": raw} and ids.id_hex(row["id"]) == raw.hex()


async def test_cas_conflict_and_duplicate(scratch: Database) -> None:
    a = ids.new_id()
    await scratch.transaction(lambda tx: tx.execute("INSERT INTO t (id, v) VALUES (%s, 1)", (a,)))

    async def bump(tx: Tx, rev: int) -> None:
        await tx.cas(
            "UPDATE t SET v = v + 10, revision = revision + 1 WHERE id = %s AND revision = %s",
            (a, rev),
            "t",
        )

    await scratch.transaction(lambda tx: bump(tx, 1))
    with pytest.raises(CasConflict):
        await scratch.transaction(lambda tx: bump(tx, 1))
    b = ids.new_id()
    with pytest.raises(DuplicateKey) as err:
        await scratch.transaction(
            lambda tx: tx.execute("INSERT INTO t (id, v) VALUES (%s, 11)", (b,))
        )
    assert err.value.key == "uq_t_v"


async def test_failed_function_rolls_back(scratch: Database) -> None:
    c = ids.new_id()

    async def boom(tx: Tx) -> None:
        await tx.execute("INSERT INTO t (id, v) VALUES (%s, 100)", (c,))
        raise RuntimeError("boom")

    with pytest.raises(RuntimeError):
        await scratch.transaction(boom)
    assert await scratch.fetchone("SELECT id FROM t WHERE id = %s", (c,)) is None


async def test_real_deadlock_is_retried(scratch: Database) -> None:
    """Two transactions lock rows x and y in opposite orders: one gets 1213 and is retried."""
    x, y = ids.new_id(), ids.new_id()

    async def seed(tx: Tx) -> None:
        await tx.execute("INSERT INTO t (id, v) VALUES (%s, 201), (%s, 202)", (x, y))

    await scratch.transaction(seed)
    before = sum(scratch.stats.retries.values())
    both_locked_first = asyncio.Barrier(2)
    runs = {"a": 0, "b": 0}

    def worker(name: str, first: bytes, second: bytes):
        async def fn(tx: Tx) -> None:
            runs[name] += 1
            await tx.execute("SELECT v FROM t WHERE id = %s FOR UPDATE", (first,))
            if runs[name] == 1:
                await both_locked_first.wait()
            await tx.execute("UPDATE t SET revision = revision + 1 WHERE id = %s", (second,))

        return fn

    await asyncio.gather(
        scratch.transaction(worker("a", x, y)), scratch.transaction(worker("b", y, x))
    )
    assert sum(scratch.stats.retries.values()) - before >= 1
    assert scratch.stats.retries[1213] >= 1
    assert runs["a"] + runs["b"] >= 3
    rows = await scratch.fetchall("SELECT revision FROM t WHERE id IN (%s, %s)", (x, y))
    assert sorted(r["revision"] for r in rows) == [2, 2]


async def test_retries_are_bounded(empty_db: DSN) -> None:
    db = await Database.connect(empty_db, maxsize=2, max_retries=2)
    calls = 0

    async def always_deadlock(tx: Tx) -> None:
        nonlocal calls
        calls += 1
        import pymysql

        raise pymysql.err.OperationalError(1213, "Deadlock found (simulated)")

    try:
        with pytest.raises(TransientExhausted) as err:
            await db.transaction(always_deadlock)
        assert err.value.code == 1213 and calls == 3
        assert db.stats.exhausted == 1
    finally:
        await db.close()


async def test_lock_wait_timeout_rolls_back_then_retries(scratch: Database, empty_db: DSN) -> None:
    """1205 leaves the transaction open: the helper must ROLLBACK (dropping the first insert)."""
    z, w = ids.new_id(), ids.new_id()
    await scratch.transaction(lambda tx: tx.execute("INSERT INTO t (id, v) VALUES (%s, 301)", (z,)))
    holder = await Database.connect(empty_db, maxsize=1)
    locked = asyncio.Event()
    release = asyncio.Event()

    async def hold(tx: Tx) -> None:
        await tx.execute("SELECT v FROM t WHERE id = %s FOR UPDATE", (z,))
        locked.set()
        await release.wait()

    holder_task = asyncio.create_task(holder.transaction(hold))
    await locked.wait()
    tries = 0

    async def contender(tx: Tx) -> None:
        nonlocal tries
        tries += 1
        await tx.execute("SET SESSION innodb_lock_wait_timeout = 1")
        await tx.execute("INSERT INTO t (id, v) VALUES (%s, 302)", (w,))
        if tries == 1:
            await tx.execute("UPDATE t SET revision = revision + 1 WHERE id = %s", (z,))
        if tries >= 2:
            release.set()

    try:
        await scratch.transaction(contender)
    finally:
        release.set()
        await holder_task
        await holder.close()
    assert tries == 2 and scratch.stats.retries[1205] >= 1
    rows = await scratch.fetchall("SELECT v FROM t WHERE id = %s", (w,))
    assert rows == [{"v": 302}]  # the first try's insert was rolled back, not committed twice
