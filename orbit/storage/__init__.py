"""Storage layer: DSN parsing, the pool (aiomysql or asyncmy), transactions with bounded retry, CAS, SQL files.

Everything that talks to the database goes through :class:`Database` and :class:`Tx`.
"""

from orbit.storage.db import Database, Tx, TxStats
from orbit.storage.dsn import DEFAULT_DSN, DSN
from orbit.storage.errors import (
    CasConflict,
    CheckViolation,
    ConnectionLost,
    ConnectionRefused,
    DatabaseError,
    DuplicateKey,
    LockConflict,
    NodeNotReady,
    OutcomeUnknown,
    PoolExhausted,
    StorageError,
    TransientExhausted,
    TriggerRefused,
)
from orbit.storage.sqlfile import Queries, load_queries

__all__ = [
    "DEFAULT_DSN",
    "DSN",
    "CasConflict",
    "CheckViolation",
    "ConnectionLost",
    "ConnectionRefused",
    "Database",
    "DatabaseError",
    "DuplicateKey",
    "LockConflict",
    "NodeNotReady",
    "OutcomeUnknown",
    "PoolExhausted",
    "Queries",
    "StorageError",
    "TransientExhausted",
    "TriggerRefused",
    "Tx",
    "TxStats",
    "load_queries",
]
