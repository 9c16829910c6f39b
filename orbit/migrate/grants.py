"""Least-privilege GRANTs for Orbit's runtime database account.

The runtime account (the one ``orbit-server`` connects with) needs only DML:
``SELECT, INSERT, UPDATE, DELETE`` on each Orbit table (``orbit_``, ``pulse_``, ``weave_``
prefixes, read from ``information_schema.TABLES`` of the migrated database), and ``SELECT``
alone on the bookkeeping tables (readiness reads them; only ``orbit-migrate`` writes them).
Grants are per table, not ``db.*``: re-run ``grants --apply`` after a migration adds tables.
Immutable history tables are protected by their triggers whatever the account may do.
"""

from __future__ import annotations

import msgspec

from orbit.migrate import store
from orbit.migrate.errors import MigrateError, UsageError
from orbit.storage.dsn import DSN

ORBIT_TABLE_PREFIXES = ("orbit_", "pulse_", "weave_")
RUNTIME_PRIVILEGES = "SELECT, INSERT, UPDATE, DELETE"
BOOKKEEPING_PRIVILEGES = "SELECT"


class GrantPlan(msgspec.Struct, frozen=True, kw_only=True):
    """The GRANT statements for one account, and the tables they cover."""

    user: str
    host: str
    database: str
    tables: list[str]  # Orbit tables granted DML
    bookkeeping: list[str]  # bookkeeping tables granted SELECT only
    statements: list[str]  # GRANT statements, without trailing ';'


def runtime_grants(dsn: DSN | str, user: str, host: str = "%") -> GrantPlan:
    """The GRANTs for a runtime account on ``dsn.database`` (read from information_schema).

    Raises :class:`MigrateError` when the database does not exist or holds no Orbit table
    (run ``up`` first).
    """
    d = dsn if isinstance(dsn, DSN) else DSN.parse(dsn)
    if not user:
        raise UsageError("the account needs a user name")
    conn = store.connect_database(d)
    if conn is None:
        raise MigrateError(f"database {d.database!r} does not exist; run `orbit-migrate up`")
    try:
        tables = store.tables_list(conn, d.database)
    finally:
        conn.close()
    orbit = [t for t in tables if t.startswith(ORBIT_TABLE_PREFIXES)]
    read_only = (*store.BOOKKEEPING_TABLES, store.CLUSTER_LOCK_TABLE)
    booked = [t for t in orbit if t in read_only]
    dml = [t for t in orbit if t not in read_only]
    if not dml:
        raise MigrateError(f"no Orbit tables in {d.database!r}; run `orbit-migrate up` first")
    account = store.quote_account(user, host)
    db = store.quote_ident(d.database)
    statements = [
        f"GRANT {RUNTIME_PRIVILEGES} ON {db}.{store.quote_ident(t)} TO {account}" for t in dml
    ]
    statements += [
        f"GRANT {BOOKKEEPING_PRIVILEGES} ON {db}.{store.quote_ident(t)} TO {account}"
        for t in booked
    ]
    return GrantPlan(
        user=user,
        host=host,
        database=d.database,
        tables=dml,
        bookkeeping=booked,
        statements=statements,
    )


def apply_runtime_grants(
    dsn: DSN | str, user: str, host: str = "%", password: str | None = None
) -> tuple[GrantPlan, bool]:
    """Create the account if missing (``CREATE USER IF NOT EXISTS … IDENTIFIED BY``), then
    run every GRANT of :func:`runtime_grants`. Returns the plan and whether the account was
    created. An existing account keeps its password. Needs an account allowed to create
    users and grant (``CREATE USER`` and ``GRANT OPTION`` on the tables, e.g. the migration
    account or root). Raises :class:`UsageError` when the account must be created and no
    password was given.
    """
    d = dsn if isinstance(dsn, DSN) else DSN.parse(dsn)
    plan = runtime_grants(d, user, host)
    conn = store.connect(d, with_database=True)
    try:
        created = False
        if not store.user_exists(conn, user, host):
            if password is None:
                raise UsageError(
                    f"account {store.quote_account(user, host)} does not exist: "
                    "pass --password (or ORBIT_RUNTIME_PASSWORD) to create it"
                )
            store.user_create(conn, user, host, password)
            created = True
        for stmt in plan.statements:
            store.run_statement(conn, stmt)
    finally:
        conn.close()
    return plan, created
