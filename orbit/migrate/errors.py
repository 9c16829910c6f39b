"""Errors of ``orbit-migrate``. Each carries fields and the CLI exit code it maps to.

MigrateError                 exit 1 unless noted
 ├── MigrationsDirError      exit 2  the migrations folder is missing or holds clashing files
 ├── DirtySchema                     a dirty mark exists; ``up`` refuses (``mark``)
 ├── ChecksumMismatch                applied files changed on disk (``names``)
 ├── OutOfOrder                      pending files sort before the last applied one (``names``)
 ├── ForeignKeysPresent              the database has foreign keys (``constraints``)
 ├── MigrationFailed                 a statement failed; a dirty mark was recorded
 ├── UsageError              exit 2  arguments that cannot work (missing password, …)
 │    └── RepairRefused      exit 2  ``repair`` arguments do not match the database's state
 ├── LockTimeout             exit 3  another ``up``/``repair`` held the named lock too long
 └── LockLost                exit 3  a Galera run could not renew its cluster-wide lease

These are operator-facing (the CLI prints them); they never reach an HTTP client, so they do
not derive from :class:`orbit.errors.OrbitError`.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from orbit.migrate.types import DirtyMark, ForeignKey


class MigrateError(Exception):
    """Base of every ``orbit-migrate`` refusal or failure."""

    exit_code: int = 1


class MigrationsDirError(MigrateError):
    """The migrations folder is missing, unreadable, or two files share a number."""

    exit_code = 2


class DirtySchema(MigrateError):
    """A previous run failed or was interrupted; nothing runs until an operator repairs it."""

    def __init__(self, mark: DirtyMark) -> None:
        super().__init__(
            f"schema is dirty: {mark.file} statement {mark.statement}/{mark.statements} "
            f"{mark.state}"
            + (f" ({mark.error})" if mark.error else "")
            + "; repair by hand, then `orbit-migrate repair` (docs/migrations.md)"
        )
        self.mark = mark


class ChecksumMismatch(MigrateError):
    """Applied migration files were edited after they were applied (forward-only rule)."""

    def __init__(self, names: list[str]) -> None:
        super().__init__(
            "applied migration file(s) changed on disk: "
            + ", ".join(names)
            + "; restore them and add a new migration instead"
        )
        self.names = names


class OutOfOrder(MigrateError):
    """Pending files are numbered below the last applied file; applying them would reorder
    history."""

    def __init__(self, names: list[str], last_applied: str) -> None:
        super().__init__(
            f"pending file(s) {', '.join(names)} sort before the last applied file "
            f"{last_applied}; renumber them after it"
        )
        self.names = names
        self.last_applied = last_applied


class ForeignKeysPresent(MigrateError):
    """The database holds foreign keys; Orbit forbids them
    (docs/invariants.md#4-no-foreign-keys)."""

    def __init__(self, constraints: list[ForeignKey], after: str | None = None) -> None:
        listed = ", ".join(f"{c.table}.{c.name} -> {c.referenced_table}" for c in constraints)
        where = f" after applying {after}" if after else ""
        super().__init__(
            f"{len(constraints)} foreign key(s) found{where}: {listed}; "
            "Orbit uses no foreign keys: drop them"
        )
        self.constraints = constraints
        self.after = after


class MigrationFailed(MigrateError):
    """Statement ``statement`` (1-based) of ``file`` failed; the dirty mark records it."""

    def __init__(self, file: str, statement: int, error_code: int | None, error: str) -> None:
        super().__init__(
            f"{file} statement {statement} failed: "
            + (f"({error_code}) " if error_code else "")
            + error
        )
        self.file = file
        self.statement = statement
        self.error_code = error_code
        self.error = error


class UsageError(MigrateError):
    """The request cannot work as given (e.g. creating an account without a password)."""

    exit_code = 2


class RepairRefused(UsageError):
    """``repair`` was asked for something the recorded state does not allow."""


class LockTimeout(MigrateError):
    """The named lock ``lock`` stayed busy for ``seconds``."""

    exit_code = 3

    def __init__(self, lock: str, seconds: float) -> None:
        super().__init__(f"named lock {lock!r} still held by another run after {seconds:g} s")
        self.lock = lock
        self.seconds = seconds


class LockLost(MigrateError):
    """The cluster-wide lease (Galera) expired or was taken over during the run: the run
    stopped before its next statement (a ``running`` mark stays; ``status`` shows it
    ``interrupted`` and ``repair`` resolves it)."""

    exit_code = 3

    def __init__(self, lock: str, reason: str) -> None:
        super().__init__(f"lost the cluster lock {lock!r}: {reason}; stopped before the next statement")
        self.lock = lock
        self.reason = reason
