"""Forward-only schema migrations (``orbit-migrate up|status|repair|grants``).

``up(dsn)`` applies pending files under a named lock, statement by statement, recording
checksums and a dirty mark on failure; ``status(dsn)`` is the cheap read the server's
readiness check uses (``.current``, ``.dirty``, ``.pending``, ``.foreign_keys``,
``.checksum_mismatches``). See docs/migrations.md.
"""

from orbit.migrate.errors import (
    ChecksumMismatch,
    DirtySchema,
    ForeignKeysPresent,
    LockTimeout,
    MigrateError,
    MigrationFailed,
    MigrationsDirError,
    OutOfOrder,
    RepairRefused,
    UsageError,
)
from orbit.migrate.files import MigrationFile, default_migrations_dir, load_migrations
from orbit.migrate.grants import GrantPlan, apply_runtime_grants, runtime_grants
from orbit.migrate.runner import DEFAULT_LOCK_TIMEOUT, MIGRATIONS_DIR, repair, status, up
from orbit.migrate.sqlsplit import SqlSplitError, split_statements
from orbit.migrate.store import BOOKKEEPING_TABLES, lock_name
from orbit.migrate.types import (
    DirtyMark,
    DirtyState,
    ForeignKey,
    MigrationStatus,
    RepairMode,
    RepairResult,
    ResumePoint,
    UpResult,
)

__all__ = [
    "BOOKKEEPING_TABLES",
    "DEFAULT_LOCK_TIMEOUT",
    "MIGRATIONS_DIR",
    "ChecksumMismatch",
    "DirtyMark",
    "DirtySchema",
    "DirtyState",
    "ForeignKey",
    "ForeignKeysPresent",
    "GrantPlan",
    "LockTimeout",
    "MigrateError",
    "MigrationFailed",
    "MigrationFile",
    "MigrationStatus",
    "MigrationsDirError",
    "OutOfOrder",
    "RepairMode",
    "RepairRefused",
    "RepairResult",
    "ResumePoint",
    "SqlSplitError",
    "UpResult",
    "UsageError",
    "apply_runtime_grants",
    "default_migrations_dir",
    "load_migrations",
    "lock_name",
    "repair",
    "runtime_grants",
    "split_statements",
    "status",
    "up",
]
