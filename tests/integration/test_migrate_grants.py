"""orbit-migrate grants: the printed GRANTs parse and cover every Orbit table; an account
created with --apply can use the tables (DML) but cannot change the schema or the
bookkeeping."""

from __future__ import annotations

import re
import secrets
import sys
from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path
from typing import Any

import pymysql
import pytest

from orbit import migrate
from orbit.migrate import UsageError, split_statements
from orbit.storage.dsn import DSN

ROOT = Path(__file__).resolve().parents[2]
try:
    from orbit_cmd import migrate as cli
except ModuleNotFoundError:  # not installed: use the source tree
    sys.path.insert(0, str(ROOT / "cmd"))
    from orbit_cmd import migrate as cli

NO_PRIVILEGE = {1142, 1044}  # command denied on table / access denied to database
GRANT_RE = re.compile(
    r"^GRANT (SELECT, INSERT, UPDATE, DELETE|SELECT) ON `(?P<db>[^`]+)`\.`(?P<table>[^`]+)` "
    r"TO '(?P<user>[^']+)'@'(?P<host>[^']+)'$"
)


def query(dsn: DSN, sql: str, args: Any = None) -> list[tuple[Any, ...]]:
    conn = pymysql.connect(autocommit=True, **dsn.connect_kwargs())
    try:
        with conn.cursor() as cur:
            cur.execute(sql, args)
            return list(cur.fetchall())
    finally:
        conn.close()


def run_cli(capsys: pytest.CaptureFixture[str], dsn: DSN, *args: str) -> tuple[int, str, str]:
    code = cli.main(["--dsn", dsn.url(hide_password=False), *args])
    out, err = capsys.readouterr()
    return code, out, err


def error_code(fn: Any) -> int | None:
    try:
        fn()
    except pymysql.MySQLError as exc:
        return int(exc.args[0])
    return None


@pytest.fixture
def account(server_dsn: DSN) -> Iterator[str]:
    """A unique user name; the account (any host) is dropped afterwards."""
    user = f"orbit_rt_{secrets.token_hex(4)}"
    try:
        yield user
    finally:
        query(server_dsn.with_database("mysql"), f"DROP USER IF EXISTS '{user}'@'%'")


def test_printed_grants_parse_and_cover_every_orbit_table(
    dsn: DSN, capsys: pytest.CaptureFixture[str]
) -> None:
    code, out, _ = run_cli(capsys, dsn, "grants", "--user", "orbit_app", "--host", "10.0.%")
    assert code == 0
    statements = split_statements(out)  # comments dropped; one GRANT per statement
    parsed = [GRANT_RE.match(s) for s in statements]
    assert all(parsed), [s for s, m in zip(statements, parsed, strict=True) if not m]
    privileges = {m["table"]: m.group(1) for m in parsed if m}
    assert {(m["db"], m["user"], m["host"]) for m in parsed if m} == {
        (dsn.database, "orbit_app", "10.0.%")
    }

    rows = query(
        dsn,
        "SELECT TABLE_NAME FROM information_schema.TABLES WHERE TABLE_SCHEMA = %s"
        " AND TABLE_TYPE = 'BASE TABLE'",
        (dsn.database,),
    )
    orbit_tables = {r[0] for r in rows if r[0].startswith(("orbit_", "pulse_", "weave_"))}
    assert set(privileges) == orbit_tables
    for table, privs in privileges.items():
        expected = (
            "SELECT" if table in migrate.BOOKKEEPING_TABLES else "SELECT, INSERT, UPDATE, DELETE"
        )
        assert privs == expected, table
    assert len(statements) == len(orbit_tables)


def test_an_applied_runtime_account_has_dml_only(
    empty_db: DSN, tmp_path: Path, account: str, capsys: pytest.CaptureFixture[str]
) -> None:
    (tmp_path / "0001_demo.sql").write_text(
        "CREATE TABLE orbit_demo (id INT PRIMARY KEY, v INT NOT NULL);\n"
        "CREATE TABLE pulse_demo (id INT PRIMARY KEY);\n"
        "CREATE TABLE other_app_table (id INT PRIMARY KEY);\n"
    )
    migrate.up(empty_db, tmp_path)
    password = secrets.token_urlsafe(12)

    code, _, err = run_cli(capsys, empty_db, "grants", "--user", account, "--apply")
    assert code == 2 and "--password" in err  # a new account needs a password
    code, out, _ = run_cli(
        capsys, empty_db, "grants", "--user", account, "--apply", f"--password={password}"
    )
    assert code == 0 and "account created" in out
    code, out, _ = run_cli(capsys, empty_db, "grants", "--user", account, "--apply")
    assert code == 0 and "password unchanged" in out  # idempotent

    rt = replace(empty_db, user=account, password=password)
    conn = pymysql.connect(autocommit=True, **rt.connect_kwargs())
    try:
        cur = conn.cursor()
        cur.execute("INSERT INTO orbit_demo (id, v) VALUES (1, 1)")
        cur.execute("UPDATE orbit_demo SET v = 2 WHERE id = 1")
        cur.execute("SELECT v FROM orbit_demo")
        assert cur.fetchall() == ((2,),)
        cur.execute("DELETE FROM orbit_demo WHERE id = 1")
        cur.execute("INSERT INTO pulse_demo (id) VALUES (1)")
        cur.execute("SELECT name FROM orbit_schema_migrations")
        assert cur.fetchall() == (("0001_demo.sql",),)
        assert error_code(lambda: cur.execute("CREATE TABLE orbit_new (id INT)")) in NO_PRIVILEGE
        assert error_code(lambda: cur.execute("DROP TABLE orbit_demo")) in NO_PRIVILEGE
        assert (
            error_code(lambda: cur.execute("ALTER TABLE orbit_demo ADD COLUMN w INT"))
            in NO_PRIVILEGE
        )
        assert error_code(lambda: cur.execute("SELECT * FROM other_app_table")) in NO_PRIVILEGE
        assert (
            error_code(lambda: cur.execute("DELETE FROM orbit_schema_migrations")) in NO_PRIVILEGE
        )
        assert (
            error_code(lambda: cur.execute("INSERT INTO orbit_schema_state (id) VALUES (1)"))
            in NO_PRIVILEGE
        )
    finally:
        conn.close()

    # The readiness check works under the runtime account; migrating does not.
    st = migrate.status(rt, tmp_path)
    assert st.current and st.foreign_keys == 0
    (tmp_path / "0002_more.sql").write_text("CREATE TABLE orbit_more (id INT PRIMARY KEY);")
    code, _, err = run_cli(capsys, rt, "--migrations-dir", str(tmp_path), "up")
    assert code == 1 and "(1142)" in err
    assert migrate.status(empty_db, tmp_path).pending == ["0002_more.sql"]


def test_the_runtime_account_can_read_status_of_the_real_schema(dsn: DSN, account: str) -> None:
    password = secrets.token_urlsafe(12)
    plan, created = migrate.apply_runtime_grants(dsn, account, "%", password)
    assert created and len(plan.statements) == len(plan.tables) + len(plan.bookkeeping)
    assert sorted(plan.bookkeeping) == sorted(migrate.BOOKKEEPING_TABLES)
    st = migrate.status(replace(dsn, user=account, password=password))
    assert st.current, st.problems()


def test_grants_need_a_migrated_database(empty_db: DSN) -> None:
    with pytest.raises(migrate.MigrateError, match="no Orbit tables"):
        migrate.runtime_grants(empty_db, "someone")
    with pytest.raises(UsageError):
        migrate.runtime_grants(empty_db, "")
