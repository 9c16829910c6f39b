"""Shardability guard: every statement on a runtime table must carry a ``namespace_id``
predicate (docs/invariants.md#9-tenant-isolation; docs/deployment.md: a fleet that outgrows
one MySQL shards by namespace).

Loaded as a pytest plugin from ``tests/conftest.py`` (``pytest_plugins``). At start it turns
on ``orbit.storage.db.STATEMENT_LOG`` (deduplicated, so memory stays small); at the end of the
session it checks every distinct statement the stores ran through a ``Tx`` and **fails the
session** (exit status 1, with a report) when one touches a runtime table without a
``namespace_id`` predicate, unless its query name is in :data:`ALLOW`.

Runtime tables are found in ``migrations/*.sql``: every table whose primary key starts with
``namespace_id``. The check is textual and deliberately simple:

* INSERT/REPLACE must name ``namespace_id`` (in the column list);
* SELECT/UPDATE/DELETE must mention ``namespace_id`` after their first ``WHERE`` (a join's
  ``ON ... namespace_id`` also counts).

Set ``ORBIT_SQL_GUARD=0`` to switch it off (e.g. while profiling).

It also loads the shard-group guard (tests/shard_guard.py): every transaction must touch the
namespaces of one shard group under ``ORBIT_SHARD_MAP`` (default ``single``: one group).

ALLOW is the short, documented list of cross-namespace background scans. Each entry is a
query name (``-- name:`` in a ``sql/*.sql`` file) and the reason it may scan every namespace.
"""

from __future__ import annotations

import os
import re
from collections.abc import Iterable
from pathlib import Path

import pytest
import shard_guard

from orbit.storage import db as storage_db
from orbit.storage.sqlfile import parse_queries

ROOT = Path(__file__).resolve().parent.parent
SQL_DIRS = [ROOT / "orbit" / "sql", ROOT / "pulse" / "sql", ROOT / "weave" / "sql"]

#: Cross-namespace statements that are allowed, by query name, with the reason.
ALLOW: dict[str, str] = {
    # Platform: retention cleanup deletes expired keys of every namespace, oldest first, in
    # bounded batches (orbit.idempotency.cleanup_once).
    "idempotency_delete_expired_batch": "idempotency retention cleanup over all namespaces",
    # Platform: the retention purge claims the most overdue namespace of any (index
    # ix_orbit_retention_due, SKIP LOCKED, LIMIT 1); its work is keyed by that namespace
    # (orbit.retention_purge).
    "retention_claim_due": "retention purge claim of one due namespace",
    # Pulse recovery: find expired leases / sessions / deadlines on every namespace, oldest
    # first, bounded; each found row is then changed by its (namespace_id, id) key.
    "attempt_list_expired": "recovery of attempts whose lease expired (pulse.recovery)",
    "session_list_expired": "recovery of worker sessions that stopped heartbeating",
    "task_expire_candidates": "WAITING tasks past their deadline (SKIP LOCKED sweep)",
    "deadline_stale_rows": "deadline rows of finished or purged tasks (the deadline sweep)",
    # Pulse scheduler: lock the most overdue unpaused schedule of any namespace (index
    # (paused, check_at), FOR UPDATE SKIP LOCKED, LIMIT 1); the work on it is keyed by
    # (namespace_id, id) (pulse.scheduler).
    "schedule_claim_due": "scheduler claim of one due schedule (pulse.scheduler)",
    # Weave timers: OPEN waits whose due_at passed, every namespace, SKIP LOCKED batches.
    "wait_claim_due": "weave due-timer scan (weave timer loop)",
    # Weave advancer: instances with due inbox events / resumed instances with deferred
    # advances, every namespace, oldest first, bounded, no locks; each instance is then locked
    # and advanced by its (namespace_id, id) key (weave.advancer).
    "inbox_scan_pending": "weave advancer scan of due inbox events (weave.advancer)",
    "pending_scan_resumable": "weave advancer scan of resumed instances' deferred advances",
    # /metrics queue depth: the background refresh reads the usage rows (one per queue) of
    # every namespace for the fullest queues, bounded by LIMIT (pulse.queue_gauges).
    "queue_depth_top": "metrics refresh of queue depth over all namespaces (pulse.queue_gauges)",
}

_CREATE = re.compile(
    r"CREATE\s+TABLE\s+(?:IF\s+NOT\s+EXISTS\s+)?`?(\w+)`?\s*\((.*?)\)\s*ENGINE", re.S | re.I
)
_PK = re.compile(r"PRIMARY\s+KEY\s*\(\s*`?namespace_id`?", re.I)


def runtime_tables(migrations: Path = ROOT / "migrations") -> set[str]:
    """Tables whose primary key leads with namespace_id."""
    out: set[str] = set()
    for path in sorted(migrations.glob("*.sql")):
        for m in _CREATE.finditer(path.read_text(encoding="utf-8")):
            if _PK.search(m.group(2)):
                out.add(m.group(1))
    return out


def known_queries(dirs: Iterable[Path] = SQL_DIRS) -> dict[str, str]:
    """SQL text → query name for every named query of every package."""
    out: dict[str, str] = {}
    for d in dirs:
        for path in sorted(d.glob("*.sql")) if d.exists() else []:
            for name, sql in parse_queries(path.read_text(encoding="utf-8"), str(path)).items():
                out[sql] = name
    return out


def _strip_comments(sql: str) -> str:
    # A node round's keys marker (orbit/storage/keys.py) becomes one namespace_id group per
    # namespace when the statement runs: it is a namespace predicate.
    sql = re.sub(r"/\*keys(?:\s+[\w.]+\s+[\w.]+)?\s*\*/", " namespace_id = ? ", sql)
    sql = re.sub(r"--[^\n]*", " ", sql)
    return re.sub(r"/\*.*?\*/", " ", sql, flags=re.S)


def violation(sql: str, tables: set[str]) -> str | None:
    """The runtime table ``sql`` touches without a namespace predicate, or None."""
    text = _strip_comments(sql)
    touched = [t for t in tables if re.search(rf"\b{t}\b", text)]
    if not touched:
        return None
    head = text.lstrip().split(None, 1)[0].upper() if text.strip() else ""
    if head in ("INSERT", "REPLACE"):
        return None if "namespace_id" in text else touched[0]
    where = re.split(r"\bWHERE\b", text, maxsplit=1, flags=re.I)
    on_clause = re.search(r"\bON\b[^;]*?namespace_id", where[0], flags=re.I)
    if len(where) == 2 and "namespace_id" in where[1]:
        return None
    if on_clause and len(where) == 2:
        return None
    return touched[0]


def violations(statements: Iterable[str]) -> list[tuple[str, str]]:
    """(query name or SQL excerpt, table) for every unguarded statement not in ALLOW."""
    tables = runtime_tables()
    names = known_queries()
    out: list[tuple[str, str]] = []
    for sql in sorted(set(statements)):
        table = violation(sql, tables)
        if table is None:
            continue
        name = names.get(sql)
        if name is not None and name in ALLOW:
            continue
        out.append((name or " ".join(sql.split())[:160], table))
    return out


class _DedupLog(list[str]):
    """A list that keeps each distinct statement once (``append`` is all Tx uses)."""

    def __init__(self) -> None:
        super().__init__()
        self._seen: set[str] = set()

    def append(self, sql: str) -> None:
        if sql not in self._seen:
            self._seen.add(sql)
            super().append(sql)


def pytest_configure(config: pytest.Config) -> None:
    if os.environ.get("ORBIT_SQL_GUARD", "1") != "0" and storage_db.STATEMENT_LOG is None:
        storage_db.STATEMENT_LOG = _DedupLog()
        shard_guard.install(known_queries())


def pytest_sessionfinish(session: pytest.Session, exitstatus: int) -> None:
    _shard_groups(session)
    log = storage_db.STATEMENT_LOG
    if not log:
        return
    found = violations(log)
    if not found:
        return
    reporter = session.config.pluginmanager.get_plugin("terminalreporter")
    lines = [
        "",
        "SQL guard: statements on runtime tables without a namespace_id predicate",
        "(add the predicate, or list a documented cross-namespace scan in tests/sql_guard.py ALLOW):",
        *(f"  {table}: {name}" for name, table in found),
    ]
    for line in lines:
        if reporter is not None:
            reporter.write_line(line, red=True)
        else:  # pragma: no cover
            print(line)
    session.exitstatus = pytest.ExitCode.TESTS_FAILED


def _shard_groups(session: pytest.Session) -> None:
    guard = shard_guard.GUARD
    if guard is None:
        return
    reporter = session.config.pluginmanager.get_plugin("terminalreporter")
    audit = shard_guard.lock_report(guard) if os.environ.get("ORBIT_LOCK_AUDIT") == "1" else []
    if not guard.violations and "ORBIT_SHARD_MAP" not in os.environ and not audit:
        return
    for line in ["", *shard_guard.report(guard), *audit]:
        if reporter is not None:
            reporter.write_line(line, red=bool(guard.violations))
        else:  # pragma: no cover
            print(line)
    if guard.violations:
        session.exitstatus = pytest.ExitCode.TESTS_FAILED
