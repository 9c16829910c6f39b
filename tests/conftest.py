"""Shared fixtures: one uniquely named, migrated database per test session, dropped after.

The server is found through ``ORBIT_TEST_DSN`` (default ``mysql://root@127.0.0.1:3306/mysql``);
the database part is replaced by ``orbit_test_<random>``.
"""

from __future__ import annotations

import os
import secrets
from collections.abc import AsyncIterator, Iterator

import pymysql
import pytest

from orbit import migrate
from orbit.storage import DSN, Database

#: Shared Pulse fixtures (``tenant`` factory etc.), see tests/pulse_fixtures.py; the
#: shardability guard (namespace_id predicate on runtime tables), see tests/sql_guard.py.
pytest_plugins = ["pulse_fixtures", "sql_guard"]

SERVER_DSN = DSN.parse(os.environ.get("ORBIT_TEST_DSN", "mysql://root@127.0.0.1:3306/mysql"))


def _admin_conn() -> pymysql.connections.Connection:
    return pymysql.connect(autocommit=True, **SERVER_DSN.connect_kwargs(with_database=False))


def create_database(prefix: str = "orbit_test") -> DSN:
    """Create an empty database with a unique name; return its DSN."""
    name = f"{prefix}_{secrets.token_hex(6)}"
    conn = _admin_conn()
    try:
        with conn.cursor() as cur:
            cur.execute(f"CREATE DATABASE `{name}` CHARACTER SET utf8mb4 COLLATE utf8mb4_bin")
    finally:
        conn.close()
    return SERVER_DSN.with_database(name)


def drop_database(dsn: DSN) -> None:
    conn = _admin_conn()
    try:
        with conn.cursor() as cur:
            cur.execute(f"DROP DATABASE IF EXISTS `{dsn.database}`")
    finally:
        conn.close()


@pytest.fixture(scope="session")
def server_dsn() -> DSN:
    return SERVER_DSN


@pytest.fixture
def empty_db() -> Iterator[DSN]:
    """A fresh empty database for one test (migration tests), dropped after."""
    dsn = create_database("orbit_test_empty")
    try:
        yield dsn
    finally:
        drop_database(dsn)


@pytest.fixture(scope="session")
def dsn() -> Iterator[DSN]:
    """The session's migrated database. Tests create their own tenants inside it."""
    d = create_database()
    try:
        migrate.up(d)
        yield d
    finally:
        drop_database(d)


@pytest.fixture(scope="session")
async def db(dsn: DSN) -> AsyncIterator[Database]:
    """An open pool on the session's migrated database."""
    database = await Database.connect(dsn, maxsize=10)
    try:
        yield database
    finally:
        await database.close()
