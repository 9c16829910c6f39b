"""The Pulse schema (migrations/0002_pulse.sql and later) on a real MariaDB: every named CHECK
rejects a bad row, the immutable-history triggers, the task identity key, the secondary indexes
of pulse_tasks, comments, zero foreign keys."""

from __future__ import annotations

import os
import re
from collections.abc import Iterator
from datetime import datetime, timedelta
from typing import Any

import pymysql
import pytest

from orbit.storage import DSN

NOW = datetime(2026, 1, 1, 12, 0, 0, 123456)
LATER = NOW + timedelta(days=1)


@pytest.fixture(scope="module")
def conn(dsn: DSN) -> Iterator[pymysql.connections.Connection]:
    c = pymysql.connect(autocommit=True, charset="utf8mb4", **dsn.connect_kwargs())
    try:
        yield c
    finally:
        c.close()


def rid() -> bytes:
    return os.urandom(16)


def base_rows() -> dict[str, dict[str, Any]]:
    """One valid row per Pulse table with CHECKs or triggers (fresh ids every call)."""
    return {
        "pulse_queues": {
            "namespace_id": rid(), "id": rid(), "name": "q", "created_at": NOW, "updated_at": NOW,
        },
        "pulse_worker_sessions": {
            "namespace_id": rid(), "id": rid(), "instance_id": rid(), "application_id": rid(),
            "credential_id": rid(), "token_digest": os.urandom(32), "queues": '["q"]',
            "max_concurrency": 4, "heartbeat_ms": 1000, "lease_ms": 3000, "expires_at": LATER,
            "created_at": NOW,
        },
        "pulse_tasks": {
            "namespace_id": rid(), "id": rid(), "owner_id": rid(), "queue_id": rid(),
            "queue_name": "q", "kind": "k", "payload": '{"n": 1.50}', "priority": 5,
            "available_at": NOW, "max_attempts": 3, "retry_backoff_initial_ms": 100,
            "retry_backoff_max_ms": 1000, "retry_backoff_multiplier": 2.0, "state": "WAITING",
            "created_at": NOW, "state_changed_at": NOW,
        },
        "pulse_attempts": {
            "namespace_id": rid(), "id": rid(), "task_id": rid(), "generation": 1,
            "session_id": rid(), "state": "OFFERED", "lease_expires_at": LATER, "offered_at": NOW,
        },
        "pulse_attempt_evidence": {
            "namespace_id": rid(), "id": rid(), "attempt_id": rid(), "task_id": rid(),
            "kind": "lost", "created_at": NOW,
        },
        "pulse_effects": {
            "namespace_id": rid(), "id": rid(), "task_id": rid(), "effect_key": "e",
            "key_digest": os.urandom(32), "state": "BEGUN", "attempt_id": rid(), "generation": 1,
            "begun_at": NOW,
        },
        "pulse_concurrency_limits": {
            "namespace_id": rid(), "id": rid(), "key_digest": os.urandom(32),
            "concurrency_key": "k", "updated_at": NOW,
        },
        "pulse_schedule_versions": {
            "namespace_id": rid(), "id": rid(), "schedule_id": rid(), "version": 1,
            "queue_name": "q", "cron": "*/5 * * * *", "every_ms": None, "timezone": "UTC",
            "tzdata_version": "2026.1", "task_kind": "k", "task_payload": "{}", "created_at": NOW,
        },
        "pulse_schedule_occurrences": {
            "namespace_id": rid(), "id": rid(), "schedule_id": rid(), "fire_at": NOW,
            "fire_at_local": "2026-01-01T12:00:00+00:00", "version": 1, "task_id": rid(),
            "outcome": "created", "created_at": NOW,
        },
    }  # fmt: skip


def insert(conn: pymysql.connections.Connection, table: str, row: dict[str, Any]) -> None:
    cols = ", ".join(row)
    marks = ", ".join(["%s"] * len(row))
    with conn.cursor() as cur:
        cur.execute(f"INSERT INTO {table} ({cols}) VALUES ({marks})", list(row.values()))


def test_every_base_row_is_valid(conn: pymysql.connections.Connection) -> None:
    for table, row in base_rows().items():
        insert(conn, table, row)


#: (table, changes that break exactly one rule, constraint name). A LEASED task needs a lease.
CHECKS: list[tuple[str, dict[str, Any], str]] = [
    ("pulse_queues", {"lease_ms": 10}, "ck_pulse_queues_lease"),
    ("pulse_queues", {"retry_max_attempts": 0}, "ck_pulse_queues_attempts"),
    ("pulse_queues", {"retry_backoff_multiplier": 0.5}, "ck_pulse_queues_multiplier"),
    ("pulse_queues", {"retry_bound_min_ms": 10, "retry_bound_max_ms": 5},
     "ck_pulse_queues_retry_bounds"),
    ("pulse_queues", {"retry_bound_multiplier_max": 0.5},
     "ck_pulse_queues_retry_bound_multiplier"),
    ("pulse_worker_sessions", {"state": "CLOSED"}, "ck_pulse_worker_sessions_closed"),
    ("pulse_worker_sessions", {"max_concurrency": 0}, "ck_pulse_worker_sessions_concurrency"),
    ("pulse_tasks", {"priority": 10}, "ck_pulse_tasks_priority"),
    ("pulse_tasks", {"payload": "{not json"}, "ck_pulse_tasks_payload_json"),
    ("pulse_tasks", {"result": "[1,"}, "ck_pulse_tasks_result_json"),
    ("pulse_tasks", {"state": "SUCCEEDED"}, "ck_pulse_tasks_terminal_finished"),
    ("pulse_tasks", {"lease_expires_at": LATER}, "ck_pulse_tasks_waiting_no_lease"),
    ("pulse_tasks", {"state": "RUNNING"}, "ck_pulse_tasks_held_has_lease"),
    (
        "pulse_tasks",
        {"state": "FAILED", "finished_at": NOW, "effect_uncertain": 1},
        "ck_pulse_tasks_uncertain",
    ),
    ("pulse_tasks", {"max_attempts": 0}, "ck_pulse_tasks_max_attempts"),
    ("pulse_tasks", {"concurrency_key": "k"}, "ck_pulse_tasks_key_digest"),
    ("pulse_attempts", {"retryable": 1}, "ck_pulse_attempts_retryable"),
    ("pulse_attempts", {"state": "RUNNING"}, "ck_pulse_attempts_running_token"),
    ("pulse_attempts", {"state": "SUCCEEDED"}, "ck_pulse_attempts_finished"),
    ("pulse_attempts", {"result": "nope"}, "ck_pulse_attempts_result_json"),
    ("pulse_attempts", {"receipt_id": b"r" * 16}, "ck_pulse_attempts_receipt"),
    ("pulse_attempt_evidence", {"result": "{"}, "ck_pulse_attempt_evidence_result_json"),
    ("pulse_effects", {"state": "COMMITTED"}, "ck_pulse_effects_committed"),
    ("pulse_effects", {"result": "]"}, "ck_pulse_effects_result_json"),
    ("pulse_concurrency_limits", {"held": 2}, "ck_pulse_concurrency_limits_held"),
    (
        "pulse_concurrency_limits",
        {"grant_revision": 18446744073709551615},
        "ck_pulse_concurrency_limits_nowrap",
    ),
    ("pulse_schedule_versions", {"every_ms": 60000}, "ck_pulse_schedule_versions_spec"),
    ("pulse_schedule_versions", {"cron": None, "every_ms": 10}, "ck_pulse_schedule_versions_every"),
    ("pulse_schedule_versions", {"task_payload": "{"}, "ck_pulse_schedule_versions_payload_json"),
    ("pulse_schedule_versions", {"task_priority": 11}, "ck_pulse_schedule_versions_priority"),
    ("pulse_schedule_occurrences", {"task_id": None}, "ck_pulse_schedule_occurrences_task"),
]


@pytest.mark.parametrize(("table", "changes", "constraint"), CHECKS, ids=[c[2] for c in CHECKS])
def test_check_rejects_bad_row(
    conn: pymysql.connections.Connection, table: str, changes: dict[str, Any], constraint: str
) -> None:
    row = {**base_rows()[table], **changes}
    with pytest.raises(pymysql.MySQLError) as info:
        insert(conn, table, row)
    code, message = info.value.args[0], str(info.value.args[1])
    assert code in (4025, 3819), message
    assert re.search(constraint, message), message
    with conn.cursor() as cur:
        cur.execute(f"SELECT COUNT(*) FROM {table} WHERE id = %s", (row["id"],))
        assert cur.fetchone()[0] == 0


def test_every_pulse_check_is_exercised(conn: pymysql.connections.Connection) -> None:
    with conn.cursor() as cur:
        cur.execute(
            "SELECT CONSTRAINT_NAME FROM information_schema.TABLE_CONSTRAINTS"
            " WHERE CONSTRAINT_SCHEMA = DATABASE() AND CONSTRAINT_TYPE = 'CHECK'"
            " AND TABLE_NAME LIKE 'pulse\\_%%' AND CONSTRAINT_NAME LIKE 'ck\\_%%'"
        )
        names = {r[0] for r in cur.fetchall()}
    tested = {c[2] for c in CHECKS}
    assert names, "no named checks found"
    assert names <= tested, f"untested checks: {sorted(names - tested)}"


IMMUTABLE = ["pulse_attempt_evidence", "pulse_schedule_versions"]


@pytest.mark.parametrize("table", IMMUTABLE)
def test_immutable_table_rejects_update_and_delete(
    conn: pymysql.connections.Connection, table: str
) -> None:
    row = base_rows()[table]
    insert(conn, table, row)
    with conn.cursor() as cur:
        with pytest.raises(pymysql.MySQLError) as info:
            cur.execute(f"UPDATE {table} SET created_at = %s WHERE id = %s", (LATER, row["id"]))
        assert info.value.args[0] == 1644 and f"{table} is immutable" in str(info.value.args[1])
        with pytest.raises(pymysql.MySQLError) as info:
            cur.execute(f"DELETE FROM {table} WHERE id = %s", (row["id"],))
        assert info.value.args[0] == 1644
        cur.execute(f"SELECT created_at FROM {table} WHERE id = %s", (row["id"],))
        assert cur.fetchone()[0] == NOW


def test_triggers_are_exactly_the_immutable_ones(conn: pymysql.connections.Connection) -> None:
    with conn.cursor() as cur:
        cur.execute(
            "SELECT EVENT_OBJECT_TABLE, EVENT_MANIPULATION, ACTION_TIMING FROM information_schema.TRIGGERS"
            " WHERE TRIGGER_SCHEMA = DATABASE() AND EVENT_OBJECT_TABLE LIKE 'pulse\\_%%'"
        )
        found = set(cur.fetchall())
    assert found == {(t, m, "BEFORE") for t in IMMUTABLE for m in ("UPDATE", "DELETE")}


def test_identity_is_the_primary_key_of_pulse_task_identities(
    conn: pymysql.connections.Connection,
) -> None:
    """A task's identity (owner, kind, pipeline_version, dedup_key) is unique per namespace:
    the primary key of pulse_task_identities (migration 0018), where only tasks with a dedup
    key have a row; pulse_tasks itself has no unique key besides its primary key."""
    base = base_rows()["pulse_tasks"]
    for _ in range(3):  # NULL dedup_key: no identity row, never collides
        insert(conn, "pulse_tasks", {**base, "id": rid(), "dedup_key": None})
    for _ in range(2):  # the tasks' table does not refuse an equal identity by itself
        insert(conn, "pulse_tasks", {**base, "id": rid(), "dedup_key": "d-1"})
    ident = {k: base[k] for k in ("namespace_id", "owner_id", "kind")}
    ident |= {"pipeline_version": "", "dedup_key": "d-1", "task_id": rid()}
    insert(conn, "pulse_task_identities", ident)
    with pytest.raises(pymysql.err.IntegrityError) as info:
        insert(conn, "pulse_task_identities", {**ident, "task_id": rid()})
    assert info.value.args[0] == 1062 and "PRIMARY" in str(info.value.args[1])
    # The identity is per owner and per pipeline_version: these are new identities.
    insert(conn, "pulse_task_identities", {**ident, "owner_id": rid()})
    insert(conn, "pulse_task_identities", {**ident, "pipeline_version": "v2"})
    with conn.cursor() as cur:
        cur.execute(
            "SELECT INDEX_NAME FROM information_schema.STATISTICS WHERE TABLE_SCHEMA = DATABASE()"
            " AND TABLE_NAME = 'pulse_tasks' AND NON_UNIQUE = 0"
        )
        assert {r[0] for r in cur.fetchall()} == {"PRIMARY"}


def test_pulse_tasks_keeps_three_secondary_indexes(conn: pymysql.connections.Connection) -> None:
    """The lean write path (migration 0018): every secondary index of pulse_tasks is written
    at each insert, and each one holding ``state`` at each state change."""
    with conn.cursor() as cur:
        cur.execute(
            "SELECT INDEX_NAME, GROUP_CONCAT(COLUMN_NAME ORDER BY SEQ_IN_INDEX)"
            " FROM information_schema.STATISTICS WHERE TABLE_SCHEMA = DATABASE()"
            " AND TABLE_NAME = 'pulse_tasks' AND INDEX_NAME <> 'PRIMARY' GROUP BY INDEX_NAME"
        )
        assert dict(cur.fetchall()) == {
            "ix_pulse_tasks_fair": "namespace_id,queue_id,state,fair_subject,dispatch_at,id",
            "ix_pulse_tasks_state_age": "namespace_id,state,state_changed_at",
            "ix_pulse_tasks_created": "namespace_id,created_at,id",
        }


def test_dispatch_at_is_available_at_minus_priority_steps(
    conn: pymysql.connections.Connection,
) -> None:
    row = {**base_rows()["pulse_tasks"], "priority": 9}
    insert(conn, "pulse_tasks", row)
    with conn.cursor() as cur:
        cur.execute(
            "SELECT dispatch_at FROM pulse_tasks WHERE namespace_id = %s AND id = %s",
            (row["namespace_id"], row["id"]),
        )
        assert cur.fetchone()[0] == NOW - timedelta(seconds=270)


def test_comments_everywhere_keys_and_no_foreign_keys(conn: pymysql.connections.Connection) -> None:
    with conn.cursor() as cur:
        cur.execute(
            "SELECT TABLE_NAME FROM information_schema.TABLES WHERE TABLE_SCHEMA = DATABASE()"
            " AND TABLE_NAME LIKE 'pulse\\_%%' AND TABLE_COMMENT = ''"
        )
        assert cur.fetchall() == ()
        cur.execute(
            "SELECT TABLE_NAME, COLUMN_NAME FROM information_schema.COLUMNS"
            " WHERE TABLE_SCHEMA = DATABASE() AND TABLE_NAME LIKE 'pulse\\_%%' AND COLUMN_COMMENT = ''"
        )
        assert cur.fetchall() == ()
        cur.execute(
            "SELECT TABLE_NAME, GROUP_CONCAT(COLUMN_NAME ORDER BY SEQ_IN_INDEX) FROM"
            " information_schema.STATISTICS WHERE TABLE_SCHEMA = DATABASE()"
            " AND TABLE_NAME LIKE 'pulse\\_%%' AND INDEX_NAME = 'PRIMARY' GROUP BY TABLE_NAME"
        )
        for table, cols in cur.fetchall():
            assert cols.startswith("namespace_id,"), (table, cols)
        cur.execute(
            "SELECT COUNT(*) FROM information_schema.REFERENTIAL_CONSTRAINTS"
            " WHERE CONSTRAINT_SCHEMA = DATABASE()"
        )
        assert cur.fetchone()[0] == 0
