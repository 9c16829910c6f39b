"""The database's own limit: a raw aiomysql loop doing the durable task lifecycle
(insert; claim with ``FOR UPDATE SKIP LOCKED``; complete) against the same MariaDB, on a
scratch table, with Orbit's session settings (READ COMMITTED, autocommit off, durable
commits as the server is configured).

Shapes:

* ``one_row``: every task takes three transactions (insert 1; claim 1; complete 1) on
  ``connections`` connections, each running the whole lifecycle in a loop;
* ``batched``: one producer inserts ``insert_batch`` rows per transaction; ``connections``
  consumers each claim ``claim_batch`` rows per transaction and complete them all in one
  more transaction.

Rates are completed tasks per second over the measured window.
"""

from __future__ import annotations

import asyncio
import time
from typing import Any

import aiomysql
from pymysql.constants import CLIENT

from orbit.storage import DSN

TABLE = """
CREATE TABLE IF NOT EXISTS bench_dblimit (
  id BIGINT UNSIGNED NOT NULL AUTO_INCREMENT,
  state TINYINT NOT NULL DEFAULT 0,
  payload MEDIUMTEXT NOT NULL,
  result MEDIUMTEXT NULL,
  created_at DATETIME(6) NOT NULL,
  updated_at DATETIME(6) NOT NULL,
  PRIMARY KEY (id),
  KEY ix_bench_state (state, id)
) ENGINE=InnoDB
"""


async def _connect(dsn: DSN) -> aiomysql.Connection:
    conn = await aiomysql.connect(
        autocommit=False,
        client_flag=CLIENT.FOUND_ROWS,
        charset="utf8mb4",
        **dsn.connect_kwargs(),
    )
    async with conn.cursor() as cur:
        await cur.execute("SET SESSION TRANSACTION ISOLATION LEVEL READ COMMITTED")
        await cur.execute("SET SESSION time_zone = '+00:00'")
    return conn


async def _setup(dsn: DSN) -> None:
    conn = await _connect(dsn)
    try:
        async with conn.cursor() as cur:
            await cur.execute(TABLE)
            await cur.execute("TRUNCATE TABLE bench_dblimit")
        await conn.commit()
    finally:
        conn.close()


async def one_row(dsn: DSN, seconds: float, connections: int = 4) -> dict[str, Any]:
    await _setup(dsn)
    done = 0
    stop_at = time.monotonic() + seconds

    async def loop() -> None:
        nonlocal done
        conn = await _connect(dsn)
        try:
            async with conn.cursor() as cur:
                while time.monotonic() < stop_at:
                    await cur.execute(
                        "INSERT INTO bench_dblimit (payload, created_at, updated_at)"
                        " VALUES ('{}', UTC_TIMESTAMP(6), UTC_TIMESTAMP(6))"
                    )
                    await conn.commit()
                    await cur.execute(
                        "SELECT id FROM bench_dblimit WHERE state = 0 ORDER BY id LIMIT 1"
                        " FOR UPDATE SKIP LOCKED"
                    )
                    row = await cur.fetchone()
                    if row is None:
                        await conn.commit()
                        continue
                    await cur.execute(
                        "UPDATE bench_dblimit SET state = 1, updated_at = UTC_TIMESTAMP(6)"
                        " WHERE id = %s AND state = 0",
                        (row[0],),
                    )
                    await conn.commit()
                    await cur.execute(
                        "UPDATE bench_dblimit SET state = 2, result = 'null',"
                        " updated_at = UTC_TIMESTAMP(6) WHERE id = %s AND state = 1",
                        (row[0],),
                    )
                    await conn.commit()
                    done += 1
        finally:
            conn.close()

    began = time.monotonic()
    await asyncio.gather(*(loop() for _ in range(connections)))
    elapsed = time.monotonic() - began
    return {"tasks": done, "seconds": round(elapsed, 3), "per_s": round(done / elapsed, 1),
            "connections": connections}  # fmt: skip


async def batched(
    dsn: DSN,
    seconds: float,
    connections: int = 4,
    claim_batch: int = 32,
    insert_batch: int = 100,
) -> dict[str, Any]:
    await _setup(dsn)
    done = 0
    inserted = 0
    stop_at = time.monotonic() + seconds

    async def producer() -> None:
        nonlocal inserted
        conn = await _connect(dsn)
        values = ", ".join(["('{}', UTC_TIMESTAMP(6), UTC_TIMESTAMP(6))"] * insert_batch)
        try:
            async with conn.cursor() as cur:
                while time.monotonic() < stop_at:
                    if inserted - done > 20_000:  # keep a bounded backlog
                        await asyncio.sleep(0.005)
                        continue
                    await cur.execute(
                        "INSERT INTO bench_dblimit (payload, created_at, updated_at) VALUES "
                        + values
                    )
                    await conn.commit()
                    inserted += insert_batch
        finally:
            conn.close()

    async def consumer() -> None:
        nonlocal done
        conn = await _connect(dsn)
        try:
            async with conn.cursor() as cur:
                while time.monotonic() < stop_at:
                    await cur.execute(
                        "SELECT id FROM bench_dblimit WHERE state = 0 ORDER BY id LIMIT %s"
                        " FOR UPDATE SKIP LOCKED",
                        (claim_batch,),
                    )
                    ids = [r[0] for r in await cur.fetchall()]
                    if not ids:
                        await conn.commit()
                        await asyncio.sleep(0.001)
                        continue
                    marks = ", ".join(["%s"] * len(ids))
                    await cur.execute(
                        "UPDATE bench_dblimit SET state = 1, updated_at = UTC_TIMESTAMP(6)"
                        f" WHERE id IN ({marks}) AND state = 0",
                        ids,
                    )
                    await conn.commit()
                    await cur.execute(
                        "UPDATE bench_dblimit SET state = 2, result = 'null',"
                        f" updated_at = UTC_TIMESTAMP(6) WHERE id IN ({marks}) AND state = 1",
                        ids,
                    )
                    await conn.commit()
                    done += len(ids)
        finally:
            conn.close()

    began = time.monotonic()
    await asyncio.gather(producer(), *(consumer() for _ in range(connections)))
    elapsed = time.monotonic() - began
    return {
        "tasks": done,
        "seconds": round(elapsed, 3),
        "per_s": round(done / elapsed, 1),
        "connections": connections,
        "claim_batch": claim_batch,
        "insert_batch": insert_batch,
    }


async def run(dsn: DSN, seconds: float) -> dict[str, Any]:
    out = {
        "one_row": await one_row(dsn, seconds),
        "batched": await batched(dsn, seconds),
    }
    conn = await _connect(dsn)
    try:
        async with conn.cursor() as cur:
            await cur.execute("DROP TABLE IF EXISTS bench_dblimit")
        await conn.commit()
    finally:
        conn.close()
    return out
