"""Transactional enqueue: record a task submit in YOUR database's transaction, relay it later.

A service that writes its own data and submits an Orbit task has two commits to make agree.
The outbox makes them one: :func:`enqueue` (or :func:`aenqueue`) writes the submit as a row
of the ``orbit_outbox`` table in the service's own MySQL/MariaDB database, in the same
transaction as the business write. A committed transaction has its row; a rolled-back one
has none. An :class:`OutboxRelay` (``orbit outbox relay --dsn …``, or a task inside the
service) then submits every committed row to Orbit:

* each row carries a random key; the submit's ``Idempotency-Key`` is ``outbox-<key>``, and a
  task without a ``dedup_key`` gets ``outbox:<key>`` — so however often a row is sent (a
  relay killed between submitting and marking it, two relays, a restart days later) Orbit
  creates its task **once**: the key replays the first answer for 24 h, the dedup key
  answers the same task after that;
* rows are claimed with a lease in a short transaction (``FOR UPDATE SKIP LOCKED``, so relays
  share the work), submitted outside any transaction, and marked sent — or, when Orbit
  refuses them for good (400, 403, 404, 409, 413, 422), failed with the error — in one
  more; a transient refusal (429, 5xx, no connection) is tried again with backoff;
* sent rows are deleted after ``retain_s`` (default 7 days), in bounded batches.

The table's DDL is :data:`DDL` (``orbit outbox ddl`` prints it): create it in the service's
database next to its own tables — never in Orbit's. Any DB-API driver works for
:func:`enqueue` (``pymysql``, ``mysqlclient``: ``%s`` parameters); :func:`aenqueue` takes an
``aiomysql``/``asyncmy`` cursor. The relay itself uses ``aiomysql``
(``pip install orbit-sdk[outbox]``).

::

    with conn.cursor() as cur:                   # the service's own transaction
        cur.execute("INSERT INTO orders (id, amount) VALUES (%s, %s)", (order_id, amount))
        enqueue(cur, "shop", "emails", "order_confirmation", {"order": order_id})
    conn.commit()                                # both, or neither
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import secrets
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import parse_qs, unquote, urlsplit

import msgspec

from . import _json
from ._backoff import Backoff
from ._http import seg
from .errors import OrbitConnectionError, OrbitError, Unauthenticated

__all__ = [
    "DDL",
    "TABLE",
    "OutboxRelay",
    "OutboxRow",
    "RelayStats",
    "aenqueue",
    "enqueue",
    "outbox_row",
]

logger = logging.getLogger("orbit_sdk.outbox")

#: The outbox table (in the service's database).
TABLE = "orbit_outbox"

#: Create the outbox table (MySQL 8.4+ / MariaDB 10.11+; idempotent).
DDL: tuple[str, ...] = (
    f"""CREATE TABLE IF NOT EXISTS {TABLE} (
  id BIGINT UNSIGNED NOT NULL AUTO_INCREMENT COMMENT 'relay order',
  outbox_key CHAR(32) NOT NULL COMMENT 'random key of the row: the submit idempotency key is outbox-<key>, a task without dedup_key gets outbox:<key>',
  namespace VARCHAR(63) NOT NULL COMMENT 'Orbit namespace of the task',
  body MEDIUMTEXT NOT NULL COMMENT 'the submit body (JSON), sent byte for byte',
  created_at DATETIME(6) NOT NULL COMMENT 'when the business transaction wrote it (UTC)',
  attempts INT UNSIGNED NOT NULL DEFAULT 0 COMMENT 'relay attempts so far',
  next_attempt_at DATETIME(6) NOT NULL COMMENT 'not relayed before this (UTC; backoff after a transient refusal)',
  claimed_until DATETIME(6) NULL COMMENT 'a relay holds the row until then (UTC)',
  sent_at DATETIME(6) NULL COMMENT 'when Orbit accepted it (UTC)',
  task_id CHAR(32) NULL COMMENT 'the Orbit task',
  failed_at DATETIME(6) NULL COMMENT 'when Orbit refused it for good (UTC): not relayed again',
  last_error VARCHAR(2000) NULL COMMENT 'the last refusal',
  PRIMARY KEY (id),
  UNIQUE KEY uq_{TABLE}_key (outbox_key),
  KEY ix_{TABLE}_pending (sent_at, failed_at, id)
) ENGINE=InnoDB DEFAULT CHARSET=utf8mb4 COLLATE=utf8mb4_bin
  COMMENT='Orbit task submits recorded in business transactions, relayed by orbit outbox relay'""",
)

_INSERT = (
    f"INSERT INTO {TABLE} (outbox_key, namespace, body, created_at, next_attempt_at)"
    " VALUES (%s, %s, %s, UTC_TIMESTAMP(6), UTC_TIMESTAMP(6))"
)
_ENC = msgspec.json.Encoder()
#: Orbit answers that will not change if the row is sent again.
_PERMANENT = frozenset({400, 403, 404, 409, 413, 422})


class OutboxRow(msgspec.Struct, frozen=True):
    """One recorded submit: its key, namespace and exact body."""

    key: str
    namespace: str
    body: bytes

    @property
    def idempotency_key(self) -> str:
        """The ``Idempotency-Key`` the relay submits the row with."""
        return f"outbox-{self.key}"

    def statement(self) -> tuple[str, tuple[Any, ...]]:
        """The INSERT that records the row (``%s`` parameters), for any driver."""
        return _INSERT, (self.key, self.namespace, self.body.decode())


def outbox_row(
    namespace: str,
    queue: str,
    kind: str,
    payload: Any = None,
    **fields: Any,
) -> OutboxRow:
    """The row of one submit. ``payload`` is any msgspec-encodable value (or
    :class:`msgspec.Raw`, kept byte-exact); ``fields`` are the other fields of a submit
    (``dedup_key``, ``priority``, ``delay_ms``, ``max_attempts``, ``retry_safe``,
    ``concurrency_key``, ``retry``…). Without a ``dedup_key`` the task gets
    ``outbox:<key>``, which makes it exactly-once beyond the idempotency window."""
    key = secrets.token_hex(16)
    body: dict[str, Any] = {"queue": queue, "kind": kind, "payload": payload}
    body.update({k: v for k, v in fields.items() if v is not None})
    body.setdefault("dedup_key", f"outbox:{key}")
    return OutboxRow(key, namespace, _ENC.encode(body))


def enqueue(cursor: Any, namespace: str, queue: str, kind: str, payload: Any = None,
            **fields: Any) -> str:  # fmt: skip
    """Record a submit with a DB-API cursor of the caller's open transaction (it commits or
    rolls back with the caller's other writes); return the row key."""
    row = outbox_row(namespace, queue, kind, payload, **fields)
    cursor.execute(*row.statement())
    return row.key


async def aenqueue(cursor: Any, namespace: str, queue: str, kind: str, payload: Any = None,
                   **fields: Any) -> str:  # fmt: skip
    """:func:`enqueue` for an async cursor (``aiomysql``, ``asyncmy``)."""
    row = outbox_row(namespace, queue, kind, payload, **fields)
    await cursor.execute(*row.statement())
    return row.key


# ---------------------------------------------------------------------------- the relay


def _connect_kwargs(dsn: str) -> dict[str, Any]:
    """``mysql://user[:pass]@host[:port]/db[?unix_socket=/path]`` as aiomysql arguments."""
    parts = urlsplit(dsn)
    if parts.scheme not in ("mysql", "mariadb") or not parts.path.strip("/"):
        raise ValueError("dsn must look like mysql://user[:pass]@host[:port]/database")
    kwargs: dict[str, Any] = {
        "user": unquote(parts.username or "root"),
        "password": unquote(parts.password or ""),
        "db": unquote(parts.path.strip("/")),
        "host": parts.hostname or "127.0.0.1",
        "port": parts.port or 3306,
        "charset": "utf8mb4",
        "autocommit": False,
    }
    socket = parse_qs(parts.query).get("unix_socket")
    if socket:
        kwargs["unix_socket"] = socket[0]
    return kwargs


@dataclass
class RelayStats:
    """What the relay did (``run_once`` returns one round's; ``OutboxRelay.stats`` totals)."""

    claimed: int = 0
    sent: int = 0
    failed: int = 0  # refused for good
    retried: int = 0  # a transient refusal: tried again later
    purged: int = 0

    def add(self, other: RelayStats) -> None:
        self.claimed += other.claimed
        self.sent += other.sent
        self.failed += other.failed
        self.retried += other.retried
        self.purged += other.purged


class _Row(msgspec.Struct):
    id: int
    outbox_key: str
    namespace: str
    body: str
    attempts: int


@dataclass
class OutboxRelay:
    """Submits the committed rows of an outbox to Orbit (module docstring).

    ``dsn`` is the service's database (``mysql://…``); ``client`` an
    :class:`~orbit_sdk.OrbitClient` whose key may submit to every namespace the rows name
    (several base URLs: its failover applies). Run :meth:`run` as a task in the service (or
    ``orbit outbox relay``); :meth:`run_once` relays one batch (tests, tools).
    """

    dsn: str
    client: Any
    batch: int = 100
    lease_s: float = 30.0
    poll_s: float = 0.5
    concurrency: int = 8
    retain_s: float = 7 * 86_400.0
    backoff: Backoff = field(default_factory=lambda: Backoff(initial=1.0, maximum=300.0))
    stats: RelayStats = field(default_factory=RelayStats)
    _pool: Any = field(default=None, init=False, repr=False)
    _rounds: int = field(default=0, init=False, repr=False)

    async def _db(self) -> Any:
        if self._pool is None:
            try:
                import aiomysql
            except ImportError as exc:  # pragma: no cover - depends on the install
                raise RuntimeError(
                    "the outbox relay needs aiomysql: pip install orbit-sdk[outbox]"
                ) from exc
            self._pool = await aiomysql.create_pool(
                minsize=1, maxsize=2, init_command="SET SESSION TRANSACTION ISOLATION LEVEL"
                " READ COMMITTED", **_connect_kwargs(self.dsn),
            )  # fmt: skip
        return self._pool

    async def close(self) -> None:
        """Close the database pool (the client is the caller's)."""
        if self._pool is not None:
            self._pool.close()
            await self._pool.wait_closed()
            self._pool = None

    async def create_table(self) -> None:
        """Create the outbox table when it does not exist (:data:`DDL`)."""
        pool = await self._db()
        async with pool.acquire() as conn, conn.cursor() as cur:
            for statement in DDL:
                await cur.execute(statement)
            await conn.commit()

    async def _claim(self) -> list[_Row]:
        pool = await self._db()
        async with pool.acquire() as conn:
            try:
                async with conn.cursor() as cur:
                    await cur.execute(
                        f"SELECT id, outbox_key, namespace, body, attempts FROM {TABLE}"
                        " WHERE sent_at IS NULL AND failed_at IS NULL"
                        " AND next_attempt_at <= UTC_TIMESTAMP(6)"
                        " AND (claimed_until IS NULL OR claimed_until <= UTC_TIMESTAMP(6))"
                        " ORDER BY id LIMIT %s FOR UPDATE SKIP LOCKED",
                        (self.batch,),
                    )
                    rows = [_Row(*r) for r in await cur.fetchall()]
                    if rows:
                        marks = ", ".join(["%s"] * len(rows))
                        await cur.execute(
                            f"UPDATE {TABLE} SET attempts = attempts + 1, claimed_until ="
                            " UTC_TIMESTAMP(6) + INTERVAL %s MICROSECOND"
                            f" WHERE id IN ({marks})",
                            (int(self.lease_s * 1_000_000), *(r.id for r in rows)),
                        )
                await conn.commit()
            except BaseException:
                with contextlib.suppress(Exception):
                    await conn.rollback()
                raise
        return rows

    async def _submit(self, row: _Row) -> tuple[str, str | None, str | None]:
        """(``sent`` | ``failed`` | ``retry``, task id, error) of one row."""
        path = f"/v1/namespaces/{seg(row.namespace)}/tasks"
        try:
            response = await self.client._http.request(
                "POST", path, body=msgspec.Raw(row.body.encode()),
                headers={"Idempotency-Key": f"outbox-{row.outbox_key}"},
            )  # fmt: skip
        except Unauthenticated:
            raise  # the key is wrong: stop, do not fail the rows
        except OrbitConnectionError as exc:
            return "retry", None, str(exc)[:2000]
        except OrbitError as exc:
            status = int(getattr(exc, "status", 0) or 0)
            permanent = status in _PERMANENT and exc.code != "idempotency_in_progress"
            kind = "failed" if permanent else "retry"
            return kind, None, f"{status} {exc.code}: {exc.message}"[:2000]
        task = _json.decode(response.content)  # any number in the echoed payload
        return "sent", str(task.get("id")), None

    async def _mark(
        self,
        done: Sequence[tuple[_Row, str, str | None, str | None]],
        release: Sequence[_Row] = (),
    ) -> None:
        pool = await self._db()
        async with pool.acquire() as conn:
            try:
                async with conn.cursor() as cur:
                    if release:  # not answered: due again at once, the attempt not counted
                        await cur.executemany(
                            f"UPDATE {TABLE} SET claimed_until = NULL, attempts = attempts - 1"
                            " WHERE id = %s AND attempts > 0",
                            [(r.id,) for r in release],
                        )
                    sent = [(task_id, r.id) for r, kind, task_id, _ in done if kind == "sent"]
                    if sent:
                        await cur.executemany(
                            f"UPDATE {TABLE} SET sent_at = UTC_TIMESTAMP(6), task_id = %s,"
                            " claimed_until = NULL, last_error = NULL WHERE id = %s",
                            sent,
                        )
                    failed = [(err, r.id) for r, kind, _, err in done if kind == "failed"]
                    if failed:
                        await cur.executemany(
                            f"UPDATE {TABLE} SET failed_at = UTC_TIMESTAMP(6), last_error = %s,"
                            " claimed_until = NULL WHERE id = %s",
                            failed,
                        )
                    retry = [
                        (int(self.backoff.ceiling(r.attempts) * 1_000_000), err, r.id)
                        for r, kind, _, err in done
                        if kind == "retry"
                    ]
                    if retry:
                        await cur.executemany(
                            f"UPDATE {TABLE} SET next_attempt_at = UTC_TIMESTAMP(6) + INTERVAL"
                            " %s MICROSECOND, last_error = %s, claimed_until = NULL WHERE id = %s",
                            retry,
                        )
                await conn.commit()
            except BaseException:
                with contextlib.suppress(Exception):
                    await conn.rollback()
                raise

    async def _purge(self) -> int:
        pool = await self._db()
        async with pool.acquire() as conn, conn.cursor() as cur:
            n = await cur.execute(
                f"DELETE FROM {TABLE} WHERE sent_at IS NOT NULL"
                " AND sent_at < UTC_TIMESTAMP(6) - INTERVAL %s SECOND LIMIT 1000",
                (int(self.retain_s),),
            )
            await conn.commit()
            return int(n or 0)

    async def run_once(self) -> RelayStats:
        """Claim one batch, submit its rows (``concurrency`` at a time), mark them; every
        hundredth round also deletes sent rows older than ``retain_s``."""
        out = RelayStats()
        rows = await self._claim()
        out.claimed = len(rows)
        if rows:
            gate = asyncio.Semaphore(max(1, self.concurrency))

            async def one(row: _Row) -> tuple[_Row, str, str | None, str | None]:
                async with gate:
                    kind, task_id, err = await self._submit(row)
                    return row, kind, task_id, err

            results = await asyncio.gather(*(one(r) for r in rows), return_exceptions=True)
            done = [d for d in results if not isinstance(d, BaseException)]
            errors = [e for e in results if isinstance(e, BaseException)]
            if errors:  # a wrong key, a bug: mark what was answered, release the rest now
                sent_ids = {d[0].id for d in done}
                await self._mark(done, release=[r for r in rows if r.id not in sent_ids])
                raise errors[0]
            # Marked in ONE transaction after the batch: a relay killed before it leaves
            # claimed rows whose tasks exist; they are sent again after the lease and Orbit
            # answers with the same tasks (idempotency key, dedup key).
            await self._mark(done)
            for _, kind, _, err in done:
                if kind == "sent":
                    out.sent += 1
                elif kind == "failed":
                    out.failed += 1
                    logger.error("outbox row refused for good: %s", err)
                else:
                    out.retried += 1
        self._rounds += 1
        if self._rounds % 100 == 1:
            out.purged = await self._purge()
        self.stats.add(out)
        return out

    async def run(self, stop: asyncio.Event | None = None, *, until_idle: bool = False) -> None:
        """Relay until ``stop`` is set (or, with ``until_idle``, until a round finds nothing
        due). A full batch is followed by the next at once; otherwise it waits ``poll_s``.
        A database or Orbit outage is waited out with backoff."""
        stop = stop or asyncio.Event()
        failures = Backoff(initial=0.2, maximum=30.0)
        while not stop.is_set():
            try:
                done = await self.run_once()
                failures.reset()
            except Unauthenticated:
                raise
            except Exception as exc:
                wait = failures.next_delay()
                logger.warning("outbox relay round failed (%s); again in %.1fs", exc, wait)
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(stop.wait(), wait)
                continue
            if done.claimed >= self.batch:
                continue
            if until_idle and done.claimed == 0:
                return
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(stop.wait(), self.poll_s)

    async def requeue_failed(self) -> int:
        """Send the rows Orbit refused for good again (after the cause was fixed: a queue
        created, a key given the action); the number of rows."""
        pool = await self._db()
        async with pool.acquire() as conn, conn.cursor() as cur:
            n = await cur.execute(
                f"UPDATE {TABLE} SET failed_at = NULL, next_attempt_at = UTC_TIMESTAMP(6)"
                " WHERE sent_at IS NULL AND failed_at IS NOT NULL"
            )
            await conn.commit()
            return int(n or 0)

    async def counts(self) -> Mapping[str, Any]:
        """``{"pending", "claimed", "failed", "sent", "oldest_pending_s"}`` of the outbox."""
        pool = await self._db()
        async with pool.acquire() as conn, conn.cursor() as cur:
            await cur.execute(
                "SELECT SUM(sent_at IS NULL AND failed_at IS NULL),"
                " SUM(sent_at IS NULL AND failed_at IS NULL AND claimed_until > UTC_TIMESTAMP(6)),"
                " SUM(failed_at IS NOT NULL), SUM(sent_at IS NOT NULL),"
                " TIMESTAMPDIFF(MICROSECOND, MIN(IF(sent_at IS NULL AND failed_at IS NULL,"
                f" created_at, NULL)), UTC_TIMESTAMP(6)) FROM {TABLE}"
            )
            row = await cur.fetchone()
            await conn.commit()
        pending, claimed, failed, sent, age = row
        return {
            "pending": int(pending or 0),
            "claimed": int(claimed or 0),
            "failed": int(failed or 0),
            "sent": int(sent or 0),
            "oldest_pending_s": None if age is None else round(int(age) / 1e6, 3),
        }
