"""Storage layer: DSN parsing, the pool (aiomysql or asyncmy), transactions with bounded retry, CAS, SQL files.

Everything that talks to the database goes through :class:`Database` and :class:`Tx`.
"""

from orbit.storage.db import Database, Tx, TxStats
from orbit.storage.dsn import DEFAULT_DSN, DSN
from orbit.storage.errors import (
    CasConflict,
    DuplicateKey,
    OutcomeUnknown,
    PoolExhausted,
    StorageError,
    TransientExhausted,
)
from orbit.storage.sqlfile import Queries, load_queries

__all__ = [
    "DEFAULT_DSN",
    "DSN",
    "CasConflict",
    "Database",
    "DuplicateKey",
    "OutcomeUnknown",
    "PoolExhausted",
    "Queries",
    "StorageError",
    "TransientExhausted",
    "Tx",
    "TxStats",
    "load_queries",
]
