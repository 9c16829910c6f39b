"""The connection pool and the one transaction helper.

The pool comes from the driver named by ``ORBIT_DB_DRIVER`` (``aiomysql`` by default,
``asyncmy`` optional: :mod:`orbit.storage.drivers`); nothing else here depends on the driver.

Every connection runs with ``time_zone = '+00:00'`` and READ COMMITTED (docs/mysql-notes.md:
REPEATABLE READ's gap locks block producers and deadlock idle pollers). The pool refuses to
serve a connection whose session settings are not what the code assumes.

:meth:`Database.transaction` runs a function in one transaction and retries the *whole*
function, a bounded number of times with jitter, on 1213 (deadlock; on Galera also a
certification failure raised by COMMIT), 1020 (MariaDB snapshot conflict) and 1205 (lock
wait timeout; the statement alone was rolled back, so we ROLLBACK first and never COMMIT
after it), and on a connection lost before COMMIT was sent. A connection lost *during*
COMMIT, or a COMMIT that failed with 1180 (a Galera node that lost the primary component
while replicating it), raises :class:`OutcomeUnknown`: the caller re-reads.
"""

from __future__ import annotations

import asyncio
import logging
import random
import re
import time
from collections import Counter
from collections.abc import Awaitable, Callable, Coroutine, Generator, Iterable, Sequence
from dataclasses import dataclass, field, replace
from datetime import datetime
from typing import Any, TypeVar

import pymysql
from pymysql.cursors import RE_INSERT_VALUES

from orbit.storage.drivers import PoolOptions, as_pymysql, load_driver
from orbit.storage.dsn import DSN
from orbit.storage.errors import (
    COMMIT_FAILED,
    CONNECTION_ERRORS,
    RETRYABLE,
    CasConflict,
    DuplicateKey,
    OutcomeUnknown,
    PoolExhausted,
    TransientExhausted,
    error_code,
    from_driver,
    retry_kind,
)
from orbit.storage.fairness import DEFAULT_SHARE, FairGate, GateTimeout, current_tenant

T = TypeVar("T")
Row = dict[str, Any]

SESSION_INIT = (
    "SET SESSION time_zone = '+00:00'",
    "SET SESSION TRANSACTION ISOLATION LEVEL READ COMMITTED",
)
EXPECTED_ISOLATION = "READ-COMMITTED"

_LEADING_COMMENTS = re.compile(r"\A(?:\s*--[^\n]*\n)+")

#: When a list, every statement run through a :class:`Tx` is appended to it (tests use it to
#: check that runtime queries carry a ``namespace_id`` predicate).
log = logging.getLogger("orbit.storage")

STATEMENT_LOG: list[str] | None = None


@dataclass
class TxStats:
    """Counters for /metrics: commits, retries by MySQL error code, unknown outcomes."""

    commits: int = 0
    rollbacks: int = 0
    retries: Counter[int] = field(default_factory=Counter)
    #: The same retries by kind (:func:`orbit.storage.errors.retry_kind`): ``deadlock``,
    #: ``certification`` (1213 at COMMIT: a Galera write set that lost certification),
    #: ``lock_wait_timeout``, ``snapshot``, ``connection``.
    retry_kinds: Counter[str] = field(default_factory=Counter)
    exhausted: int = 0
    outcome_unknown: int = 0


class SessionSettingsError(RuntimeError):
    """A pooled connection does not run with UTC and READ COMMITTED."""


class _CommitLost(Exception):
    def __init__(self, cause: BaseException) -> None:
        super().__init__(str(cause))
        self.cause = cause


class _CommitConflict(Exception):
    """COMMIT itself failed with a retryable code (on Galera: certification). Keeps the
    driver error's args, so :func:`error_code` reads the same code."""

    def __init__(self, cause: BaseException) -> None:
        super().__init__(*cause.args)
        self.cause = cause


#: One statement's outcome in a pipeline round: (count, rows or None, insert id), or the
#: DuplicateKey it raised (the last entry of a round: the statements after it did not run).
_Ran = tuple[int, list[Row] | None, int]
_Out = _Ran | DuplicateKey


class _Queued:
    """What a :meth:`Tx.pipeline` step awaits: its rendered statements' results.

    Raises the ``DuplicateKey`` one of them raised (the step may catch it, as around
    :meth:`Tx.execute`); statements that did not run because an earlier step's statement of
    the round failed are sent again with the next round.
    """

    __slots__ = ("sqls",)

    def __init__(self, sqls: list[str]) -> None:
        self.sqls = sqls

    def __await__(self) -> Generator[Any, Any, list[_Ran]]:
        got: list[_Ran] = []
        sqls = self.sqls
        while sqls:
            outs: list[_Out] = yield _Raw(sqls)
            for out in outs:
                if isinstance(out, DuplicateKey):
                    raise out
                got.append(out)
            sqls = sqls[len(outs) :]  # not run: an earlier statement of the round failed
        return got


class _Raw:
    """A round's statements as a nested pipeline forwards them: the outcomes as they came
    (possibly fewer than asked, the last one a ``DuplicateKey``), never raised here."""

    __slots__ = ("sqls",)

    def __init__(self, sqls: list[str]) -> None:
        self.sqls = sqls

    def __await__(self) -> Generator[Any, Any, list[_Out]]:
        outs: list[_Out] = yield self
        return outs


class Tx:
    """One open transaction on one connection. Only store modules call its methods."""

    __slots__ = ("_after", "_conn", "_cur", "_piping", "_rows", "lastrowid", "round_trips")

    def __init__(self, conn: Any, cur: Any) -> None:
        self._conn = conn
        self._cur = cur
        #: Called once this transaction has committed (:meth:`after_commit`).
        self._after: list[Callable[[], None]] | None = None
        self.lastrowid: int | None = None
        self._piping = False  # inside pipeline(): statements are queued, not sent
        self._rows: list[Row] | None = None  # a piped execute's rows, for fetchall
        #: Round trips to the server so far (statements, multi-statements; not COMMIT).
        self.round_trips = 0

    def after_commit(self, fn: Callable[[], None]) -> None:
        """Call ``fn`` (synchronous, quick: a wake-up of this process's waiters) once this
        transaction has committed; never when it rolls back, is retried or its outcome is
        unknown (a retried transaction runs its function again, with a new Tx). A raising
        ``fn`` is logged, not raised: the transaction stands."""
        if self._after is None:
            self._after = []
        self._after.append(fn)

    async def execute(self, sql: str, args: Any = None) -> int:
        """Run one statement; return the affected (matched) row count.

        A duplicate key becomes :class:`DuplicateKey` naming the index.
        """
        if self._piping:
            ((n, self._rows, self.lastrowid),) = await _Queued([self._render(sql, args)])
            return n
        self.round_trips += 1
        if STATEMENT_LOG is not None:
            STATEMENT_LOG.append(sql)
        try:
            n = await self._cur.execute(sql, args)
        except Exception as exc:
            err = _driver_error(exc)
            if err is exc:
                raise
            raise err from exc
        self.lastrowid = self._cur.lastrowid
        return int(n or 0)

    async def executemany(self, sql: str, args: Iterable[Any]) -> int:
        """Run one statement for many parameter sets (the driver batches INSERT ... VALUES)."""
        if STATEMENT_LOG is not None:
            STATEMENT_LOG.append(sql)
        # The drivers only send ONE multi-row INSERT when the text starts with INSERT: a leading
        # "-- comment" line would silently make it one round trip per row.
        sql = _LEADING_COMMENTS.sub("", sql)
        if self._piping:
            rendered = self._render_many(sql, list(args))
            return sum(n for n, _, _ in await _Queued(rendered))
        self.round_trips += 1
        try:
            n = await self._cur.executemany(sql, list(args))
        except Exception as exc:
            err = _driver_error(exc)
            if err is exc:
                raise
            raise err from exc
        return int(n or 0)

    async def execute_batch(self, statements: Sequence[tuple[str, Any]]) -> list[int]:
        """Run several statements in ONE round trip (a multi-statement query; the pool's
        connections allow them) and return each one's affected (matched) row count, in order.

        For guarded per-row UPDATEs of a batch: every statement keeps its own predicate and
        its own count, exactly as if run one by one with :meth:`execute`, minus the round
        trips. Parameters are bound client-side per statement (the same escaping as
        ``execute``). A failing statement raises (``DuplicateKey`` for 1062) and the
        statements after it do not run; the caller's transaction is then rolled back as for
        any error. Only DML without result sets belongs here.
        """
        if not statements:
            return []
        if self._piping:
            return [n for n, _, _ in await _Queued([self._render(q, a) for q, a in statements])]
        if len(statements) == 1:
            return [await self.execute(*statements[0])]
        self.round_trips += 1
        cur = self._cur
        parts: list[str] = []
        for sql, args in statements:
            if STATEMENT_LOG is not None:
                STATEMENT_LOG.append(sql)
            parts.append(cur.mogrify(sql, args).strip().rstrip(";"))
        counts: list[int] = []
        try:
            # "\n;\n": a statement ending in a "-- comment" line cannot swallow the ";".
            n = await cur.execute("\n;\n".join(parts))
            counts.append(int(n or 0))
            while len(counts) < len(parts):
                if not await cur.nextset():
                    break
                counts.append(max(int(cur.rowcount or 0), 0))
        except Exception as exc:
            err = _driver_error(exc)
            if err is exc:
                raise
            raise err from exc
        if len(counts) != len(parts):  # pragma: no cover - the server answers every statement
            raise RuntimeError(f"multi-statement returned {len(counts)} of {len(parts)} results")
        return counts

    async def fetchone(self, sql: str, args: Any = None) -> Row | None:
        if self._piping:
            rows = await self.fetchall(sql, args)
            return rows[0] if rows else None
        await self.execute(sql, args)
        row = await self._cur.fetchone()
        return row  # type: ignore[no-any-return]

    async def fetchall(self, sql: str, args: Any = None) -> list[Row]:
        if self._piping:  # through execute (as below), which keeps the statement's rows
            await self.execute(sql, args)
            return self._rows or []
        await self.execute(sql, args)
        rows = await self._cur.fetchall()
        return list(rows)

    async def fetchval(self, sql: str, args: Any = None) -> Any:
        row = await self.fetchone(sql, args)
        if row is None:
            return None
        return next(iter(row.values()))

    async def cas(self, sql: str, args: Any, entity: str, detail: str = "") -> None:
        """Run a guarded UPDATE (``WHERE ... AND revision = ...``); raise CasConflict on 0 rows."""
        if await self.execute(sql, args) == 0:
            raise CasConflict(entity, detail)

    async def pipeline(self, *steps: Coroutine[Any, Any, Any]) -> list[Any]:
        """Run several store calls with their statements sent together: ONE round trip (a
        multi-statement query) per round instead of one per statement; each call's result,
        in order.

        Each step is a coroutine that uses this ``Tx`` (typically a store function:
        ``store.task_lock_many(tx, ...)``). The steps are driven in order: each runs until
        it awaits a statement, the statements of that round are sent as one multi-statement
        query, in step order, and every step gets its own results back (rows, counts) and
        runs on; a step that awaits again joins the next round. So the server runs the
        statements in exactly the order sequential calls would have — lock order included —
        minus the round trips. A step may await nothing but this transaction (anything else
        raises ``RuntimeError``). A pipeline inside a step (nested) sends its rounds through
        the outer one, so they share its round trips. A failing statement raises from
        ``pipeline`` (as from :meth:`execute`: ``DuplicateKey`` for 1062): the statements
        after it did not run, the steps are closed, and the caller's transaction is rolled
        back as for any error — so use it only for statements whose failure fails the
        transaction.
        """
        nested = self._piping
        results: list[Any] = [None] * len(steps)
        todo: list[tuple[int, Coroutine[Any, Any, Any], Any]] = [
            (i, step, None) for i, step in enumerate(steps)
        ]
        try:
            while todo:
                queued: list[tuple[int, Coroutine[Any, Any, Any], _Raw]] = []
                self._piping = True
                try:
                    for i, step, value in todo:
                        try:
                            wait = step.send(value)
                        except StopIteration as done:
                            results[i] = done.value
                            continue
                        if not isinstance(wait, _Raw):
                            raise RuntimeError(
                                "a Tx.pipeline() step awaited something other than its Tx"
                            )
                        queued.append((i, step, wait))
                finally:
                    self._piping = nested
                if not queued:
                    break
                sqls = [sql for _, _, w in queued for sql in w.sqls]
                # Nested: this round's statements go out with the enclosing pipeline's round.
                outs = await (_Raw(sqls) if nested else self._send_many(sqls))
                # Each step gets its share of the outcomes: all of them, or (after a failed
                # statement) the part that ran — the failing step gets the error, the steps
                # after it nothing, so they send their statements again next round.
                todo, k = [], 0
                for i, step, wait in queued:
                    n = len(wait.sqls)
                    todo.append((i, step, outs[k : k + n]))
                    k += n
        finally:
            for step in steps:
                step.close()  # a no-op on finished steps; stops the others
        return results

    def _render(self, sql: str, args: Any) -> str:
        if STATEMENT_LOG is not None:
            STATEMENT_LOG.append(sql)
        text: str = self._cur.mogrify(sql, args) if args is not None else sql
        return text.strip().rstrip(";")

    def _render_many(self, sql: str, args: list[Any]) -> list[str]:
        """An ``executemany`` as statements: one multi-row INSERT (as the drivers send it)."""
        if STATEMENT_LOG is not None:
            STATEMENT_LOG.append(sql)
        if not args:
            return []
        m = RE_INSERT_VALUES.match(sql)
        if m is None:
            return [self._cur.mogrify(sql, a).strip().rstrip(";") for a in args]
        prefix, values, postfix = m.group(1) % (), m.group(2).rstrip(), m.group(3) or ""
        rows = ",".join(self._cur.mogrify(values, a) for a in args)
        return [f"{prefix}{rows}{postfix}".strip().rstrip(";")]

    async def _send_many(self, sqls: list[str]) -> list[_Out]:
        """Run rendered statements in ONE round trip; per statement (count, rows or None).

        A ``DuplicateKey`` ends the list (the statements after it did not run; the
        transaction stays usable, as after a failed :meth:`execute`); any other error raises.
        """
        if not sqls:
            return []
        self.round_trips += 1
        cur = self._cur
        outs: list[_Out] = []
        try:
            # "\n;\n": a statement ending in a "-- comment" line cannot swallow the ";".
            await cur.execute("\n;\n".join(sqls))
            while True:
                rows = list(await cur.fetchall()) if cur.description else None
                outs.append((max(int(cur.rowcount or 0), 0), rows, int(cur.lastrowid or 0)))
                if len(outs) == len(sqls) or not await cur.nextset():
                    break
        except Exception as exc:
            err = _driver_error(exc)
            if isinstance(err, DuplicateKey):
                outs.append(err)
                return outs
            if err is exc:
                raise
            raise err from exc
        if len(outs) != len(sqls):  # pragma: no cover - the server answers every statement
            raise RuntimeError(f"multi-statement returned {len(outs)} of {len(sqls)} results")
        return outs


class Database:
    """A pool of session-checked connections plus the transaction helper."""

    def __init__(
        self,
        dsn: DSN,
        *,
        minsize: int = 1,
        maxsize: int = 10,
        max_retries: int = 5,
        connect_timeout: float = 5.0,
        acquire_timeout: float | None = None,
        driver: str | None = None,
        tenant_share: float = DEFAULT_SHARE,
    ) -> None:
        self.dsn = dsn
        #: The driver of the pool: ``driver``, else ``$ORBIT_DB_DRIVER``, else aiomysql.
        self.driver = load_driver(driver)
        self.minsize = minsize
        self.maxsize = maxsize
        self.max_retries = max_retries
        self.connect_timeout = connect_timeout
        #: Longest wait for a free pooled connection before :class:`PoolExhausted` (None:
        #: wait forever). ``orbit-server`` sets it (``--pool-timeout``, default 5 s) so a
        #: saturated pool sheds requests with a fast 503 instead of queueing them unbounded.
        self.acquire_timeout = acquire_timeout
        #: Fair shares of the pool between tenants (orbit/storage/fairness.py): one tenant
        #: holds at most ``tenant_share`` of it, and a freed connection goes to the waiting
        #: tenant holding the fewest.
        self.gate = FairGate(maxsize, share=tenant_share)
        self.stats = TxStats()
        self._pool: Any = None
        #: Connections in autocommit for :meth:`read` (each statement its own transaction:
        #: no ROLLBACK to end it, no transaction left open on an idle connection): a
        #: quarter of ``maxsize``, the rest for transactions, so the node still opens at
        #: most ``maxsize`` connections. A read finding it busy runs in the other pool as a
        #: transaction ended by ROLLBACK. The fair gate bounds both together.
        self._read_pool: Any = None
        self.read_pool_size = maxsize // 4 if maxsize >= 2 else 0

    @classmethod
    async def connect(cls, dsn: DSN, **kw: Any) -> Database:
        db = cls(dsn, **kw)
        await db.open()
        return db

    async def open(self) -> None:
        if self._pool is not None:
            return
        options = PoolOptions(
            minsize=min(self.minsize, self.maxsize - self.read_pool_size),
            maxsize=self.maxsize - self.read_pool_size,
            connect_timeout=self.connect_timeout,
            connect_kwargs=self.dsn.connect_kwargs(),
        )
        try:
            self._pool = await self.driver.create_pool(options)
            conn = await self._pool.acquire()
            try:
                await self._prepare(conn)
            finally:
                self._pool.release(conn)
            if self.read_pool_size:
                self._read_pool = await self.driver.create_pool(
                    replace(
                        options,
                        minsize=min(1, self.minsize),
                        maxsize=self.read_pool_size,
                        autocommit=True,
                    )
                )
        except Exception as exc:
            err = _driver_error(exc)
            if err is exc:
                raise
            raise err from exc

    async def _prepare(self, conn: Any) -> None:
        """Set and verify the session settings once per physical connection."""
        if getattr(conn, "_orbit_ready", False):
            return
        async with conn.cursor() as cur:
            for stmt in SESSION_INIT:
                await cur.execute(stmt)
        await check_session(conn)
        conn._orbit_ready = True

    async def close(self) -> None:
        for pool in (self._read_pool, self._pool):
            if pool is not None:
                pool.close()
                await pool.wait_closed()
        self._pool = self._read_pool = None

    @property
    def pool(self) -> Any:
        if self._pool is None:
            raise RuntimeError("Database is not open")
        return self._pool

    @property
    def pools(self) -> list[Any]:
        """Both pools (transactions', reads'), for tests that take every connection."""
        return [p for p in (self.pool, self._read_pool) if p is not None]

    def pool_usage(self) -> tuple[int, int, int]:
        """(size, free, maxsize) of both pools together, for /metrics."""
        pools = [p for p in (self._pool, self._read_pool) if p is not None]
        if not pools:
            return (0, 0, self.maxsize)
        return (
            sum(p.size for p in pools),
            sum(p.freesize for p in pools),
            sum(p.maxsize for p in pools),
        )

    async def transaction(
        self,
        fn: Callable[[Tx], Awaitable[T]],
        *,
        retries: int | None = None,
        readonly: bool = False,
    ) -> T:
        """Run ``fn(tx)`` in one transaction, retrying the whole of it on transient conflicts.

        Raises :class:`TransientExhausted` after the bounded retries, :class:`OutcomeUnknown`
        when the connection died during COMMIT, and anything ``fn`` raises (after rollback).
        """
        limit = self.max_retries if retries is None else retries
        attempt = 0
        while True:
            attempt += 1
            try:
                return await self._run_once(fn, readonly)
            except _CommitLost as lost:
                self.stats.outcome_unknown += 1
                cause = _driver_error(lost.cause)
                raise OutcomeUnknown(f"COMMIT's outcome unknown: {cause}") from cause
            except Exception as exc:
                code = error_code(exc)
                if code not in RETRYABLE and code not in CONNECTION_ERRORS:
                    # A driver error from outside a Tx call (acquire, session setup,
                    # COMMIT): raised as the project's error class whatever the driver.
                    err = _driver_error(exc)
                    if err is exc:
                        raise
                    raise err from exc
                assert code is not None
                self.stats.retries[code] += 1
                at_commit = isinstance(exc, _CommitConflict)
                self.stats.retry_kinds[retry_kind(code, at_commit=at_commit)] += 1
                if attempt > limit:
                    self.stats.exhausted += 1
                    cause = exc.cause if isinstance(exc, _CommitConflict) else exc
                    raise TransientExhausted(code, attempt) from _driver_error(cause)
                await asyncio.sleep(random.uniform(0.0, 0.005 * (2**attempt)))

    async def _acquire(self, tenant: Any, readonly: bool) -> tuple[Any, Any]:
        """A pooled connection (and its pool) taken through the fair gate for ``tenant``, or
        :class:`PoolExhausted` after ``acquire_timeout`` (the gate's wait included). A read
        takes the read pool unless all of it is in use."""
        started = time.monotonic()
        try:
            await self.gate.acquire(tenant, self.acquire_timeout)
        except GateTimeout:
            assert self.acquire_timeout is not None
            raise PoolExhausted(self.acquire_timeout, self.maxsize) from None
        try:
            left = None
            if self.acquire_timeout is not None:
                left = max(0.0, self.acquire_timeout - (time.monotonic() - started))
            pool = self.pool
            rp = self._read_pool
            if readonly and rp is not None and (rp.freesize or rp.size < rp.maxsize):
                pool = rp
            return await self._pool_acquire(left, pool), pool
        except BaseException:
            self.gate.release(tenant)
            raise

    async def _pool_acquire(self, wait_s: float | None, pool: Any) -> Any:
        if wait_s is None:
            return await pool.acquire()
        pending = asyncio.ensure_future(pool.acquire())
        try:
            return await asyncio.wait_for(asyncio.shield(pending), wait_s)
        except BaseException as exc:  # the timeout, or the caller was cancelled

            def give_back(f: asyncio.Future[Any]) -> None:
                # The acquire may still have won the race with the cancel: never leak it.
                if not f.cancelled() and f.exception() is None:
                    pool.release(f.result())

            pending.add_done_callback(give_back)
            pending.cancel()
            if isinstance(exc, TimeoutError):
                raise PoolExhausted(self.acquire_timeout or 0.0, self.maxsize) from None
            raise

    async def _run_once(self, fn: Callable[[Tx], Awaitable[T]], readonly: bool) -> T:
        tenant = current_tenant.get()
        conn, pool = await self._acquire(tenant, readonly)
        holding = self.gate.hold()
        clean = False
        try:
            await self._prepare(conn)
            try:
                async with conn.cursor() as cur:
                    tx = Tx(conn, cur)
                    result = await fn(tx)
            except BaseException as exc:
                # 1205 rolled back only the statement: ROLLBACK the whole transaction before
                # anything else (never COMMIT after it). On a dead connection, or when the
                # rollback itself fails or is cancelled, the connection is closed below and
                # the server rolls back by itself.
                if readonly and pool is self._read_pool:
                    # Autocommit: no transaction to roll back; a cancelled statement may
                    # still be on the wire, so that connection is closed below.
                    clean = not isinstance(exc, asyncio.CancelledError) and (
                        error_code(exc) not in CONNECTION_ERRORS
                    )
                elif error_code(exc) not in CONNECTION_ERRORS:
                    try:
                        await asyncio.shield(conn.rollback())
                        clean = not isinstance(exc, asyncio.CancelledError)
                    except BaseException:
                        clean = False
                    self.stats.rollbacks += 1
                raise
            if readonly:
                if pool is not self._read_pool:
                    await conn.rollback()
            else:
                try:
                    await conn.commit()
                except Exception as exc:
                    if error_code(exc) in CONNECTION_ERRORS or error_code(exc) == COMMIT_FAILED:
                        raise _CommitLost(exc) from exc
                    if error_code(exc) in RETRYABLE:
                        raise _CommitConflict(exc) from exc
                    raise
                self.stats.commits += 1
                if tx._after is not None:
                    _run_after_commit(tx._after)
            clean = True
            return result
        finally:
            if not clean:
                conn.close()
            pool.release(conn)
            self.gate.unhold(holding)
            self.gate.release(tenant)

    async def read(self, fn: Callable[[Tx], Awaitable[T]]) -> T:
        """Run read-only ``fn`` on an autocommit connection: each statement is its own READ
        COMMITTED transaction, as each statement of a READ COMMITTED transaction reads its
        own snapshot anyway, minus the ROLLBACK that ended it. A locking read holds its
        locks to the end of its statement only: a check that must hold until a write
        belongs in :meth:`transaction`."""
        return await self.transaction(fn, readonly=True)

    async def fetchall(self, sql: str, args: Any = None) -> list[Row]:
        async def q(tx: Tx) -> list[Row]:
            return await tx.fetchall(sql, args)

        return await self.read(q)

    async def fetchone(self, sql: str, args: Any = None) -> Row | None:
        async def q(tx: Tx) -> Row | None:
            return await tx.fetchone(sql, args)

        return await self.read(q)

    async def now(self) -> datetime:
        """The database clock (UTC), the only clock leases and expiry are judged by."""
        row = await self.fetchone("SELECT UTC_TIMESTAMP(6) AS now")
        assert row is not None
        return row["now"]  # type: ignore[no-any-return]

    async def ping(self, within: float = 2.0) -> bool:
        try:
            await asyncio.wait_for(self.fetchone("SELECT 1 AS ok"), within)
            return True
        except Exception:
            return False


def _run_after_commit(calls: list[Callable[[], None]]) -> None:
    for call in calls:
        try:
            call()
        except Exception:
            log.exception("an after-commit call failed")


async def check_session(conn: Any) -> None:
    """Refuse a connection that does not run with UTC and READ COMMITTED."""
    async with conn.cursor() as cur:
        await cur.execute("SELECT @@session.time_zone AS tz")
        tz = (await cur.fetchone())["tz"]
        try:
            await cur.execute("SELECT @@session.transaction_isolation AS iso")
        except Exception as exc:  # MySQL < 5.7.20 / MariaDB < 10.2: only tx_isolation
            if not isinstance(as_pymysql(exc), pymysql.err.OperationalError):
                raise
            await cur.execute("SELECT @@session.tx_isolation AS iso")
        iso = (await cur.fetchone())["iso"]
    await conn.rollback()
    if tz not in ("+00:00", "UTC") or iso != EXPECTED_ISOLATION:
        raise SessionSettingsError(
            f"connection runs with time_zone={tz!r}, isolation={iso!r}; "
            f"Orbit requires '+00:00' and {EXPECTED_ISOLATION}"
        )


def _driver_error(exc: BaseException) -> BaseException:
    """What a :class:`Tx` or :class:`Database` call raises for ``exc``: a driver exception
    (whatever the driver) as the project's :class:`~orbit.storage.errors.StorageError` of its
    number (:func:`~orbit.storage.errors.from_driver`), anything else unchanged."""
    err = as_pymysql(exc)
    if isinstance(err, pymysql.err.MySQLError):
        return from_driver(err)
    return err


def monotonic_ms() -> float:
    return time.monotonic() * 1000.0


def placeholders(values: Sequence[Any]) -> str:
    """``%s, %s, ...`` for an IN list of ``values`` (never empty: callers check)."""
    if not values:
        raise ValueError("empty IN list")
    return ", ".join(["%s"] * len(values))
