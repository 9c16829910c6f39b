"""Shared fixtures: one uniquely named, migrated database per test session, dropped after.

The server is found through ``ORBIT_TEST_DSN`` (default ``mysql://root@127.0.0.1:3306/mysql``);
the database part is replaced by ``orbit_test_<run id>_<random>``.

A test session leaves nothing behind (tests/leftovers.py): its databases carry the run id,
its temporary files (``TMPDIR``, pytest's ``tmp_path``) live in one folder, and when the
session ends — passed, failed or interrupted — the processes it started from there are
stopped, its databases dropped and the folder removed.
"""

from __future__ import annotations

import os
import secrets
import tempfile
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import leftovers
import pymysql
import pytest

from orbit import migrate
from orbit.storage import DSN, Database
from weave.runtime import install_hooks

#: Weave's hook in Pulse, as the composition root registers it before serving: tests drive
#: workflow steps through Pulse's services directly.
install_hooks()

#: Shared Pulse fixtures (``tenant`` factory etc.), see tests/pulse_fixtures.py; the
#: shardability guard (namespace_id predicate on runtime tables), see tests/sql_guard.py.
pytest_plugins = ["pulse_fixtures", "sql_guard"]

SERVER_DSN = DSN.parse(os.environ.get("ORBIT_TEST_DSN", leftovers.DEFAULT_TEST_DSN))

#: This run's id (scripts/test sets it; a plain pytest makes one): part of every database name.
RUN = os.environ.setdefault("ORBIT_TEST_RUN", secrets.token_hex(4))

#: The session that owns the run's folder; a pytest started by a test (its environment
#: inherited) neither makes nor removes one.
_OWNER = "ORBIT_TEST_SESSION_PID"


@pytest.hookimpl(tryfirst=True)
def pytest_configure(config: pytest.Config) -> None:
    """Point every temporary file of the session into the run's folder (before pytest makes
    its own ``tmp_path`` root)."""
    if os.environ.get(_OWNER):
        return
    os.environ[_OWNER] = str(os.getpid())
    folder = os.environ.get("ORBIT_TEST_TMP") or tempfile.mkdtemp(prefix="orbit-test-")
    os.makedirs(folder, exist_ok=True)
    # Like /tmp itself (sticky, writable by all): servers the tests start under another
    # account (mysql) keep their own temporary files in TMPDIR too.
    os.chmod(folder, 0o1777)
    os.environ["ORBIT_TEST_TMP"] = os.environ["TMPDIR"] = tempfile.tempdir = folder
    if config.option.basetemp is None:
        config.option.basetemp = os.path.join(folder, "pytest")


def pytest_unconfigure(config: pytest.Config) -> None:
    """The session is over (also after a failure or Ctrl-C): remove what the run left."""
    if os.environ.get(_OWNER) != str(os.getpid()):
        return
    folder = Path(os.environ["ORBIT_TEST_TMP"])
    tempfile.tempdir = None
    try:
        leftovers.clean(RUN, folder)
    except pymysql.err.MySQLError as exc:  # the server is gone: scripts/test tries again
        print(f"conftest: could not drop the databases of run {RUN}: {exc}")


def _admin_conn() -> pymysql.connections.Connection:
    return pymysql.connect(autocommit=True, **SERVER_DSN.connect_kwargs(with_database=False))


def create_database(prefix: str = "orbit_test") -> DSN:
    """Create an empty database with a unique name; return its DSN."""
    name = leftovers.run_database_name(prefix, RUN, secrets.token_hex(6))
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
