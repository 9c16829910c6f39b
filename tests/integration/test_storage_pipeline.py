"""``Tx.pipeline``: several store calls, their statements sent together (one multi-statement
round trip per round), under each driver.

What the hot transactions rely on: every step gets exactly what it would get alone (rows,
``fetchone``/``fetchval``, counts, ``executemany``'s one multi-row INSERT, ``execute_batch``
counts); statements run in step order (so a lock order written as sequential calls holds);
a step that awaits twice joins the next round; a failing statement fails the pipeline with
the same error class as alone, runs nothing after it and leaves no step running; a step
that awaits anything but its ``Tx`` is refused; a nested pipeline rides the outer rounds.
"""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from orbit.storage import DSN, Database, DuplicateKey, Tx
from orbit.storage.drivers import DRIVER_MODULES, available

DRIVERS = [
    pytest.param(
        name,
        marks=pytest.mark.skipif(not available(name), reason=f"{name} is not installed: scripts/install dev"),
    )
    for name in DRIVER_MODULES
]

A, B, C = b"\x00" * 15 + b"\x01", b"'\\\"%s\n" + b"\xff" * 10, b"\x00" * 15 + b"\x03"


@pytest.fixture(params=DRIVERS)
async def pdb(request: pytest.FixtureRequest, empty_db: DSN) -> Any:
    db = await Database.connect(empty_db, maxsize=2, driver=request.param)

    async def ddl(tx: Tx) -> None:
        await tx.execute(
            "CREATE TABLE p (id BINARY(16) NOT NULL PRIMARY KEY, name VARCHAR(32) NOT NULL,"
            " n INT NOT NULL DEFAULT 0, UNIQUE KEY uq_p_name (name))"
        )
        await tx.execute("CREATE TABLE log (k INT AUTO_INCREMENT PRIMARY KEY, what TEXT)")
        await tx.executemany(
            "INSERT INTO p (id, name, n) VALUES (%s, %s, %s)", [(A, "a%", 1), (B, "b'", 2)]
        )

    await db.transaction(ddl)
    try:
        yield db
    finally:
        await db.close()


async def _val(db: Database, sql: str) -> int:
    return int(await db.transaction(lambda tx: tx.fetchval(sql)))


async def _rows(tx: Tx, ids: tuple[bytes, ...]) -> dict[bytes, Any]:
    rows = await tx.fetchall(
        "SELECT id, name, n FROM p WHERE id IN %(ids)s FOR UPDATE", {"ids": ids}
    )
    return {r["id"]: r for r in rows}


async def _two_rounds(tx: Tx) -> tuple[int, Any]:
    first = await tx.fetchval("SELECT COUNT(*) FROM p")
    again = await tx.fetchone("SELECT name FROM p WHERE id = %s", (B,))
    return first, again


async def test_each_step_gets_what_it_would_get_alone(pdb: Database) -> None:
    async def run(tx: Tx) -> tuple[list[Any], int]:
        out = await tx.pipeline(
            _rows(tx, (A, B)),
            tx.fetchone("SELECT name FROM p WHERE name = %s", ("a%",)),
            tx.fetchone("SELECT name FROM p WHERE id = %s", (C,)),
            tx.fetchval("SELECT 100 * %s AS x", (3,)),
            tx.execute("UPDATE p SET n = n + 10 WHERE id IN (%s, %s)", (A, B)),
            tx.executemany("INSERT INTO p (id, name) VALUES (%s, %s)", [(C, "c"), (b"d" * 16, "d")]),
            tx.executemany("INSERT INTO p (id, name) VALUES (%s, %s)", []),
            tx.execute_batch([
                ("UPDATE p SET n = 7 WHERE id = %s AND n = 0", (C,)),
                ("UPDATE p SET n = 7 WHERE id = %s AND n = 99", (A,)),
            ]),
            _two_rounds(tx),
            tx.fetchall("SELECT name FROM p WHERE n = 7 -- a trailing comment"),
        )  # fmt: skip
        return out, tx.round_trips

    out, trips = await pdb.transaction(run)
    rows, one, none, val, upd, ins, empty, counts, (count, again), sevens = out
    assert {k: (r["name"], r["n"]) for k, r in rows.items()} == {A: ("a%", 1), B: ("b'", 2)}
    assert one == {"name": "a%"} and none is None and val == 300
    assert upd == 2 and ins == 2 and empty == 0 and counts == [1, 0]
    assert count == 4 and again == {"name": "b'"}  # the second round saw the first's writes
    assert sevens == [{"name": "c"}]
    assert trips == 2  # two rounds: all first statements, then _two_rounds' second
    assert await _val(pdb, "SELECT SUM(n) FROM p") == 1 + 2 + 20 + 7


async def test_statements_run_in_step_order(pdb: Database) -> None:
    async def run(tx: Tx) -> list[Any]:
        return await tx.pipeline(*(
            tx.execute("INSERT INTO log (what) VALUES (%s)", (f"step {i}",)) for i in range(12)
        ))  # fmt: skip

    assert await pdb.transaction(run) == [1] * 12
    rows = await pdb.fetchall("SELECT what FROM log ORDER BY k")
    assert [r["what"] for r in rows] == [f"step {i}" for i in range(12)]


async def test_a_failing_statement_fails_the_pipeline_and_nothing_after_it_runs(
    pdb: Database,
) -> None:
    after: list[str] = []

    async def tail(tx: Tx) -> None:
        await tx.execute("INSERT INTO log (what) VALUES ('after')")
        after.append("resumed")  # never: the pipeline failed before results came back

    async def run(tx: Tx) -> None:
        await tx.pipeline(
            tx.execute("INSERT INTO log (what) VALUES ('before')"),
            tx.execute("INSERT INTO p (id, name) VALUES (%s, 'a%%')", (C,)),  # duplicate name
            tail(tx),
        )

    with pytest.raises(DuplicateKey) as caught:
        await pdb.transaction(run)
    assert caught.value.key == "uq_p_name"
    assert after == []
    assert await _val(pdb, "SELECT COUNT(*) FROM log") == 0  # rolled back as a whole

    # The connection is usable afterwards (no result left unread).
    assert await _val(pdb, "SELECT COUNT(*) FROM p") == 2


async def test_a_step_may_catch_its_duplicate_key_and_the_rest_run_in_order(
    pdb: Database,
) -> None:
    """Like ``weave.inbox.write_event``: a duplicate is an answer, not a failure. The
    statements after the failed one did not run; they go with the next round, after the
    catching step's own next statement — the order of running the steps one by one."""

    async def insert_or_note(tx: Tx) -> str:
        try:
            await tx.execute("INSERT INTO p (id, name) VALUES (%s, 'a%%')", (C,))
        except DuplicateKey as exc:
            await tx.execute("INSERT INTO log (what) VALUES (%s)", (f"dup {exc.key}",))
            return "duplicate"
        return "inserted"

    async def run(tx: Tx) -> tuple[list[Any], int]:
        out = await tx.pipeline(
            tx.execute("INSERT INTO log (what) VALUES ('before')"),
            insert_or_note(tx),
            tx.execute("INSERT INTO log (what) VALUES ('after')"),
            tx.execute_batch([
                ("INSERT INTO log (what) VALUES ('batch 1')", None),
                ("INSERT INTO log (what) VALUES ('batch 2')", None),
            ]),
        )  # fmt: skip
        return out, tx.round_trips

    out, trips = await pdb.transaction(run)
    assert out == [1, "duplicate", 1, [1, 1]] and trips == 2
    rows = await pdb.transaction(lambda tx: tx.fetchall("SELECT what FROM log ORDER BY k"))
    assert [r["what"] for r in rows] == ["before", "dup uq_p_name", "after", "batch 1", "batch 2"]


async def test_a_step_that_raises_closes_the_others(pdb: Database) -> None:
    resumed: list[int] = []

    async def boom(tx: Tx) -> None:
        await tx.fetchval("SELECT 1")
        raise ValueError("judged bad")

    async def slow(tx: Tx) -> None:
        await tx.fetchval("SELECT 1")
        await tx.fetchval("SELECT 2")
        resumed.append(2)

    with pytest.raises(ValueError, match="judged bad"):
        await pdb.transaction(lambda tx: tx.pipeline(boom(tx), slow(tx)))
    assert resumed == []


async def test_a_step_may_await_only_its_tx(pdb: Database) -> None:
    async def sleeper(tx: Tx) -> None:
        await asyncio.sleep(0.01)

    with pytest.raises(RuntimeError, match="awaited something other"):
        await pdb.transaction(lambda tx: tx.pipeline(tx.fetchval("SELECT 1"), sleeper(tx)))


async def test_a_nested_pipeline_shares_the_outer_round_trips(pdb: Database) -> None:
    async def inner(tx: Tx) -> list[Any]:
        return await tx.pipeline(
            tx.execute("INSERT INTO log (what) VALUES ('inner 1')"),
            _two_rounds(tx),
            tx.execute("INSERT INTO log (what) VALUES ('inner 2')"),
        )

    async def run(tx: Tx) -> tuple[list[Any], int]:
        out = await tx.pipeline(
            tx.execute("INSERT INTO log (what) VALUES ('outer 1')"),
            inner(tx),
            tx.execute("INSERT INTO log (what) VALUES ('outer 2')"),
        )
        return out, tx.round_trips

    out, trips = await pdb.transaction(run)
    assert out == [1, [1, (2, {"name": "b'"}), 1], 1]
    assert trips == 2  # the inner second round went alone
    rows = await pdb.transaction(lambda tx: tx.fetchall("SELECT what FROM log ORDER BY k"))
    assert [r["what"] for r in rows] == ["outer 1", "inner 1", "inner 2", "outer 2"]


async def test_steps_without_statements_and_an_empty_pipeline(pdb: Database) -> None:
    async def nothing(tx: Tx) -> str:
        return "done"

    async def run(tx: Tx) -> tuple[list[Any], list[Any], int]:
        return await tx.pipeline(nothing(tx)), await tx.pipeline(), tx.round_trips

    assert await pdb.transaction(run) == (["done"], [], 0)
