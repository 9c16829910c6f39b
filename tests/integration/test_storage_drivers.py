"""The storage contract under each driver (``ORBIT_DB_DRIVER``: aiomysql, asyncmy).

Every test runs once per driver against the real MariaDB; the asyncmy leg is skipped only
when asyncmy is not installed. What Orbit's stores rely on, checked per driver: the session
(autocommit off, UTC, READ COMMITTED), matched-row counts (``CLIENT.FOUND_ROWS``: ``cas`` and
the guarded UPDATEs), ``bytes`` sent as binary (BINARY(16) ids with every byte value),
DATETIME(6) with microseconds both ways, one multi-row INSERT for ``executemany``, one round
trip with per-statement counts for ``execute_batch``, and errors raised as Orbit's own classes
with their MySQL numbers (1062 → ``DuplicateKey``, 1205 → retried then
``TransientExhausted``, a lost connection → retried, 4025 CHECK → ``CheckViolation``,
a full pool → ``PoolExhausted``).
"""

from __future__ import annotations

import asyncio
import datetime as dt
import importlib
from typing import Any

import pymysql
import pytest

from orbit.storage import (
    DSN,
    CasConflict,
    CheckViolation,
    ConnectionLost,
    Database,
    DatabaseError,
    DuplicateKey,
    OutcomeUnknown,
    PoolExhausted,
    StorageError,
    TransientExhausted,
    Tx,
)
from orbit.storage.drivers import DRIVER_MODULES, available, driver_name

DRIVERS = [
    pytest.param(
        name,
        marks=pytest.mark.skipif(not available(name), reason=f"{name} is not installed: scripts/install dev"),
    )
    for name in DRIVER_MODULES
]

SCHEMA = (
    """CREATE TABLE t (
        id BINARY(16) NOT NULL PRIMARY KEY,
        name VARCHAR(64) NOT NULL,
        revision INT NOT NULL DEFAULT 0,
        at DATETIME(6) NULL,
        doc JSON NULL CHECK (JSON_VALID(doc)),
        UNIQUE KEY uq_t_name (name)
    )""",
    "CREATE TABLE seq (n INT AUTO_INCREMENT PRIMARY KEY, v VARCHAR(8) NOT NULL)",
)

#: Every byte value, and the ones escaping must get right at either end of an id.
IDS: list[bytes] = [bytes(range(i, i + 16)) for i in range(0, 256, 16)] + [
    b"\x00'\\\"\n\r\x1a%s" + b"\xff" * 7,
    b"\xff" * 16,
]


@pytest.fixture(params=DRIVERS)
async def sdb(request: pytest.FixtureRequest, empty_db: DSN) -> Any:
    db = await Database.connect(empty_db, maxsize=3, driver=request.param)
    assert db.driver.name == request.param

    async def ddl(tx: Tx) -> None:
        for stmt in SCHEMA:
            await tx.execute(stmt)

    await db.transaction(ddl)
    try:
        yield db
    finally:
        await db.close()


def test_driver_name_comes_from_the_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("ORBIT_DB_DRIVER", raising=False)
    assert driver_name() == "aiomysql"
    monkeypatch.setenv("ORBIT_DB_DRIVER", "asyncmy")
    assert driver_name() == "asyncmy"
    assert driver_name("aiomysql") == "aiomysql"  # an explicit name wins
    monkeypatch.setenv("ORBIT_DB_DRIVER", "mysqlclient")
    with pytest.raises(ValueError, match="unknown database driver"):
        driver_name()


async def test_session_contract(sdb: Database) -> None:
    row = await sdb.fetchone(
        "SELECT @@session.autocommit AS ac, @@session.time_zone AS tz,"
        " @@session.tx_isolation AS iso, @@session.character_set_client AS cs"
    )
    assert row == {"ac": 0, "tz": "+00:00", "iso": "READ-COMMITTED", "cs": "utf8mb4"}


async def test_bytes_ids_and_datetime6_round_trip(sdb: Database) -> None:
    at = dt.datetime(2026, 11, 30, 3, 4, 5, 123456)

    async def write(tx: Tx) -> None:
        for k, i in enumerate(IDS):
            await tx.execute(
                "INSERT INTO t (id, name, at) VALUES (%s, %s, %s)",
                (i, f"n{k}-é'✓", at + dt.timedelta(microseconds=k)),
            )
        assert await tx.fetchall("SHOW WARNINGS") == []

    await sdb.transaction(write)
    rows = await sdb.fetchall("SELECT id, name, at, HEX(id) AS hx FROM t ORDER BY name")
    by_id = {r["id"]: r for r in rows}
    assert set(by_id) == set(IDS)
    for k, i in enumerate(IDS):
        r = by_id[i]
        assert isinstance(r["id"], bytes) and r["hx"] == i.hex().upper()
        assert r["name"] == f"n{k}-é'✓"
        assert r["at"] == at + dt.timedelta(microseconds=k)
    # Parameters as a WHERE predicate, and the server clock with microseconds.
    one = await sdb.fetchone("SELECT name FROM t WHERE id = %s", (IDS[-2],))
    assert one == {"name": f"n{len(IDS) - 2}-é'✓"}
    now = await sdb.now()
    assert isinstance(now, dt.datetime) and now.tzinfo is None
    assert abs((dt.datetime.now(dt.UTC).replace(tzinfo=None) - now).total_seconds()) < 60


async def test_matched_rows_and_cas(sdb: Database) -> None:
    await sdb.transaction(
        lambda tx: tx.execute("INSERT INTO t (id, name) VALUES (%s, 'a')", (IDS[0],))
    )

    async def same_value(tx: Tx) -> int:
        # FOUND_ROWS: an UPDATE that changes nothing still counts its matched row.
        return await tx.execute("UPDATE t SET name = 'a' WHERE id = %s", (IDS[0],))

    assert await sdb.transaction(same_value) == 1

    async def cas(tx: Tx, rev: int) -> None:
        await tx.cas("UPDATE t SET revision = revision + 1 WHERE id = %s AND revision = %s",
                     (IDS[0], rev), "t")  # fmt: skip

    await sdb.transaction(lambda tx: cas(tx, 0))
    with pytest.raises(CasConflict):
        await sdb.transaction(lambda tx: cas(tx, 0))
    assert await sdb.fetchone("SELECT revision FROM t") == {"revision": 1}


async def test_executemany_is_one_multi_row_insert(sdb: Database) -> None:
    rows = [(IDS[k], f"m{k}", None) for k in range(len(IDS))]

    async def run(tx: Tx) -> tuple[int, int]:
        before = await tx.fetchone("SHOW SESSION STATUS LIKE 'Com_insert'")
        n = await tx.executemany(
            "-- a leading comment must not split the batch\n"
            "INSERT INTO t (id, name, at) VALUES (%s, %s, %s)",
            rows,
        )
        after = await tx.fetchone("SHOW SESSION STATUS LIKE 'Com_insert'")
        assert before is not None and after is not None
        return n, int(after["Value"]) - int(before["Value"])

    n, inserts = await sdb.transaction(run)
    assert n == len(IDS)
    assert inserts == 1
    assert await sdb.fetchone("SELECT COUNT(*) AS c FROM t") == {"c": len(IDS)}

    async def lastrowid(tx: Tx) -> int | None:
        await tx.execute("INSERT INTO seq (v) VALUES (%s)", ("x",))
        return tx.lastrowid

    first = await sdb.transaction(lastrowid)
    assert first is not None and await sdb.transaction(lastrowid) == first + 1


async def test_execute_batch_counts_each_statement(sdb: Database) -> None:
    await sdb.transaction(lambda tx: tx.executemany(
        "INSERT INTO t (id, name) VALUES (%s, %s)", [(IDS[0], "a"), (IDS[1], "b")]))  # fmt: skip

    async def batch(tx: Tx) -> list[int]:
        return await tx.execute_batch([
            ("UPDATE t SET revision = 1 WHERE id = %s AND revision = 0", (IDS[0],)),
            ("UPDATE t SET revision = 1 WHERE id = %s AND revision = 5", (IDS[1],)),
            ("UPDATE t SET name = %s WHERE id = %s -- trailing comment", ("b", IDS[1])),
            ("UPDATE t SET revision = revision + 1 WHERE id IN (%s, %s)", (IDS[0], IDS[1])),
        ])  # fmt: skip

    assert await sdb.transaction(batch) == [1, 0, 1, 2]

    async def dup(tx: Tx) -> list[int]:
        return await tx.execute_batch([
            ("UPDATE t SET revision = 9 WHERE id = %s", (IDS[0],)),
            ("UPDATE t SET name = 'a' WHERE id = %s", (IDS[1],)),
            ("UPDATE t SET revision = 9 WHERE id = %s", (IDS[1],)),
        ])  # fmt: skip

    with pytest.raises(DuplicateKey) as info:
        await sdb.transaction(dup)
    assert info.value.key == "uq_t_name"
    rows = await sdb.fetchall("SELECT name, revision FROM t ORDER BY name")
    assert rows == [{"name": "a", "revision": 2}, {"name": "b", "revision": 1}]  # rolled back


async def test_errors_are_orbit_classes_with_their_numbers(sdb: Database) -> None:
    """Whatever the driver, its exceptions leave the storage layer as Orbit's own classes
    (orbit/storage/errors.py), with the MySQL error number as ``code`` and ``args[0]``."""
    await sdb.transaction(
        lambda tx: tx.execute("INSERT INTO t (id, name) VALUES (%s, 'a')", (IDS[0],))
    )
    with pytest.raises(DuplicateKey) as dup:
        await sdb.transaction(lambda tx: tx.execute(
            "INSERT INTO t (id, name) VALUES (%s, 'a')", (IDS[1],)))  # fmt: skip
    assert dup.value.key == "uq_t_name"
    with pytest.raises(CheckViolation) as check:
        await sdb.transaction(lambda tx: tx.execute(
            "INSERT INTO t (id, name, doc) VALUES (%s, 'c', 'not json')", (IDS[2],)))  # fmt: skip
    assert check.value.code in (4025, 3819) and check.value.args[0] == check.value.code
    with pytest.raises(DatabaseError) as syntax:
        await sdb.fetchall("SELEKT 1")
    assert syntax.value.code == 1064 and type(syntax.value) is DatabaseError
    assert not isinstance(syntax.value, pymysql.MySQLError)
    assert sdb.stats.retries == {}  # none of these is retried

    # Inside a transaction the store code sees the same classes (pulse/submit_rows.py catches
    # CheckViolation and carries on in the same transaction).
    async def caught(tx: Tx) -> int:
        try:
            await tx.execute("INSERT INTO t (id, name, doc) VALUES (%s, 'd', '{')", (IDS[3],))
        except CheckViolation as exc:
            return int(exc.code or 0)
        return 0

    assert await sdb.transaction(caught) in (4025, 3819)


async def test_lock_wait_timeout_is_retried_then_exhausted(sdb: Database) -> None:
    await sdb.transaction(
        lambda tx: tx.execute("INSERT INTO t (id, name) VALUES (%s, 'a')", (IDS[0],))
    )
    held = asyncio.Event()
    release = asyncio.Event()

    async def holder(tx: Tx) -> None:
        await tx.execute("SELECT id FROM t WHERE id = %s FOR UPDATE", (IDS[0],))
        held.set()
        await release.wait()

    task = asyncio.create_task(sdb.transaction(holder))
    await held.wait()
    try:

        async def waiter(tx: Tx) -> None:
            await tx.execute("SET SESSION innodb_lock_wait_timeout = 1")
            await tx.execute("UPDATE t SET revision = 1 WHERE id = %s", (IDS[0],))

        with pytest.raises(TransientExhausted) as info:
            await sdb.transaction(waiter, retries=1)
        assert info.value.code == 1205
        assert sdb.stats.retries[1205] == 2
    finally:
        release.set()
        await task

    async def reset(tx: Tx) -> None:  # pooled connections keep session variables
        await tx.execute("SET SESSION innodb_lock_wait_timeout = DEFAULT")

    for _ in range(3):
        await sdb.transaction(reset)


async def test_a_killed_connection_is_retried_on_a_new_one(sdb: Database) -> None:
    attempts: list[int] = []

    async def fn(tx: Tx) -> int:
        cid = int(await tx.fetchval("SELECT CONNECTION_ID()"))
        attempts.append(cid)
        if len(attempts) == 1:
            killer = pymysql.connect(autocommit=True, **sdb.dsn.connect_kwargs())
            try:
                with killer.cursor() as cur:
                    cur.execute(f"KILL CONNECTION {cid}")
            finally:
                killer.close()
            await asyncio.sleep(0.05)
        await tx.execute("INSERT INTO seq (v) VALUES ('k')")
        return cid

    cid = await sdb.transaction(fn)
    assert len(attempts) == 2 and cid != attempts[0]
    assert sum(sdb.stats.retries.values()) == 1
    assert set(sdb.stats.retries) <= {2006, 2013}
    assert await sdb.fetchone("SELECT COUNT(*) AS c FROM seq") == {"c": 1}


async def test_a_full_pool_sheds_and_a_bad_database_raises_a_database_error(sdb: Database) -> None:
    small = await Database.connect(sdb.dsn, maxsize=1, acquire_timeout=0.2, driver=sdb.driver.name)
    try:
        busy = asyncio.Event()
        done = asyncio.Event()

        async def hold(tx: Tx) -> None:
            busy.set()
            await done.wait()

        task = asyncio.create_task(small.transaction(hold))
        await busy.wait()
        with pytest.raises(PoolExhausted):
            await small.fetchone("SELECT 1 AS one")
        done.set()
        await task
        assert await small.fetchone("SELECT 1 AS one") == {"one": 1}
        assert small.pool_usage() == (1, 1, 1)
    finally:
        await small.close()
    with pytest.raises(DatabaseError) as info:
        await Database.connect(sdb.dsn.with_database("orbit_no_such_db"), driver=sdb.driver.name)
    assert info.value.code == 1049 and isinstance(info.value, StorageError)


def test_the_ids_are_sixteen_bytes() -> None:
    assert all(len(i) == 16 for i in IDS) and len(set(IDS)) == len(IDS)


async def test_bytes_are_sent_with_the_binary_prefix(sdb: Database) -> None:
    async def text(tx: Tx) -> str:
        return str(tx._cur.mogrify("SELECT %s", (b"\xff\x00",)))

    assert (await sdb.read(text)).startswith("SELECT _binary'")


async def test_a_commit_lost_is_outcome_unknown_never_retried(
    sdb: Database, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The driver's own 2013 during COMMIT (after the server committed) → OutcomeUnknown with
    ConnectionLost as its cause; not retried; a re-read decides."""
    errors = importlib.import_module(
        "asyncmy.errors" if sdb.driver.name == "asyncmy" else "pymysql.err"
    )
    conn = await sdb.pool.acquire()
    cls = type(conn)
    sdb.pool.release(conn)
    real_commit = cls.commit
    lost = []

    async def lossy_commit(self: Any) -> None:
        await real_commit(self)
        if not lost:
            lost.append(self)
            self.close()
            raise errors.OperationalError(2013, "Lost connection to server during query")

    monkeypatch.setattr(cls, "commit", lossy_commit)
    with pytest.raises(OutcomeUnknown) as info:
        await sdb.transaction(lambda tx: tx.execute("INSERT INTO seq (v) VALUES ('c')"))
    cause = info.value.__cause__
    assert type(cause) is ConnectionLost and cause.code == 2013
    assert sdb.stats.outcome_unknown == 1 and sdb.stats.retries == {}
    assert await sdb.fetchone("SELECT COUNT(*) AS c FROM seq") == {"c": 1}  # it did commit
