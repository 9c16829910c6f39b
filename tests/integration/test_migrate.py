"""orbit-migrate up/status against the real server: real migrations, no-op re-run, database
creation, two concurrent processes, an interrupted run, the lock, and the CLI's JSON."""

from __future__ import annotations

import hashlib
import json
import os
import secrets
import signal
import subprocess
import sys
import sysconfig
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pymysql
import pytest

from orbit import migrate
from orbit.migrate import (
    DirtyState,
    LockTimeout,
    MigrationsDirError,
    default_migrations_dir,
    load_migrations,
)
from orbit.migrate.files import migrations_dir_candidates
from orbit.storage.dsn import DSN

ROOT = Path(__file__).resolve().parents[2]
try:
    from orbit_cmd import migrate as cli
except ModuleNotFoundError:  # not installed: use the source tree
    sys.path.insert(0, str(ROOT / "cmd"))
    from orbit_cmd import migrate as cli


def conn_to(dsn: DSN, *, with_database: bool = True) -> pymysql.connections.Connection:
    return pymysql.connect(autocommit=True, **dsn.connect_kwargs(with_database=with_database))


def query(dsn: DSN, sql: str, args: Any = None) -> list[tuple[Any, ...]]:
    conn = conn_to(dsn)
    try:
        with conn.cursor() as cur:
            cur.execute(sql, args)
            return list(cur.fetchall())
    finally:
        conn.close()


def write(folder: Path, name: str, sql: str) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / name
    path.write_text(sql, encoding="utf-8")
    return path


def run_cli(capsys: pytest.CaptureFixture[str], *args: str) -> tuple[int, str, str]:
    code = cli.main(list(args))
    out, err = capsys.readouterr()
    return code, out, err


def cli_env() -> dict[str, str]:
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(
        [str(ROOT), str(ROOT / "cmd"), *filter(None, [env.get("PYTHONPATH")])]
    )
    return env


def spawn_up(dsn: DSN, folder: Path) -> subprocess.Popen[str]:
    """``orbit-migrate up`` in its own process (the console script's module)."""
    return subprocess.Popen(
        [
            sys.executable,
            "-m",
            "orbit_cmd.migrate",
            "--dsn",
            dsn.url(hide_password=False),
            "--migrations-dir",
            str(folder),
            "up",
        ],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=cli_env(),
    )


def wait_until(check: Callable[[], bool], timeout: float = 30.0) -> None:
    deadline = time.monotonic() + timeout
    while not check():
        if time.monotonic() > deadline:
            raise AssertionError("condition not reached in time")
        time.sleep(0.05)


def sessions_waiting_on(dsn: DSN, lock: str) -> int:
    rows = query(
        dsn,
        "SELECT COUNT(*) FROM information_schema.PROCESSLIST WHERE INFO LIKE %s",
        (f"SELECT GET_LOCK('{lock}'%",),
    )
    return int(rows[0][0])


class Barrier:
    """A named lock held by the test: a migration running ``SELECT GET_LOCK(name, 60)``
    blocks until :meth:`release`."""

    def __init__(self, server_dsn: DSN) -> None:
        self.name = f"orbit-test-barrier-{secrets.token_hex(6)}"
        self._conn = conn_to(server_dsn, with_database=False)
        with self._conn.cursor() as cur:
            cur.execute("SELECT GET_LOCK(%s, 0)", (self.name,))
            assert cur.fetchone() == (1,)

    def release(self) -> None:
        if self._conn.open:
            self._conn.close()  # ends the session: the lock is released


@pytest.fixture
def barrier(server_dsn: DSN) -> Iterator[Barrier]:
    b = Barrier(server_dsn)
    try:
        yield b
    finally:
        b.release()


# -- the real migrations folder ------------------------------------------------------------


def test_up_applies_the_real_migrations_and_status_is_current(empty_db: DSN) -> None:
    files = load_migrations(default_migrations_dir())
    before = migrate.status(empty_db)
    assert before.pending == [f.name for f in files]
    assert before.current is (not files)

    result = migrate.up(empty_db)
    assert result.applied == [f.name for f in files]
    assert result.created_database is False

    st = migrate.status(empty_db)
    assert st.current, st.problems()
    assert st.applied == [f.name for f in files]
    assert st.pending == [] and st.dirty is None and st.foreign_keys == 0
    assert st.checksum_mismatches == [] and st.out_of_order == []
    rows = dict(query(empty_db, "SELECT name, checksum FROM orbit_schema_migrations"))
    assert rows == {f.name: hashlib.sha256(f.path.read_bytes()).digest() for f in files}
    fks = query(
        empty_db,
        "SELECT COUNT(*) FROM information_schema.REFERENTIAL_CONSTRAINTS"
        " WHERE CONSTRAINT_SCHEMA = %s",
        (empty_db.database,),
    )
    assert fks == [(0,)]


def test_running_up_again_is_a_no_op(empty_db: DSN) -> None:
    migrate.up(empty_db)
    stamps = query(empty_db, "SELECT name, applied_at FROM orbit_schema_migrations ORDER BY name")
    tables = query(
        empty_db,
        "SELECT COUNT(*) FROM information_schema.TABLES WHERE TABLE_SCHEMA = %s",
        (empty_db.database,),
    )

    again = migrate.up(empty_db)

    assert again.applied == []
    assert again.status.current
    assert (
        query(empty_db, "SELECT name, applied_at FROM orbit_schema_migrations ORDER BY name")
        == stamps
    )
    assert (
        query(
            empty_db,
            "SELECT COUNT(*) FROM information_schema.TABLES WHERE TABLE_SCHEMA = %s",
            (empty_db.database,),
        )
        == tables
    )


def test_status_of_the_session_database_is_current(dsn: DSN) -> None:
    """The conftest fixture's database (built by migrate.up) is what readiness would see."""
    st = migrate.status(dsn)
    assert st.current and st.foreign_keys == 0 and st.dirty is None


def test_default_migrations_dir_source_tree_env_and_installed_copy(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    monkeypatch.delenv("ORBIT_MIGRATIONS_DIR", raising=False)
    assert default_migrations_dir() == ROOT / "migrations"
    installed = Path(sysconfig.get_path("data")) / "share" / "orbit-server" / "migrations"
    assert installed in migrations_dir_candidates()  # where pyproject's data-files put them
    monkeypatch.setenv("ORBIT_MIGRATIONS_DIR", str(tmp_path))
    assert default_migrations_dir() == tmp_path
    monkeypatch.setenv("ORBIT_MIGRATIONS_DIR", str(tmp_path / "missing"))
    with pytest.raises(MigrationsDirError, match="ORBIT_MIGRATIONS_DIR"):
        default_migrations_dir()


# -- database creation, JSON, environment --------------------------------------------------


def test_up_creates_a_missing_database_with_binary_utf8mb4(server_dsn: DSN, tmp_path: Path) -> None:
    target = server_dsn.with_database(f"orbit_test_new_{secrets.token_hex(6)}")
    write(tmp_path, "0001_t.sql", "CREATE TABLE orbit_t (id INT PRIMARY KEY)")
    assert not migrate.status(target, tmp_path).database_exists
    try:
        result = migrate.up(target, tmp_path)
        assert result.created_database and result.applied == ["0001_t.sql"]
        rows = query(
            server_dsn,
            "SELECT DEFAULT_CHARACTER_SET_NAME, DEFAULT_COLLATION_NAME FROM information_schema.SCHEMATA"
            " WHERE SCHEMA_NAME = %s",
            (target.database,),
        )
        assert rows == [("utf8mb4", "utf8mb4_bin")]
        assert migrate.status(target, tmp_path).current
    finally:
        query(server_dsn, f"DROP DATABASE IF EXISTS `{target.database}`")


def test_status_json_has_exactly_the_api_shape(
    empty_db: DSN, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    write(tmp_path, "0001_a.sql", "CREATE TABLE orbit_a (id INT PRIMARY KEY);")
    write(tmp_path, "0002_b.sql", "CREATE TABLE orbit_b (id INT PRIMARY KEY);")
    url = empty_db.url(hide_password=False)

    code, out, err = run_cli(
        capsys, "--dsn", url, "--migrations-dir", str(tmp_path), "status", "--json"
    )
    assert code == 1
    assert json.loads(out) == {
        "current": False,
        "applied": [],
        "pending": ["0001_a.sql", "0002_b.sql"],
        "dirty": None,
        "foreign_keys": 0,
    }
    assert "2 pending" in err

    code, out, _ = run_cli(capsys, "up", "--dsn", url, "--migrations-dir", str(tmp_path))
    assert code == 0 and "applied 0002_b.sql" in out

    code, out, err = run_cli(
        capsys, "status", "--json", "--dsn", url, "--migrations-dir", str(tmp_path)
    )
    assert code == 0 and err == ""
    assert out.count("\n") == 1
    assert json.loads(out) == {
        "current": True,
        "applied": ["0001_a.sql", "0002_b.sql"],
        "pending": [],
        "dirty": None,
        "foreign_keys": 0,
    }

    code, out, _ = run_cli(capsys, "status", "--dsn", url, "--migrations-dir", str(tmp_path))
    assert code == 0 and "current" in out and "NOT current" not in out


def test_cli_reads_orbit_dsn_and_reports_unreachable_servers(
    empty_db: DSN,
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    write(tmp_path, "0001_a.sql", "CREATE TABLE orbit_a (id INT PRIMARY KEY);")
    monkeypatch.setenv("ORBIT_DSN", empty_db.url(hide_password=False))
    monkeypatch.setenv("ORBIT_MIGRATIONS_DIR", str(tmp_path))
    assert run_cli(capsys, "up", "--quiet")[:2] == (0, "")
    assert query(empty_db, "SELECT name FROM orbit_schema_migrations") == [("0001_a.sql",)]

    code, _, err = run_cli(capsys, "status", "--dsn", "mysql://root@127.0.0.1:1/nowhere")
    assert code == 3 and "nowhere" in err
    code, _, err = run_cli(capsys, "status", "--dsn", "postgres://x@y/z")
    assert code == 2 and "scheme" in err


# -- the named lock: concurrent runs, waiting, timeouts ------------------------------------


def test_two_concurrent_up_processes_apply_each_file_once(
    empty_db: DSN, server_dsn: DSN, tmp_path: Path, barrier: Barrier
) -> None:
    write(tmp_path, "0001_counter.sql", "CREATE TABLE orbit_counter (n INT NOT NULL);")
    write(
        tmp_path,
        "0002_slow.sql",
        f"SELECT GET_LOCK('{barrier.name}', 60);\nINSERT INTO orbit_counter VALUES (1);",
    )
    write(tmp_path, "0003_more.sql", "INSERT INTO orbit_counter VALUES (2);")
    lock = migrate.lock_name(empty_db.database)

    first, second = spawn_up(empty_db, tmp_path), spawn_up(empty_db, tmp_path)
    try:
        # One process is inside 0002 (blocked on the barrier), the other waits for the lock.
        wait_until(lambda: sessions_waiting_on(server_dsn, barrier.name) == 1)
        wait_until(lambda: sessions_waiting_on(server_dsn, lock) == 1)
        running = migrate.status(empty_db, tmp_path)
        assert running.running == "0002_slow.sql" and running.dirty is None
        assert not running.current
        barrier.release()
        outs = [p.communicate(timeout=60) for p in (first, second)]
    finally:
        for p in (first, second):
            if p.poll() is None:
                p.kill()
                p.wait()

    assert [first.returncode, second.returncode] == [0, 0], outs
    stdout = [o for o, _ in outs]
    assert sum("nothing to apply" in o for o in stdout) == 1, stdout
    assert sum("waiting up to" in o for o in stdout) == 1, stdout
    assert query(empty_db, "SELECT n FROM orbit_counter ORDER BY n") == [(1,), (2,)]
    assert query(empty_db, "SELECT COUNT(*) FROM orbit_schema_migrations") == [(3,)]
    assert migrate.status(empty_db, tmp_path).current
    assert query(server_dsn, "SELECT IS_USED_LOCK(%s)", (lock,)) == [(None,)]


def test_lock_timeout_when_another_run_holds_the_lock(
    empty_db: DSN, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    write(tmp_path, "0001_a.sql", "CREATE TABLE orbit_a (id INT PRIMARY KEY);")
    holder = conn_to(empty_db)
    try:
        with holder.cursor() as cur:
            cur.execute("SELECT GET_LOCK(%s, 0)", (migrate.lock_name(empty_db.database),))
        t0 = time.monotonic()
        with pytest.raises(LockTimeout):
            migrate.up(empty_db, tmp_path, lock_timeout=1)
        assert 0.9 <= time.monotonic() - t0 < 10
        code, _, err = run_cli(
            capsys,
            "up",
            "--dsn",
            empty_db.url(hide_password=False),
            "--migrations-dir",
            str(tmp_path),
            "--lock-timeout",
            "1",
        )
        assert code == 3 and "still held" in err
    finally:
        holder.close()
    assert migrate.up(empty_db, tmp_path).applied == ["0001_a.sql"]


def test_long_database_names_get_a_short_lock_name() -> None:
    name = migrate.lock_name("d" * 64)
    assert len(name) <= 64 and name.startswith("orbit-migrate:")
    assert migrate.lock_name("orbit") == "orbit-migrate:orbit"
    assert migrate.lock_name("e" * 64) != name


# -- a run that dies mid-file --------------------------------------------------------------


def test_a_killed_run_leaves_an_interrupted_dirty_mark(
    empty_db: DSN, server_dsn: DSN, tmp_path: Path, barrier: Barrier
) -> None:
    write(
        tmp_path,
        "0001_a.sql",
        "CREATE TABLE orbit_a (id INT PRIMARY KEY);\n"
        f"SELECT GET_LOCK('{barrier.name}', 60);\n"
        "CREATE TABLE orbit_b (id INT PRIMARY KEY);\n",
    )
    proc = spawn_up(empty_db, tmp_path)
    try:
        wait_until(lambda: sessions_waiting_on(server_dsn, barrier.name) == 1)
        live = migrate.status(empty_db, tmp_path)
        assert live.running == "0001_a.sql" and live.dirty is None
        proc.send_signal(signal.SIGKILL)
        proc.wait(timeout=30)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    # The dead client's session ends once its GET_LOCK returns; then the migrate lock is free.
    barrier.release()
    lock = migrate.lock_name(empty_db.database)
    wait_until(lambda: query(server_dsn, "SELECT IS_USED_LOCK(%s)", (lock,)) == [(None,)])

    st = migrate.status(empty_db, tmp_path)
    assert st.dirty is not None and not st.current
    assert (st.dirty.file, st.dirty.statement, st.dirty.statements) == ("0001_a.sql", 2, 3)
    assert st.dirty.state is DirtyState.INTERRUPTED and st.dirty.error is None
    assert "GET_LOCK" in st.dirty.statement_excerpt
    with pytest.raises(migrate.DirtySchema):
        migrate.up(empty_db, tmp_path)
    assert query(empty_db, "SHOW TABLES LIKE 'orbit_b'") == []

    # Statement 2 only took a lock: resuming at it is safe.
    migrate.repair(empty_db, "0001_a.sql", "resume", tmp_path)
    result = migrate.up(empty_db, tmp_path)
    assert result.applied == ["0001_a.sql"] and result.status.current
    assert query(empty_db, "SELECT method FROM orbit_schema_migrations") == [("resumed",)]
