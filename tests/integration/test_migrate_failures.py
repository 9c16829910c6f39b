"""orbit-migrate refusals: changed checksums, failing statements (dirty mark), the repair
modes, foreign keys, out-of-order and malformed files."""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

import pymysql
import pytest

from orbit import migrate
from orbit.migrate import (
    ChecksumMismatch,
    DirtySchema,
    DirtyState,
    ForeignKeysPresent,
    MigrationFailed,
    MigrationsDirError,
    OutOfOrder,
    RepairRefused,
)
from orbit.storage.dsn import DSN

ROOT = Path(__file__).resolve().parents[2]
try:
    from orbit_cmd import migrate as cli
except ModuleNotFoundError:  # not installed: use the source tree
    sys.path.insert(0, str(ROOT / "cmd"))
    from orbit_cmd import migrate as cli

SYNTAX_ERROR = 1064


def query(dsn: DSN, sql: str, args: Any = None) -> list[tuple[Any, ...]]:
    conn = pymysql.connect(autocommit=True, **dsn.connect_kwargs())
    try:
        with conn.cursor() as cur:
            cur.execute(sql, args)
            return list(cur.fetchall())
    finally:
        conn.close()


def tables(dsn: DSN) -> set[str]:
    rows = query(
        dsn,
        "SELECT TABLE_NAME FROM information_schema.TABLES WHERE TABLE_SCHEMA = %s",
        (dsn.database,),
    )
    return {r[0] for r in rows} - set(migrate.BOOKKEEPING_TABLES)


def write(folder: Path, name: str, sql: str) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / name
    path.write_text(sql, encoding="utf-8")
    return path


def run_cli(
    capsys: pytest.CaptureFixture[str], dsn: DSN, folder: Path, *args: str
) -> tuple[int, str, str]:
    code = cli.main(["--dsn", dsn.url(hide_password=False), "--migrations-dir", str(folder), *args])
    out, err = capsys.readouterr()
    return code, out, err


FAILING = (
    "CREATE TABLE orbit_a (id INT PRIMARY KEY);\n"
    "CREATE TABLE orbit_b (id INT PRIMARY KEY);\n"
    "CREATE TABLEX orbit_broken (id INT);\n"
    "CREATE TABLE orbit_c (id INT PRIMARY KEY);\n"
)


@pytest.fixture
def failed(empty_db: DSN, tmp_path: Path) -> tuple[DSN, Path]:
    """A database whose first migration failed at statement 3 (orbit_a, orbit_b created)."""
    write(tmp_path, "0001_abc.sql", FAILING)
    write(tmp_path, "0002_d.sql", "CREATE TABLE orbit_d (id INT PRIMARY KEY);")
    with pytest.raises(MigrationFailed) as info:
        migrate.up(empty_db, tmp_path)
    assert (info.value.file, info.value.statement, info.value.error_code) == (
        "0001_abc.sql",
        3,
        SYNTAX_ERROR,
    )
    return empty_db, tmp_path


# -- checksums -----------------------------------------------------------------------------


def test_an_edited_applied_file_is_reported_and_blocks_up(
    empty_db: DSN, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    first = write(tmp_path, "0001_a.sql", "CREATE TABLE orbit_a (id INT PRIMARY KEY);\n")
    migrate.up(empty_db, tmp_path)
    first.write_text(first.read_text() + "-- an innocent-looking edit\n")
    write(tmp_path, "0002_b.sql", "CREATE TABLE orbit_b (id INT PRIMARY KEY);")

    st = migrate.status(empty_db, tmp_path)
    assert st.checksum_mismatches == ["0001_a.sql"] and not st.current
    assert st.pending == ["0002_b.sql"]
    with pytest.raises(ChecksumMismatch) as info:
        migrate.up(empty_db, tmp_path)
    assert info.value.names == ["0001_a.sql"]
    assert "orbit_b" not in tables(empty_db)

    code, out, err = run_cli(capsys, empty_db, tmp_path, "status", "--json")
    assert code == 1 and json.loads(out)["current"] is False
    assert "changed on disk: 0001_a.sql" in err
    code, _, err = run_cli(capsys, empty_db, tmp_path, "up")
    assert code == 1 and "0001_a.sql" in err

    # Deliberately accepting the edit records the new checksum; then up proceeds.
    with pytest.raises(RepairRefused):
        migrate.repair(empty_db, "0002_b.sql", "accept-checksum", tmp_path)
    code, _, _ = run_cli(
        capsys,
        empty_db,
        tmp_path,
        "repair",
        "--file",
        "0001_a.sql",
        "--accept-checksum",
        "--confirm",
    )
    assert code == 0
    assert migrate.up(empty_db, tmp_path).applied == ["0002_b.sql"]
    assert query(empty_db, "SELECT name, method FROM orbit_schema_migrations ORDER BY name") == [
        ("0001_a.sql", "accepted"),
        ("0002_b.sql", "up"),
    ]


# -- a failing statement and the dirty mark ------------------------------------------------


def test_a_failing_statement_leaves_a_dirty_mark_and_up_refuses(
    failed: tuple[DSN, Path], capsys: pytest.CaptureFixture[str]
) -> None:
    dsn, folder = failed
    assert tables(dsn) == {"orbit_a", "orbit_b"}  # statements 1-2 applied, 3 failed, 4 not run
    st = migrate.status(dsn, folder)
    assert not st.current and st.applied == []
    mark = st.dirty
    assert mark is not None
    assert (mark.file, mark.statement, mark.statements) == ("0001_abc.sql", 3, 4)
    assert mark.state is DirtyState.FAILED and mark.error_code == SYNTAX_ERROR
    assert "TABLEX" in (mark.error or "") and mark.statement_excerpt.startswith("CREATE TABLEX")

    with pytest.raises(DirtySchema):
        migrate.up(dsn, folder)
    assert tables(dsn) == {"orbit_a", "orbit_b"}

    code, out, err = run_cli(capsys, dsn, folder, "up")
    assert code == 1 and "dirty" in err and "0001_abc.sql statement 3/4" in err
    code, out, _ = run_cli(capsys, dsn, folder, "status", "--json")
    assert code == 1
    dirty = json.loads(out)["dirty"]
    assert (dirty["file"], dirty["statement"], dirty["state"], dirty["error_code"]) == (
        "0001_abc.sql",
        3,
        "failed",
        SYNTAX_ERROR,
    )
    code, out, _ = run_cli(capsys, dsn, folder, "status")
    assert code == 1 and "statement 3/4 failed" in out


def test_the_cli_up_reports_a_failure_with_exit_1(
    empty_db: DSN, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    write(tmp_path, "0001_abc.sql", FAILING)
    code, _, err = run_cli(capsys, empty_db, tmp_path, "up")
    assert code == 1
    assert "0001_abc.sql statement 3 failed: (1064)" in err
    assert migrate.status(empty_db, tmp_path).dirty is not None


def test_repair_needs_confirm_and_the_right_file(
    failed: tuple[DSN, Path], capsys: pytest.CaptureFixture[str]
) -> None:
    dsn, folder = failed
    code, out, _ = run_cli(capsys, dsn, folder, "repair", "--file", "0001_abc.sql")
    assert code == 2 and "--confirm" in out
    assert migrate.status(dsn, folder).dirty is not None  # nothing changed

    code, _, err = run_cli(capsys, dsn, folder, "repair", "--file", "0002_d.sql", "--confirm")
    assert code == 2 and "names 0001_abc.sql" in err
    with pytest.raises(RepairRefused):
        migrate.repair(dsn, "0002_d.sql", "rerun", folder)
    assert migrate.status(dsn, folder).dirty is not None


def test_repair_resume_continues_at_the_failed_statement(
    failed: tuple[DSN, Path], capsys: pytest.CaptureFixture[str]
) -> None:
    dsn, folder = failed
    (folder / "0001_abc.sql").write_text(
        FAILING.replace("TABLEX orbit_broken", "TABLE orbit_fixed")
    )
    code, out, _ = run_cli(
        capsys, dsn, folder, "repair", "--file", "0001_abc.sql", "--resume", "--confirm"
    )
    assert code == 0, out
    st = migrate.status(dsn, folder)
    assert st.dirty is None and st.resume is not None
    assert (st.resume.file, st.resume.statement) == ("0001_abc.sql", 3)

    # orbit_a/orbit_b have no IF NOT EXISTS: re-running statements 1-2 would fail.
    result = migrate.up(dsn, folder)
    assert result.applied == ["0001_abc.sql", "0002_d.sql"] and result.status.current
    assert tables(dsn) == {"orbit_a", "orbit_b", "orbit_fixed", "orbit_c", "orbit_d"}
    assert query(dsn, "SELECT name, method FROM orbit_schema_migrations ORDER BY name") == [
        ("0001_abc.sql", "resumed"),
        ("0002_d.sql", "up"),
    ]
    assert query(dsn, "SELECT COUNT(*) FROM orbit_schema_state") == [(0,)]


def test_repair_resume_refuses_when_applied_statements_changed(failed: tuple[DSN, Path]) -> None:
    dsn, folder = failed
    (folder / "0001_abc.sql").write_text(FAILING.replace("orbit_a ", "orbit_z "))
    with pytest.raises(RepairRefused, match="changed since the failure"):
        migrate.repair(dsn, "0001_abc.sql", "resume", folder)
    assert migrate.status(dsn, folder).dirty is not None


def test_repair_resume_refuses_at_up_when_the_prefix_changes_afterwards(
    failed: tuple[DSN, Path],
) -> None:
    dsn, folder = failed
    path = folder / "0001_abc.sql"
    path.write_text(FAILING.replace("TABLEX", "TABLE"))
    migrate.repair(dsn, "0001_abc.sql", "resume", folder)
    path.write_text(FAILING.replace("TABLEX", "TABLE").replace("orbit_b ", "orbit_y "))
    with pytest.raises(migrate.MigrateError, match="changed since"):
        migrate.up(dsn, folder)
    assert "orbit_y" not in tables(dsn)


def test_repair_rerun_runs_the_whole_file_again(
    failed: tuple[DSN, Path], capsys: pytest.CaptureFixture[str]
) -> None:
    dsn, folder = failed
    query(dsn, "DROP TABLE orbit_a, orbit_b")  # the manual fix: undo the partial file
    (folder / "0001_abc.sql").write_text(FAILING.replace("TABLEX", "TABLE"))
    code, _, _ = run_cli(capsys, dsn, folder, "repair", "--file", "0001_abc.sql", "--confirm")
    assert code == 0
    st = migrate.status(dsn, folder)
    assert st.dirty is None and st.resume is None and st.pending == ["0001_abc.sql", "0002_d.sql"]
    assert migrate.up(dsn, folder).status.current
    assert tables(dsn) == {"orbit_a", "orbit_b", "orbit_broken", "orbit_c", "orbit_d"}


def test_repair_mark_applied_records_the_file(
    failed: tuple[DSN, Path], capsys: pytest.CaptureFixture[str]
) -> None:
    dsn, folder = failed
    query(dsn, "CREATE TABLE orbit_c (id INT PRIMARY KEY)")  # finished by hand
    code, _, _ = run_cli(
        capsys, dsn, folder, "repair", "--file", "0001_abc.sql", "--mark-applied", "--confirm"
    )
    assert code == 0
    st = migrate.status(dsn, folder)
    assert st.applied == ["0001_abc.sql"] and st.dirty is None and st.pending == ["0002_d.sql"]
    assert migrate.up(dsn, folder).applied == ["0002_d.sql"]
    assert query(dsn, "SELECT method FROM orbit_schema_migrations WHERE name = '0001_abc.sql'") == [
        ("marked",)
    ]


def test_the_documented_sql_repair_clears_the_mark(failed: tuple[DSN, Path]) -> None:
    """docs/migrations.md: `DELETE FROM orbit_schema_state` is the same as `repair` (rerun)."""
    dsn, folder = failed
    query(dsn, "DROP TABLE orbit_a, orbit_b")
    (folder / "0001_abc.sql").write_text(FAILING.replace("TABLEX", "TABLE"))
    query(dsn, "DELETE FROM orbit_schema_state")
    assert migrate.up(dsn, folder).status.current


def test_repair_without_a_mark_is_refused(empty_db: DSN, tmp_path: Path) -> None:
    write(tmp_path, "0001_a.sql", "CREATE TABLE orbit_a (id INT PRIMARY KEY);")
    migrate.up(empty_db, tmp_path)
    with pytest.raises(RepairRefused, match="no dirty mark"):
        migrate.repair(empty_db, "0001_a.sql", "rerun", tmp_path)


# -- foreign keys --------------------------------------------------------------------------


def test_a_foreign_key_makes_status_non_current_and_blocks_up(
    empty_db: DSN, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    write(
        tmp_path,
        "0001_fk.sql",
        "CREATE TABLE orbit_parent (id INT PRIMARY KEY);\n"
        "CREATE TABLE orbit_child (id INT PRIMARY KEY, parent_id INT,\n"
        "  CONSTRAINT fk_child_parent FOREIGN KEY (parent_id) REFERENCES orbit_parent (id));\n",
    )
    code, _, err = run_cli(capsys, empty_db, tmp_path, "up")
    assert code == 1 and "fk_child_parent" in err and "after applying 0001_fk.sql" in err

    st = migrate.status(empty_db, tmp_path)
    assert st.foreign_keys == 1 and not st.current and st.pending == []
    assert [(c.name, c.table, c.referenced_table) for c in st.constraints] == [
        ("fk_child_parent", "orbit_child", "orbit_parent")
    ]
    code, out, _ = run_cli(capsys, empty_db, tmp_path, "status", "--json")
    assert code == 1
    assert json.loads(out) == {
        "current": False,
        "applied": ["0001_fk.sql"],
        "pending": [],
        "dirty": None,
        "foreign_keys": 1,
    }

    write(tmp_path, "0002_more.sql", "CREATE TABLE orbit_more (id INT PRIMARY KEY);")
    with pytest.raises(ForeignKeysPresent) as info:
        migrate.up(empty_db, tmp_path)
    assert info.value.after is None and len(info.value.constraints) == 1
    assert "orbit_more" not in tables(empty_db)

    query(empty_db, "ALTER TABLE orbit_child DROP FOREIGN KEY fk_child_parent")
    assert migrate.up(empty_db, tmp_path).status.current


# -- ordering and files --------------------------------------------------------------------


def test_a_pending_file_numbered_below_an_applied_one_is_refused(
    empty_db: DSN, tmp_path: Path
) -> None:
    write(tmp_path, "0002_b.sql", "CREATE TABLE orbit_b (id INT PRIMARY KEY);")
    migrate.up(empty_db, tmp_path)
    write(tmp_path, "0001_a.sql", "CREATE TABLE orbit_a (id INT PRIMARY KEY);")
    st = migrate.status(empty_db, tmp_path)
    assert st.out_of_order == ["0001_a.sql"] and not st.current
    with pytest.raises(OutOfOrder, match=r"0002_b\.sql"):
        migrate.up(empty_db, tmp_path)
    assert "orbit_a" not in tables(empty_db)


def test_an_applied_file_missing_from_the_folder_is_reported_not_blocking(
    empty_db: DSN, tmp_path: Path
) -> None:
    write(tmp_path, "0001_a.sql", "CREATE TABLE orbit_a (id INT PRIMARY KEY);")
    second = write(tmp_path, "0002_b.sql", "CREATE TABLE orbit_b (id INT PRIMARY KEY);")
    migrate.up(empty_db, tmp_path)
    second.unlink()  # an older release's folder against a newer schema
    st = migrate.status(empty_db, tmp_path)
    assert st.unknown == ["0002_b.sql"] and st.current


@pytest.mark.parametrize(
    ("files", "message"),
    [
        ({"0001_a.sql": "SELECT 1;", "001_b.sql": "SELECT 1;"}, "share number 1"),
        ({"0001-a.sql": "SELECT 1;"}, "bad migration file name"),
        (
            {"0001_a.sql": "SELECT 1;", "0002_b.sql": "SELECT 'unterminated;"},
            r"0002_b\.sql: unterminated",
        ),
    ],
)
def test_bad_folders_fail_before_anything_is_applied(
    empty_db: DSN, tmp_path: Path, files: dict[str, str], message: str
) -> None:
    for name, sql in files.items():
        write(tmp_path, name, sql)
    write(tmp_path, "schema_snapshot.sql", "not a migration: ignored")
    with pytest.raises(MigrationsDirError, match=message):
        migrate.up(empty_db, tmp_path)
    assert query(
        empty_db,
        "SELECT COUNT(*) FROM information_schema.TABLES WHERE TABLE_SCHEMA = %s",
        (empty_db.database,),
    ) == [(0,)]


def test_a_missing_folder_is_a_usage_error(
    empty_db: DSN, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    code, _, err = run_cli(capsys, empty_db, tmp_path / "nope", "status")
    assert code == 2 and "not found" in err
