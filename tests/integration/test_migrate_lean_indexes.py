"""Migration 0018 (the lean write path) on a database that already holds tasks: the
identities of the tasks with a dedup key and the deadlines of the unfinished tasks with one
are backfilled into their sparse tables, and the dropped indexes are gone."""

from __future__ import annotations

import os
import shutil
from datetime import datetime, timedelta
from pathlib import Path
from typing import Any

import pymysql

from orbit import migrate
from orbit.migrate import default_migrations_dir
from orbit.storage.dsn import DSN

NOW = datetime(2026, 1, 1, 12, 0, 0, 123456)


def _task(ns: bytes, owner: bytes, **over: Any) -> dict[str, Any]:
    row: dict[str, Any] = {
        "namespace_id": ns, "id": os.urandom(16), "owner_id": owner, "queue_id": os.urandom(16),
        "queue_name": "q", "kind": "k", "payload": "{}", "available_at": NOW,
        "max_attempts": 3, "retry_backoff_initial_ms": 100, "retry_backoff_max_ms": 1000,
        "retry_backoff_multiplier": 2.0, "state": "WAITING", "created_at": NOW,
        "state_changed_at": NOW,
    }  # fmt: skip
    row.update(over)
    return row


def test_0018_backfills_identities_and_deadlines(empty_db: DSN, tmp_path: Path) -> None:
    src = default_migrations_dir()
    before = tmp_path / "before"
    before.mkdir()
    for f in sorted(src.glob("*.sql")):
        if f.name < "0018":
            shutil.copy(f, before / f.name)
    migrate.up(empty_db, before)
    ns, owner = os.urandom(16), os.urandom(16)
    deadline = NOW + timedelta(hours=1)
    rows = {
        "plain": _task(ns, owner),
        "dedup": _task(ns, owner, dedup_key="d-1", pipeline_version="v1"),
        "timed": _task(ns, owner, deadline_at=deadline),
        "done": _task(
            ns, owner, deadline_at=deadline, dedup_key="d-2", state="SUCCEEDED", finished_at=NOW
        ),
    }
    conn = pymysql.connect(autocommit=True, charset="utf8mb4", **empty_db.connect_kwargs())
    try:
        with conn.cursor() as cur:
            for row in rows.values():
                cols = ", ".join(row)
                marks = ", ".join(["%s"] * len(row))
                cur.execute(f"INSERT INTO pulse_tasks ({cols}) VALUES ({marks})", list(row.values()))
        migrate.up(empty_db, src)
        with conn.cursor() as cur:
            cur.execute(
                "SELECT owner_id, kind, pipeline_version, dedup_key, task_id"
                " FROM pulse_task_identities WHERE namespace_id = %s ORDER BY dedup_key",
                (ns,),
            )
            assert cur.fetchall() == (
                (owner, "k", "v1", "d-1", rows["dedup"]["id"]),
                (owner, "k", "", "d-2", rows["done"]["id"]),
            )
            cur.execute(
                "SELECT task_id, deadline_at FROM pulse_task_deadlines WHERE namespace_id = %s",
                (ns,),
            )
            assert cur.fetchall() == ((rows["timed"]["id"], deadline),)
            cur.execute(
                "SELECT INDEX_NAME FROM information_schema.STATISTICS WHERE TABLE_SCHEMA ="
                " DATABASE() AND TABLE_NAME = 'pulse_tasks' AND INDEX_NAME <> 'PRIMARY'"
            )
            assert {r[0] for r in cur.fetchall()} == {
                "ix_pulse_tasks_fair", "ix_pulse_tasks_state_age", "ix_pulse_tasks_created",
            }  # fmt: skip
            cur.execute(
                "SELECT COUNT(*) FROM information_schema.COLUMNS WHERE TABLE_SCHEMA = DATABASE()"
                " AND TABLE_NAME = 'pulse_tasks' AND COLUMN_NAME = 'deadline_due'"
            )
            assert cur.fetchone() == (0,)
    finally:
        conn.close()
