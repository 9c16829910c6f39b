"""The only code of ``orbit.migrate`` that talks to the database (synchronous PyMySQL).

Named queries live in ``sql/migrate.sql``. The few statements that need identifiers
(``CREATE DATABASE``, ``GRANT … ON db.table TO user@host``) are built here with
:func:`quote_ident` / :func:`quote_account`; identifiers cannot be bound parameters.

Connections run in autocommit mode (DDL commits implicitly in MySQL anyway) with
``time_zone = '+00:00'``, and never enable multi-statements: a migration file is sent one
statement at a time.
"""

from __future__ import annotations

import hashlib
import math
import os
import socket
from collections.abc import Iterator, Mapping
from contextlib import contextmanager, suppress
from typing import Any

import pymysql
from pymysql.connections import Connection
from pymysql.cursors import DictCursor

from orbit.migrate.types import ForeignKey
from orbit.storage.dsn import DSN
from orbit.storage.errors import error_code
from orbit.storage.sqlfile import load_queries

Q = load_queries(__file__, "migrate")

BOOKKEEPING_TABLES = ("orbit_schema_migrations", "orbit_schema_state")
#: The cluster-wide migration lock, created only on a Galera node (:mod:`orbit.migrate.lease`).
CLUSTER_LOCK_TABLE = "orbit_schema_lock"
NO_SUCH_TABLE = 1146
UNKNOWN_VARIABLE = 1193
NO_SUCH_DATABASE = 1049
LOCK_PREFIX = "orbit-migrate:"
MAX_LOCK_NAME = 64  # MySQL's limit for GET_LOCK names
EXCERPT_CHARS = 1000
CONNECT_TIMEOUT = 10


def runner_id() -> str:
    """``host:pid`` of this process, recorded with every bookkeeping row it writes."""
    return f"{socket.gethostname()}:{os.getpid()}"[:255]


def lock_name(database: str) -> str:
    """The GET_LOCK name guarding migrations of ``database`` (hashed when too long)."""
    name = LOCK_PREFIX + database
    if len(name) > MAX_LOCK_NAME:
        digest = hashlib.sha256(database.encode("utf-8")).hexdigest()
        name = LOCK_PREFIX + digest[: MAX_LOCK_NAME - len(LOCK_PREFIX)]
    return name


def quote_ident(name: str) -> str:
    """A backtick-quoted identifier (backticks doubled)."""
    return "`" + name.replace("`", "``") + "`"


def quote_string(value: str) -> str:
    """A single-quoted SQL string literal (for account names, which cannot be bound)."""
    return "'" + pymysql.converters.escape_string(value) + "'"


def quote_account(user: str, host: str) -> str:
    """``'user'@'host'``."""
    return f"{quote_string(user)}@{quote_string(host)}"


def connect(dsn: DSN, *, with_database: bool) -> Connection:
    """An autocommit UTC connection, on ``dsn.database`` or on no database."""
    return pymysql.connect(
        autocommit=True,
        charset="utf8mb4",
        connect_timeout=CONNECT_TIMEOUT,
        init_command="SET time_zone = '+00:00'",
        **dsn.connect_kwargs(with_database=with_database),
    )


def connect_database(dsn: DSN) -> Connection | None:
    """A connection on ``dsn.database``, or None when that database does not exist."""
    try:
        return connect(dsn, with_database=True)
    except pymysql.err.OperationalError as exc:
        if error_code(exc) == NO_SUCH_DATABASE:
            return None
        raise


def _one(
    conn: Connection, sql: str, args: Mapping[str, Any] | None = None
) -> dict[str, Any] | None:
    with conn.cursor(DictCursor) as cur:
        cur.execute(sql, args)
        row: dict[str, Any] | None = cur.fetchone()
        return row


def _all(conn: Connection, sql: str, args: Mapping[str, Any] | None = None) -> list[dict[str, Any]]:
    with conn.cursor(DictCursor) as cur:
        cur.execute(sql, args)
        return list(cur.fetchall())


def _exec(conn: Connection, sql: str, args: Mapping[str, Any] | None = None) -> int:
    with conn.cursor() as cur:
        return int(cur.execute(sql, args))


# -- database ------------------------------------------------------------------------------


def database_exists(conn: Connection, database: str) -> bool:
    row = _one(conn, Q.schema_exists, {"database": database})
    return bool(row and row["n"])


def database_create(conn: Connection, database: str) -> None:
    """CREATE DATABASE IF NOT EXISTS with Orbit's charset (utf8mb4, binary collation)."""
    _exec(
        conn,
        f"CREATE DATABASE IF NOT EXISTS {quote_ident(database)} "
        "CHARACTER SET utf8mb4 COLLATE utf8mb4_bin",
    )


def database_use(conn: Connection, database: str) -> None:
    conn.select_db(database)


def bookkeeping_create(conn: Connection) -> None:
    """Create the two bookkeeping tables when missing (needs CREATE; ``up`` only)."""
    _exec(conn, Q.migrations_table_create)
    _exec(conn, Q.state_table_create)


def run_statement(conn: Connection, sql: str) -> None:
    """Run one migration statement as written (no parameter interpolation)."""
    with conn.cursor() as cur:
        cur.execute(sql)
        while cur.nextset():  # drain any extra result sets
            pass


# -- named lock ----------------------------------------------------------------------------


def lock_try(conn: Connection, name: str, timeout: float) -> bool:
    """One ``GET_LOCK(name, timeout)``: True when taken (timeout rounded up to whole seconds;
    0 does not wait). The lock belongs to ``conn``'s session: closing it releases the lock."""
    row = _one(conn, Q.lock_get, {"name": name, "timeout": max(0, math.ceil(timeout))})
    return bool(row and row["got"] == 1)


def lock_release(conn: Connection, name: str) -> None:
    """Release the named lock; errors are ignored (a dead session released it already)."""
    with suppress(pymysql.MySQLError):
        _one(conn, Q.lock_release, {"name": name})


def lock_is_held(conn: Connection, name: str) -> bool:
    """True when some session (this one included) holds the named lock."""
    row = _one(conn, Q.lock_holder, {"name": name})
    return bool(row and row["holder"] is not None)


def is_galera(conn: Connection) -> bool:
    """True when the server is a Galera cluster node (``wsrep_on``): its ``GET_LOCK`` and row
    locks are local to the node, so migrations also need the cluster-wide lease."""
    try:
        row = _one(conn, Q.wsrep_on)
    except pymysql.err.OperationalError as exc:  # MySQL: no such variable
        if error_code(exc) == UNKNOWN_VARIABLE:
            return False
        raise
    return bool(row and int(row["wsrep_on"] or 0))


# -- the cluster-wide lease (Galera) -------------------------------------------------------


def cluster_lock_table_create(conn: Connection) -> None:
    _exec(conn, Q.cluster_lock_table_create)


def cluster_lock_claim(conn: Connection, holder: str, token: bytes, ttl_s: int) -> str | None:
    """One claim of the lease, in its own transaction: None when taken (free, expired or
    already ours), else the holder that has it. Two nodes claiming at once both write the
    row; certification aborts one COMMIT with 1213, which the caller retries."""
    args = {"holder": holder[:255], "token": token, "ttl_s": ttl_s}
    with _transaction(conn):
        row = _one(conn, Q.cluster_lock_get_for_update)
        if row is None:
            _exec(conn, Q.cluster_lock_insert, args)
            return None
        if not row["expired"] and bytes(row["token"]) != token:
            return str(row["holder"])
        _exec(conn, Q.cluster_lock_take_if_token, {**args, "old_token": bytes(row["token"])})
    return None


def cluster_lock_renew(conn: Connection, token: bytes, ttl_s: int) -> bool:
    """Extend our unexpired lease; False when it expired or is no longer ours."""
    return _exec(conn, Q.cluster_lock_renew, {"token": token, "ttl_s": ttl_s}) == 1


def cluster_lock_release(conn: Connection, token: bytes) -> None:
    with suppress(pymysql.MySQLError):
        _exec(conn, Q.cluster_lock_release, {"token": token})


def cluster_lock_live(conn: Connection) -> bool:
    """True when some run holds an unexpired lease (no table: nobody)."""
    try:
        return _one(conn, Q.cluster_lock_live) is not None
    except pymysql.err.ProgrammingError as exc:
        if error_code(exc) == NO_SUCH_TABLE:
            return False
        raise


# -- bookkeeping reads ---------------------------------------------------------------------


def migrations_list(conn: Connection) -> list[dict[str, Any]] | None:
    """Rows of orbit_schema_migrations (name, checksum, applied_at, method); None if the
    table does not exist."""
    try:
        return _all(conn, Q.migrations_list)
    except pymysql.err.ProgrammingError as exc:
        if error_code(exc) == NO_SUCH_TABLE:
            return None
        raise


def state_get(conn: Connection) -> dict[str, Any] | None:
    """The orbit_schema_state row, or None (no row or no table: clean)."""
    try:
        return _one(conn, Q.state_get)
    except pymysql.err.ProgrammingError as exc:
        if error_code(exc) == NO_SUCH_TABLE:
            return None
        raise


def foreign_keys_list(conn: Connection, database: str) -> list[ForeignKey]:
    rows = _all(conn, Q.foreign_keys_list, {"database": database})
    return [ForeignKey(r["name"], r["table_name"], r["referenced_table"]) for r in rows]


def tables_list(conn: Connection, database: str) -> list[str]:
    return [r["name"] for r in _all(conn, Q.tables_list, {"database": database})]


# -- bookkeeping writes (caller holds the named lock) --------------------------------------


def state_begin(
    conn: Connection, file: str, statement: int, count: int, prefix: bytes, excerpt: str
) -> None:
    """Write the ``running`` row for ``file`` starting at ``statement``."""
    _exec(
        conn,
        Q.state_begin,
        {
            "file": file,
            "statement_index": statement,
            "statement_count": count,
            "prefix_checksum": prefix,
            "statement_excerpt": excerpt[:EXCERPT_CHARS],
            "runner": runner_id(),
        },
    )


def state_progress_if_running(
    conn: Connection, file: str, statement: int, prefix: bytes, excerpt: str
) -> bool:
    """Record that ``statement`` of ``file`` is about to run. False: the row is not ours."""
    return (
        _exec(
            conn,
            Q.state_progress_if_running,
            {
                "file": file,
                "statement_index": statement,
                "prefix_checksum": prefix,
                "statement_excerpt": excerpt[:EXCERPT_CHARS],
            },
        )
        == 1
    )


def state_fail_if_running(conn: Connection, file: str, code: int | None, message: str) -> bool:
    """Turn the ``running`` row into a ``failed`` dirty mark. False: the row is not ours."""
    return (
        _exec(
            conn,
            Q.state_fail_if_running,
            {"file": file, "error_code": code, "error_message": message},
        )
        == 1
    )


def state_resume(conn: Connection, file: str) -> bool:
    """Turn the mark on ``file`` into a resume point. False: no mark on that file."""
    return _exec(conn, Q.state_resume, {"file": file, "runner": runner_id()}) == 1


def state_clear(conn: Connection) -> None:
    _exec(conn, Q.state_clear)


@contextmanager
def _transaction(conn: Connection) -> Iterator[None]:
    conn.begin()
    try:
        yield
    except BaseException:
        with suppress(pymysql.MySQLError):
            conn.rollback()
        raise
    conn.commit()


def migration_record(
    conn: Connection,
    name: str,
    checksum: bytes,
    count: int,
    duration_ms: int,
    method: str,
) -> None:
    """Record ``name`` as applied and clear the state row, in one transaction."""
    with _transaction(conn):
        _exec(
            conn,
            Q.migration_insert,
            {
                "name": name,
                "checksum": checksum,
                "statement_count": count,
                "duration_ms": duration_ms,
                "method": method,
                "runner": runner_id(),
            },
        )
        _exec(conn, Q.state_clear)


def migration_set_checksum(conn: Connection, name: str, checksum: bytes, count: int) -> bool:
    """Replace an applied file's checksum (``repair --accept-checksum``)."""
    args = {"name": name, "checksum": checksum, "statement_count": count, "runner": runner_id()}
    return _exec(conn, Q.migration_set_checksum, args) == 1


# -- accounts ------------------------------------------------------------------------------


def user_exists(conn: Connection, user: str, host: str) -> bool:
    row = _one(conn, Q.user_exists, {"user": user, "host": host})
    return bool(row and row["n"])


def user_create(conn: Connection, user: str, host: str, password: str) -> None:
    """CREATE USER IF NOT EXISTS (an existing account keeps its password).

    Built without bound parameters: the host is often ``%``, which pyformat would read.
    """
    run_statement(
        conn,
        f"CREATE USER IF NOT EXISTS {quote_account(user, host)} "
        f"IDENTIFIED BY {quote_string(password)}",
    )
