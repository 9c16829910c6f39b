"""Typed results of ``orbit-migrate``: status, dirty marks, foreign keys, run results."""

from __future__ import annotations

from datetime import datetime
from enum import StrEnum
from typing import Any

import msgspec


class DirtyState(StrEnum):
    """Why the schema is dirty."""

    FAILED = "failed"  # a statement raised an error; ``error`` says which
    INTERRUPTED = "interrupted"  # the run died mid-file (no error recorded, lock released)


class RepairMode(StrEnum):
    """What ``repair`` does with the dirty (or changed) file."""

    RERUN = "rerun"  # clear the mark; the next ``up`` runs the file from statement 1
    RESUME = "resume"  # the next ``up`` continues the file at the failed statement
    MARK_APPLIED = "mark-applied"  # record the file as applied (you finished it by hand)
    ACCEPT_CHECKSUM = "accept-checksum"  # record an applied file's new checksum


class DirtyMark(msgspec.Struct, frozen=True, kw_only=True):
    """A failed or interrupted run: statements before ``statement`` of ``file`` were applied;
    ``statement`` itself failed (``FAILED``) or its outcome is unknown (``INTERRUPTED``)."""

    file: str
    statement: int  # 1-based index of the failed / interrupted statement
    statements: int  # number of statements in the file
    state: DirtyState
    error_code: int | None = None
    error: str | None = None
    statement_excerpt: str = ""  # the first characters of the statement
    started_at: datetime | None = None
    updated_at: datetime | None = None
    runner: str = ""  # host:pid of the run that left the mark

    def to_json(self) -> dict[str, Any]:
        """The ``dirty`` object of ``status --json``."""
        return {
            "file": self.file,
            "statement": self.statement,
            "statements": self.statements,
            "state": self.state.value,
            "error_code": self.error_code,
            "error": self.error,
            "statement_excerpt": self.statement_excerpt,
            "at": self.updated_at.isoformat() + "Z" if self.updated_at else None,
            "runner": self.runner,
        }


class ResumePoint(msgspec.Struct, frozen=True):
    """Set by ``repair --resume``: the next ``up`` starts ``file`` at ``statement``."""

    file: str
    statement: int
    prefix_checksum: bytes = b""  # SHA-256 of the statements before ``statement``


class ForeignKey(msgspec.Struct, frozen=True):
    """One foreign-key constraint found in the database (there should be none)."""

    name: str
    table: str
    referenced_table: str


class MigrationStatus(msgspec.Struct, frozen=True, kw_only=True):
    """The schema's state compared with the migrations folder.

    ``current`` is True only when nothing is pending, no dirty mark exists, no applied file
    changed, nothing is out of order and the database has zero foreign keys: exactly when
    ``orbit-migrate status`` exits 0 and ``/readyz`` may report ready.
    """

    database: str
    database_exists: bool
    applied: list[str]  # applied file names, in order
    pending: list[str]  # files in the folder not applied yet, in order
    dirty: DirtyMark | None
    foreign_keys: int
    checksum_mismatches: list[str] = []  # applied files whose SHA-256 changed on disk
    out_of_order: list[str] = []  # pending files that sort before the last applied one
    unknown: list[str] = []  # applied names with no file in the folder (newer schema)
    running: str | None = None  # file a live ``up`` is applying right now
    resume: ResumePoint | None = None
    constraints: list[ForeignKey] = []

    @property
    def current(self) -> bool:
        """True when the schema is fully migrated and clean (see the class docstring)."""
        return (
            self.database_exists
            and not self.pending
            and self.dirty is None
            and not self.checksum_mismatches
            and not self.out_of_order
            and self.foreign_keys == 0
        )

    def problems(self) -> list[str]:
        """One human sentence per reason ``current`` is False (empty when current)."""
        out: list[str] = []
        if not self.database_exists:
            out.append(f"database {self.database!r} does not exist (run `orbit-migrate up`)")
        if self.dirty is not None:
            d = self.dirty
            out.append(
                f"dirty: {d.file} statement {d.statement}/{d.statements} {d.state.value}"
                + (f": ({d.error_code}) {d.error}" if d.error else "")
            )
        if self.checksum_mismatches:
            out.append("applied file(s) changed on disk: " + ", ".join(self.checksum_mismatches))
        if self.out_of_order:
            out.append("pending file(s) out of order: " + ", ".join(self.out_of_order))
        if self.running:
            out.append(f"an `up` run is applying {self.running} right now")
        if self.pending:
            out.append(f"{len(self.pending)} pending: " + ", ".join(self.pending))
        if self.foreign_keys:
            out.append(
                f"{self.foreign_keys} foreign key(s): "
                + ", ".join(f"{c.table}.{c.name}" for c in self.constraints)
            )
        return out

    def to_json(self) -> dict[str, Any]:
        """Exactly the contract's shape: current, applied, pending, dirty, foreign_keys
        (docs/api/conventions.md#command-line-fixed-names-and-flags)."""
        return {
            "current": self.current,
            "applied": list(self.applied),
            "pending": list(self.pending),
            "dirty": self.dirty.to_json() if self.dirty else None,
            "foreign_keys": self.foreign_keys,
        }


class UpResult(msgspec.Struct, frozen=True, kw_only=True):
    """What one ``up`` run did. ``status`` is the state after the run (always current)."""

    applied: list[str]  # files applied by this run, in order
    created_database: bool
    lock_wait_seconds: float
    status: MigrationStatus


class RepairResult(msgspec.Struct, frozen=True, kw_only=True):
    """What ``repair`` did and the state after it."""

    file: str
    mode: RepairMode
    status: MigrationStatus
