"""The outside store of the keyed-fencing example: one JSON document per account (think of
an object in S3, a row in another team's database, a file on a share), and a **fenced
write** that the store itself checks.

``put`` is accepted only when the writer's fence is not older than the newest fence the
store has seen for that account, so a writer that was paused (GC, VM migration, SIGSTOP)
while a newer holder wrote cannot overwrite the newer data when it wakes up. The check is
at the resource, not at the coordinator: the paused writer does not know it lost its lease.

Two kinds of fence:

* ``Fence.token`` — Orbit's concurrency token for the task's ``concurrency_key``
  (``ctx.concurrency_token``): increases with every grant of the key, across tasks and
  attempts. The store keeps the highest token per account.
* no token (a server without keyed permits, see README) — the attempt's ``generation`` per
  task: a retry of a task has a higher generation than every earlier attempt of that task.
  The store keeps the highest generation per (account, task).

Besides the fence, ``put`` is a compare-and-set on the document ``version`` the writer read.
Without keyed permits two tasks of one account may run at the same time; the version check
turns their race into a retry instead of a lost update.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any
from urllib.parse import unquote, urlsplit

import pymysql

SCHEMA = (
    """CREATE TABLE IF NOT EXISTS statements (
      account VARCHAR(64) NOT NULL COMMENT 'Account (the concurrency key)',
      body MEDIUMTEXT NOT NULL COMMENT 'JSON document: {"entries": [...]}',
      version BIGINT NOT NULL COMMENT 'Incremented by every accepted put',
      fence_token BIGINT NOT NULL COMMENT 'Highest concurrency token seen (0: none)',
      PRIMARY KEY (account)
    ) ENGINE=InnoDB COMMENT='One document per account'""",
    """CREATE TABLE IF NOT EXISTS statement_task_fences (
      account VARCHAR(64) NOT NULL COMMENT 'Account',
      task_id CHAR(32) NOT NULL COMMENT 'Orbit task id',
      generation INT NOT NULL COMMENT 'Highest attempt generation of the task that wrote',
      PRIMARY KEY (account, task_id)
    ) ENGINE=InnoDB COMMENT='Generation fences (used while there is no concurrency token)'""",
    """CREATE TABLE IF NOT EXISTS fence_rejections (
      id BIGINT NOT NULL AUTO_INCREMENT,
      account VARCHAR(64) NOT NULL,
      task_id CHAR(32) NOT NULL,
      generation INT NOT NULL,
      token BIGINT NULL,
      reason VARCHAR(32) NOT NULL COMMENT 'stale_token or stale_generation',
      at DATETIME(6) NOT NULL,
      PRIMARY KEY (id)
    ) ENGINE=InnoDB COMMENT='Writes refused by the fence (kept for the operator)'""",
)


@dataclass(frozen=True)
class Fence:
    """Who is writing: the task, its attempt generation, and the key's token if any."""

    task_id: str
    generation: int
    token: int | None


def connect_kwargs(dsn: str) -> dict[str, Any]:
    """``mysql://user[:password]@host[:port]/database`` → pymysql arguments."""
    u = urlsplit(dsn)
    return {
        "host": u.hostname or "127.0.0.1",
        "port": u.port or 3306,
        "user": unquote(u.username or "root"),
        "password": unquote(u.password or ""),
        "database": u.path.lstrip("/"),
        "autocommit": False,
        "charset": "utf8mb4",
    }


class Store:
    """A blocking client of the store (call it through ``asyncio.to_thread``)."""

    def __init__(self, dsn: str) -> None:
        self.kwargs = connect_kwargs(dsn)

    def _conn(self) -> pymysql.connections.Connection:
        return pymysql.connect(**self.kwargs)

    def create_schema(self) -> None:
        conn = self._conn()
        try:
            with conn.cursor() as cur:
                for stmt in SCHEMA:
                    cur.execute(stmt)
            conn.commit()
        finally:
            conn.close()

    def read(self, account: str) -> tuple[dict[str, Any], int]:
        """The account's document and its version (an empty document at version 0)."""
        conn = self._conn()
        try:
            with conn.cursor() as cur:
                cur.execute("SELECT body, version FROM statements WHERE account = %s", (account,))
                row = cur.fetchone()
        finally:
            conn.close()
        return (json.loads(row[0]), int(row[1])) if row else ({"entries": []}, 0)

    def put(self, account: str, doc: dict[str, Any], expected_version: int, fence: Fence) -> str:
        """Write the document: ``"ok"``, ``"conflict"`` (the version moved: read again) or
        ``"stale"`` (the fence is older than one already seen: this writer lost the key;
        the refusal is recorded in ``fence_rejections``)."""
        conn = self._conn()
        try:
            with conn.cursor() as cur:
                cur.execute(
                    "INSERT IGNORE INTO statements (account, body, version, fence_token)"
                    " VALUES (%s, '{\"entries\": []}', 0, 0)",
                    (account,),
                )
                cur.execute(
                    "SELECT version, fence_token FROM statements WHERE account = %s FOR UPDATE",
                    (account,),
                )
                version, seen_token = (int(v) for v in cur.fetchone())
                reason = self._check_fence(cur, account, fence, seen_token)
                if reason is not None:
                    cur.execute(
                        "INSERT INTO fence_rejections (account, task_id, generation, token,"
                        " reason, at) VALUES (%s, %s, %s, %s, %s, UTC_TIMESTAMP(6))",
                        (account, fence.task_id, fence.generation, fence.token, reason),
                    )
                    conn.commit()
                    return "stale"
                if version != expected_version:
                    conn.rollback()
                    return "conflict"
                cur.execute(
                    "UPDATE statements SET body = %s, version = version + 1,"
                    " fence_token = GREATEST(fence_token, %s) WHERE account = %s",
                    (json.dumps(doc), fence.token or 0, account),
                )
            conn.commit()
            return "ok"
        except pymysql.err.OperationalError as exc:
            if exc.args and exc.args[0] in (1205, 1213):  # lock wait timeout, deadlock
                conn.rollback()
                return "conflict"
            raise
        finally:
            conn.close()

    @staticmethod
    def _check_fence(cur: Any, account: str, fence: Fence, seen_token: int) -> str | None:
        if fence.token is not None:
            return "stale_token" if fence.token < seen_token else None
        cur.execute(
            "INSERT IGNORE INTO statement_task_fences (account, task_id, generation)"
            " VALUES (%s, %s, 0)",
            (account, fence.task_id),
        )
        cur.execute(
            "SELECT generation FROM statement_task_fences WHERE account = %s AND task_id = %s"
            " FOR UPDATE",
            (account, fence.task_id),
        )
        if fence.generation < int(cur.fetchone()[0]):
            return "stale_generation"
        cur.execute(
            "UPDATE statement_task_fences SET generation = %s WHERE account = %s AND task_id = %s",
            (fence.generation, account, fence.task_id),
        )
        return None

    def documents(self) -> dict[str, dict[str, Any]]:
        conn = self._conn()
        try:
            with conn.cursor() as cur:
                cur.execute("SELECT account, body, version FROM statements")
                return {a: {**json.loads(b), "version": int(v)} for a, b, v in cur.fetchall()}
        finally:
            conn.close()

    def rejections(self) -> list[dict[str, Any]]:
        conn = self._conn()
        try:
            with conn.cursor() as cur:
                cur.execute(
                    "SELECT account, task_id, generation, token, reason FROM fence_rejections"
                    " ORDER BY id"
                )
                cols = ("account", "task_id", "generation", "token", "reason")
                return [dict(zip(cols, r, strict=True)) for r in cur.fetchall()]
        finally:
            conn.close()
