"""Storage errors and the MySQL error-code classifier (docs/mysql-notes.md#errors-and-retries).

StorageError
 ├── CasConflict          a guarded UPDATE changed no row (revision/state moved on)
 ├── DuplicateKey         1062 on a unique index; ``key`` names the index
 ├── OutcomeUnknown       2013 or 1180 during COMMIT: the transaction may or may not have committed
 ├── PoolExhausted        no pooled connection became free within the acquire timeout
 ├── TransientExhausted   1213/1205/1020 retried the allowed number of times
 └── DatabaseError        any other error the server or the driver reported, ``code`` its number
      ├── CheckViolation      4025/3819: a row broke a CHECK constraint
      ├── TriggerRefused      1644: a trigger refused the change (immutable history, purge floor)
      ├── LockConflict        1213/1205/1020 as a statement raised it (the transaction retries it)
      ├── ConnectionLost      2006/2013/2003: the connection died or could not be opened
      ├── ConnectionRefused   1040/1203/1226: the server refused a new connection (its limits)
      └── NodeNotReady        1047: a Galera node outside the primary component

Driver exceptions (PyMySQL's, aiomysql's, asyncmy's) never leave ``orbit/storage``: every call
of :class:`~orbit.storage.db.Tx` and :class:`~orbit.storage.db.Database` raises these classes
(:func:`translate`). A ``DatabaseError`` keeps the driver's ``(code, message)`` as its args, so
:func:`error_code` reads the number the same way.
"""

from __future__ import annotations

import re

DEADLOCK = 1213
LOCK_WAIT_TIMEOUT = 1205
SNAPSHOT_CONFLICT = 1020  # MariaDB "Record has changed since last read"
LOST_CONNECTION = 2013
SERVER_GONE = 2006
CANT_CONNECT = 2003
DUPLICATE = 1062
CHECK_VIOLATED = (4025, 3819)
TRIGGER_SIGNAL = 1644
STATEMENT_TIMEOUT = (1969, 3024)
#: Galera: the node is not in the primary component (lost quorum, joining, or partitioned):
#: "WSREP has not yet prepared node for application use". Not retried here (a partition
#: lasts seconds, not milliseconds): the node answers 503 until it is back.
NODE_NOT_READY = 1047
#: "Got error … during COMMIT"; on Galera also "Error while appending streaming replication
#: fragment (… Not connected to Primary Component)": the node lost the primary component
#: while replicating the commit. Treated as an unknown outcome (re-read before deciding).
COMMIT_FAILED = 1180

RETRYABLE = frozenset({DEADLOCK, LOCK_WAIT_TIMEOUT, SNAPSHOT_CONFLICT})
CONNECTION_ERRORS = frozenset({LOST_CONNECTION, SERVER_GONE, CANT_CONNECT})
#: MySQL/MariaDB refusals of a new connection: 1040 max_connections, 1203 the global
#: max_user_connections, 1226 the account's MAX_USER_CONNECTIONS.
CONNECTION_LIMITS = frozenset({1040, 1203, 1226})

_DUP_KEY_RE = re.compile(r"for key '(?:[^'.]*\.)?([^']+)'")


class StorageError(Exception):
    """Base of storage-level failures."""


class CasConflict(StorageError):
    """A compare-and-swap update found the row changed (or gone)."""

    def __init__(self, entity: str, detail: str = "") -> None:
        super().__init__(f"{entity}: concurrent change{': ' + detail if detail else ''}")
        self.entity = entity
        self.detail = detail


class DuplicateKey(StorageError):
    """Error 1062 on the unique index ``key``."""

    def __init__(self, key: str, message: str) -> None:
        super().__init__(message)
        self.key = key


class OutcomeUnknown(StorageError):
    """The connection was lost during COMMIT: callers must re-read before deciding."""


class PoolExhausted(StorageError):
    """Every pooled connection stayed busy for ``timeout`` seconds: shed the request (503)
    instead of queueing it without bound. Nothing was run."""

    def __init__(self, timeout: float, maxsize: int) -> None:
        super().__init__(f"no database connection free within {timeout:g}s (pool of {maxsize})")
        self.timeout = timeout
        self.maxsize = maxsize


class TransientExhausted(StorageError):
    """A deadlock/lock-wait conflict persisted through every allowed retry."""

    def __init__(self, code: int, attempts: int) -> None:
        super().__init__(f"transaction conflict {code} persisted after {attempts} attempts")
        self.code = code
        self.attempts = attempts


class DatabaseError(StorageError):
    """An error the database server or the driver reported; ``code`` is its MySQL error
    number (None when the driver gave none). ``args`` is the driver's ``(code, message)``."""

    def __init__(self, code: int | None, message: str) -> None:
        super().__init__(code, message)
        self.code = code
        self.message = message


class CheckViolation(DatabaseError):
    """4025 (MariaDB) / 3819 (MySQL): the row breaks a CHECK constraint: bad input that
    passed the service's validation."""

    @property
    def constraint(self) -> str:
        """The server's message (it names the constraint), at most 200 characters."""
        return self.message[:200]


class TriggerRefused(DatabaseError):
    """1644: a trigger refused the change (SIGNAL), e.g. an update of an immutable row."""


class LockConflict(DatabaseError):
    """1213 deadlock, 1205 lock wait timeout, 1020 snapshot conflict, as one statement raised
    it: :meth:`~orbit.storage.db.Database.transaction` rolls back and retries the whole
    transaction (``TransientExhausted`` once the retries are spent)."""


class ConnectionLost(DatabaseError):
    """2006/2013: the connection died; 2003: it could not be opened."""


class ConnectionRefused(DatabaseError):
    """The server refused a new connection (1040 max_connections, 1203/1226 the user's
    connection limits): shed the request like an exhausted pool."""


class NodeNotReady(DatabaseError):
    """1047: a Galera node outside the primary component (partitioned away, lost quorum or
    joining): it refuses every query until it rejoins."""


def _class_of(code: int | None) -> type[DatabaseError]:
    if code in CHECK_VIOLATED:
        return CheckViolation
    if code == TRIGGER_SIGNAL:
        return TriggerRefused
    if code in RETRYABLE:
        return LockConflict
    if code in CONNECTION_ERRORS:
        return ConnectionLost
    if code in CONNECTION_LIMITS:
        return ConnectionRefused
    if code == NODE_NOT_READY:
        return NodeNotReady
    return DatabaseError


def from_driver(exc: BaseException) -> StorageError:
    """The project's error for a driver exception whose args are ``(errno, message)``:
    :class:`DuplicateKey` for 1062, else the :class:`DatabaseError` class of its number."""
    code = error_code(exc)
    args: tuple[object, ...] = getattr(exc, "args", ())
    message = str(args[1]) if len(args) > 1 else str(exc)
    if code == DUPLICATE:
        return DuplicateKey(duplicate_key_name(exc) or "", str(exc))
    return _class_of(code)(code, message)


def retry_kind(code: int, *, at_commit: bool = False) -> str:
    """The kind a retried transaction is counted under (``db.stats.retry_kinds``,
    ``orbit_db_transaction_retries_by_kind_total``).

    ``certification``: 1213 raised by COMMIT itself. A single server reports deadlocks when a
    lock is requested, never at COMMIT; a Galera node reports a write set that failed
    certification against another node's concurrent commit there, as the same 1213.
    ``deadlock``: 1213 from a statement (a local deadlock, or on Galera a transaction aborted
    by another node's replicated commit). ``lock_wait_timeout`` 1205, ``snapshot`` 1020,
    ``connection`` a connection lost before COMMIT.
    """
    if code == DEADLOCK:
        return "certification" if at_commit else "deadlock"
    if code == LOCK_WAIT_TIMEOUT:
        return "lock_wait_timeout"
    if code == SNAPSHOT_CONFLICT:
        return "snapshot"
    if code in CONNECTION_ERRORS:
        return "connection"
    return "other"


def error_code(exc: BaseException) -> int | None:
    """The MySQL error number of a driver exception, or None."""
    args = getattr(exc, "args", ())
    if args and isinstance(args[0], int):
        return args[0]
    return None


def duplicate_key_name(exc: BaseException) -> str | None:
    """The index name of a 1062 error ("Duplicate entry ... for key 'uq_x'")."""
    if error_code(exc) != DUPLICATE:
        return None
    msg = str(exc.args[1]) if len(exc.args) > 1 else str(exc)
    m = _DUP_KEY_RE.search(msg)
    return m.group(1) if m else ""
