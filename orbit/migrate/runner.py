"""The migration runner: ``up``, ``status`` and ``repair``.

Guarantees (docs/migrations.md explains them for operators):

- ``up`` and ``repair`` hold the named lock ``orbit-migrate:<database>`` (GET_LOCK) for the
  whole run, so concurrent runs serialise; the second finds nothing pending. The lock is
  released on every path (and by the server if the process dies).
- Files are applied in number order, one statement at a time. Before each statement the
  runner records ``(file, statement index)`` in ``orbit_schema_state``; a failing statement
  turns that row into a ``failed`` dirty mark, a dead process leaves it ``running`` with no
  lock holder (``interrupted``). Either way ``up`` refuses to run until ``repair``.
- On a Galera cluster ``GET_LOCK`` is local to one node, so ``up`` and ``repair`` also hold
  the cluster-wide lease of :mod:`orbit.migrate.lease` (a renewed row of
  ``orbit_schema_lock``), and "is a run alive?" is answered by that lease, not by
  ``IS_USED_LOCK``. A run that loses its lease stops before its next statement.
- A file is recorded in ``orbit_schema_migrations`` with the SHA-256 of its bytes in the same
  transaction that clears the progress row. An applied file whose checksum changed blocks
  ``up`` (forward-only).
- ``up`` refuses to start when the database has any foreign key and stops with an error as
  soon as an applied file created one.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pymysql
from pymysql.connections import Connection

from orbit.migrate import store
from orbit.migrate.errors import (
    ChecksumMismatch,
    DirtySchema,
    ForeignKeysPresent,
    LockTimeout,
    MigrateError,
    MigrationFailed,
    OutOfOrder,
    RepairRefused,
)
from orbit.migrate.files import (
    MigrationFile,
    default_migrations_dir,
    load_migrations,
    migrations_dir_candidates,
    sort_key,
)
from orbit.migrate.lease import ClusterLease
from orbit.migrate.sqlsplit import split_statements
from orbit.migrate.types import (
    DirtyMark,
    DirtyState,
    MigrationStatus,
    RepairMode,
    RepairResult,
    ResumePoint,
    UpResult,
)
from orbit.storage.dsn import DSN
from orbit.storage.errors import error_code

__all__ = ["DEFAULT_LOCK_TIMEOUT", "MIGRATIONS_DIR", "repair", "split_statements", "status", "up"]

#: Seconds ``up``/``repair`` wait for another run's lock before giving up.
DEFAULT_LOCK_TIMEOUT = 300.0


def _default_dir_or_guess() -> Path:
    try:
        return default_migrations_dir()
    except MigrateError:
        return migrations_dir_candidates()[0]


#: The default migrations folder as resolved at import (see :mod:`orbit.migrate.files`).
MIGRATIONS_DIR: Path = _default_dir_or_guess()

Progress = Callable[[str], None]


def _as_dsn(dsn: DSN | str) -> DSN:
    return dsn if isinstance(dsn, DSN) else DSN.parse(dsn)


def _load(migrations_dir: Path | str | None) -> list[MigrationFile]:
    return load_migrations(Path(migrations_dir) if migrations_dir else default_migrations_dir())


def status(dsn: DSN | str, migrations_dir: Path | str | None = None) -> MigrationStatus:
    """Compare the database with the migrations folder. Read-only and cheap (one connection,
    a handful of small queries): safe for a readiness probe, and works under the runtime
    account (SELECT on the bookkeeping tables is all it needs).

    A database that does not exist yet gives ``database_exists=False`` (not current) rather
    than an error; connection failures raise the driver's error.
    """
    d = _as_dsn(dsn)
    files = _load(migrations_dir)
    conn = store.connect_database(d)
    if conn is None:
        return MigrationStatus(
            database=d.database,
            database_exists=False,
            applied=[],
            pending=[f.name for f in files],
            dirty=None,
            foreign_keys=0,
        )
    try:
        return _inspect(conn, d.database, files, lock_mine=False)
    finally:
        conn.close()


def up(
    dsn: DSN | str,
    migrations_dir: Path | str | None = None,
    *,
    lock_timeout: float = DEFAULT_LOCK_TIMEOUT,
    progress: Progress | None = None,
) -> UpResult:
    """Create the database if missing, then apply every pending file under the named lock.

    Returns what was applied and the (current) status after the run. Raises
    :class:`DirtySchema`, :class:`ChecksumMismatch`, :class:`OutOfOrder` or
    :class:`ForeignKeysPresent` before applying anything when the schema is not clean;
    :class:`MigrationFailed` when a statement fails (the dirty mark is recorded first);
    :class:`ForeignKeysPresent` when an applied file created a foreign key;
    :class:`LockTimeout` when another run keeps the lock past ``lock_timeout``.
    """
    d = _as_dsn(dsn)
    say = progress or _quiet
    files = _load(migrations_dir)
    for f in files:
        f.statements  # noqa: B018 - split every file first: bad text fails before any change
    by_name = {f.name: f for f in files}
    conn = store.connect(d, with_database=False)
    lock = store.lock_name(d.database)
    try:
        waited = _lock(conn, lock, lock_timeout, say)
        try:
            created = False
            if not store.database_exists(conn, d.database):
                store.database_create(conn, d.database)
                created = True
                say(f"created database {d.database} (utf8mb4, utf8mb4_bin)")
            store.database_use(conn, d.database)
            store.bookkeeping_create(conn)
            lease = _cluster_lease(conn, d, lock_timeout - waited, say)
        except BaseException:
            store.lock_release(conn, lock)
            raise
        try:
            guard = lease.check if lease is not None else _no_guard
            before = _inspect(conn, d.database, files, lock_mine=True)
            _refuse_unless_clean(before)
            applied: list[str] = []
            for name in before.pending:
                f = by_name[name]
                start, method = 1, "up"
                if before.resume is not None and before.resume.file == name:
                    start, method = _resume_start(f, before.resume), "resumed"
                n = len(f.statements)
                say(
                    f"applying {name} ({n} statement{'s' if n != 1 else ''}"
                    + (f", resuming at {start}" if start > 1 else "")
                    + ")"
                )
                t0 = time.monotonic()
                _apply_file(conn, f, start, guard)
                ms = int((time.monotonic() - t0) * 1000)
                guard()
                store.migration_record(conn, name, f.checksum, n, ms, method)
                applied.append(name)
                say(f"applied {name} in {ms / 1000:.2f} s")
                fks = store.foreign_keys_list(conn, d.database)
                if fks:
                    raise ForeignKeysPresent(fks, after=name)
            after = _inspect(conn, d.database, files, lock_mine=True)
        finally:
            if lease is not None:
                lease.release()
            store.lock_release(conn, lock)
    finally:
        conn.close()
    return UpResult(
        applied=applied, created_database=created, lock_wait_seconds=waited, status=after
    )


def repair(
    dsn: DSN | str,
    file: str,
    mode: RepairMode | str = RepairMode.RERUN,
    migrations_dir: Path | str | None = None,
    *,
    lock_timeout: float = DEFAULT_LOCK_TIMEOUT,
) -> RepairResult:
    """Resolve a dirty mark (or an accepted checksum change) on ``file`` after a manual fix.

    Modes (:class:`RepairMode`): ``rerun`` clears the mark, the next ``up`` runs the file from
    statement 1; ``resume`` makes the next ``up`` continue at the failed statement (refused
    when the statements before it changed); ``mark-applied`` records the file as applied
    with its current checksum; ``accept-checksum`` records the new checksum of an applied,
    edited file. Raises :class:`RepairRefused` when ``file`` is not what the state names.
    Never applies any migration statement itself.
    """
    d = _as_dsn(dsn)
    mode = RepairMode(mode)
    files = _load(migrations_dir)
    by_name = {f.name: f for f in files}
    conn = store.connect_database(d)
    if conn is None:
        raise RepairRefused(f"database {d.database!r} does not exist: nothing to repair")
    lock = store.lock_name(d.database)
    try:
        waited = _lock(conn, lock, lock_timeout, _quiet)
        lease = None
        try:
            lease = _cluster_lease(conn, d, lock_timeout - waited, _quiet)
            st = _inspect(conn, d.database, files, lock_mine=True)
            if mode is RepairMode.ACCEPT_CHECKSUM:
                if file not in st.checksum_mismatches:
                    raise RepairRefused(f"{file} is not an applied file with a changed checksum")
                f = by_name[file]
                store.migration_set_checksum(conn, file, f.checksum, len(f.statements))
            else:
                _repair_mark(conn, st, file, mode, by_name.get(file))
            after = _inspect(conn, d.database, files, lock_mine=True)
        finally:
            if lease is not None:
                lease.release()
            store.lock_release(conn, lock)
    finally:
        conn.close()
    return RepairResult(file=file, mode=mode, status=after)


# -- internals -----------------------------------------------------------------------------


def _quiet(_: str) -> None:
    pass


def _no_guard() -> None:
    pass


def _cluster_lease(conn: Connection, d: DSN, timeout: float, say: Progress) -> ClusterLease | None:
    """On a Galera node, the cluster-wide lease (GET_LOCK alone is node-local there)."""
    if not store.is_galera(conn):
        return None
    store.cluster_lock_table_create(conn)
    return ClusterLease.acquire(d, max(0.0, timeout), say)


def _lock(conn: Connection, lock: str, timeout: float, say: Progress) -> float:
    """Take the named lock, announcing a wait; return the seconds waited."""
    if store.lock_try(conn, lock, 0):
        return 0.0
    say(f"another run holds {lock!r}; waiting up to {timeout:g} s")
    t0 = time.monotonic()
    if not store.lock_try(conn, lock, timeout):
        raise LockTimeout(lock, timeout)
    return time.monotonic() - t0


def _refuse_unless_clean(st: MigrationStatus) -> None:
    if st.dirty is not None:
        raise DirtySchema(st.dirty)
    if st.checksum_mismatches:
        raise ChecksumMismatch(st.checksum_mismatches)
    if st.out_of_order:
        raise OutOfOrder(st.out_of_order, max(st.applied, key=_order))
    if st.constraints:
        raise ForeignKeysPresent(st.constraints)
    if st.resume is not None and (not st.pending or st.pending[0] != st.resume.file):
        raise RepairRefused(
            f"resume point names {st.resume.file}, which is not the next pending file; "
            f"run `orbit-migrate repair --file {st.resume.file} --confirm` to clear it"
        )


def _resume_start(f: MigrationFile, point: ResumePoint) -> int:
    if point.statement > len(f.statements) + 1:
        raise MigrateError(
            f"{f.name} has {len(f.statements)} statements; cannot resume at {point.statement}"
        )
    if f.prefix_checksum(point.statement) != point.prefix_checksum:
        raise MigrateError(
            f"{f.name}: statements before {point.statement} changed since "
            "`repair --resume`; repair again with rerun or mark-applied"
        )
    return point.statement


def _apply_file(conn: Connection, f: MigrationFile, start: int, guard: Callable[[], None]) -> None:
    """Run ``f`` from statement ``start``; ``guard()`` before each statement raises when the
    run no longer holds its lock (the cluster lease)."""
    stmts = f.statements
    if start > len(stmts):
        return
    guard()
    store.state_begin(conn, f.name, start, len(stmts), f.prefix_checksum(start), stmts[start - 1])
    for k in range(start, len(stmts) + 1):
        stmt = stmts[k - 1]
        if k > start:
            guard()
        if k > start and not store.state_progress_if_running(
            conn, f.name, k, f.prefix_checksum(k), stmt
        ):
            raise MigrateError(f"progress row for {f.name} vanished; another run interfered")
        try:
            store.run_statement(conn, stmt)
        except pymysql.MySQLError as exc:
            code = error_code(exc)
            message = str(exc.args[1]) if len(exc.args) > 1 else str(exc)
            # If the connection is gone, the `running` row stays and reads as interrupted.
            with contextlib.suppress(pymysql.MySQLError):
                store.state_fail_if_running(conn, f.name, code, message)
            raise MigrationFailed(f.name, k, code, message) from exc


def _repair_mark(
    conn: Connection, st: MigrationStatus, file: str, mode: RepairMode, f: MigrationFile | None
) -> None:
    if st.dirty is not None:
        marked, statement = st.dirty.file, st.dirty.statement
    elif st.resume is not None:
        marked, statement = st.resume.file, st.resume.statement
    else:
        raise RepairRefused("no dirty mark to repair")
    if marked != file:
        raise RepairRefused(f"the dirty mark names {marked}, not {file}")
    if mode is RepairMode.RERUN:
        store.state_clear(conn)
        return
    if f is None:
        raise RepairRefused(f"{file} is not in the migrations folder")
    if mode is RepairMode.MARK_APPLIED:
        store.migration_record(conn, file, f.checksum, len(f.statements), 0, "marked")
        return
    # RESUME: the statements already applied must still be the file's first ones.
    row = store.state_get(conn)
    if row is None or statement > len(f.statements) + 1:
        raise RepairRefused(f"{file} no longer has statement {statement}")
    if f.prefix_checksum(statement) != bytes(row["prefix_checksum"]):
        raise RepairRefused(
            f"statements before {statement} of {file} changed since the failure; "
            "use rerun (after undoing them) or mark-applied"
        )
    store.state_resume(conn, file)


def _inspect(
    conn: Connection, database: str, files: list[MigrationFile], *, lock_mine: bool
) -> MigrationStatus:
    """Build the status on an open connection. ``lock_mine``: this session holds the lock,
    so a ``running`` row can only be a dead run's."""
    rows = store.migrations_list(conn) or []
    by_name = {f.name: f for f in files}
    applied = sorted((r["name"] for r in rows), key=_order)
    recorded = {r["name"]: bytes(r["checksum"]) for r in rows}
    dirty, resume, running = _read_state(conn, database, lock_mine)
    pending = [f.name for f in files if f.name not in recorded]
    keys = [k for k in (sort_key(n) for n in applied) if k is not None]
    last = max(keys) if keys else None
    constraints = store.foreign_keys_list(conn, database)
    return MigrationStatus(
        database=database,
        database_exists=True,
        applied=applied,
        pending=pending,
        dirty=dirty,
        foreign_keys=len(constraints),
        checksum_mismatches=[
            n for n in applied if n in by_name and by_name[n].checksum != recorded[n]
        ],
        out_of_order=[n for n in pending if last is not None and _order(n) < last],
        unknown=[n for n in applied if n not in by_name],
        running=running,
        resume=resume,
        constraints=constraints,
    )


def _read_state(
    conn: Connection, database: str, lock_mine: bool
) -> tuple[DirtyMark | None, ResumePoint | None, str | None]:
    state = store.state_get(conn)
    if state is None:
        return None, None, None
    phase = state["phase"]
    if phase == "failed":
        return _mark(state, DirtyState.FAILED), None, None
    if phase == "resume":
        point = ResumePoint(
            state["file"], int(state["statement_index"]), bytes(state["prefix_checksum"])
        )
        return None, point, None
    # phase == "running": a live run, or a dead one if nobody holds the lock.
    if lock_mine:
        return _mark(state, DirtyState.INTERRUPTED), None, None
    if _run_alive(conn, database):
        return None, None, state["file"]
    if store.state_get(conn) == state:  # unchanged with the lock free: the run died
        return _mark(state, DirtyState.INTERRUPTED), None, None
    return None, None, state["file"]  # it moved on meanwhile: a run just finished/started


def _run_alive(conn: Connection, database: str) -> bool:
    """Some run holds the lock: the named lock on one server; on Galera (where another
    node's GET_LOCK is invisible) an unexpired cluster lease."""
    if store.is_galera(conn):
        return store.cluster_lock_live(conn)
    return store.lock_is_held(conn, store.lock_name(database))


def _mark(state: dict[str, Any], how: DirtyState) -> DirtyMark:
    return DirtyMark(
        file=state["file"],
        statement=int(state["statement_index"]),
        statements=int(state["statement_count"]),
        state=how,
        error_code=state["error_code"] if how is DirtyState.FAILED else None,
        error=state["error_message"] if how is DirtyState.FAILED else None,
        statement_excerpt=state["statement_excerpt"],
        started_at=state["started_at"],
        updated_at=state["updated_at"],
        runner=state["runner"],
    )


def _order(name: str) -> tuple[int, str]:
    return sort_key(name) or (1 << 62, name)
