"""The platform schema (migrations/0001_platform.sql) on a real MariaDB: immutable-history
triggers, every named CHECK, comments everywhere, zero foreign keys."""

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
    """One valid row per platform table (fresh ids every call)."""
    return {
        "orbit_applications": {
            "id": rid(), "name": f"a-{rid().hex()[:8]}", "status": "active", "revision": 1,
            "created_at": NOW, "updated_at": NOW,
        },
        "orbit_application_resources": {
            "application_id": rid(), "revision": 1, "created_at": NOW, "updated_at": NOW,
        },
        "orbit_namespaces": {
            "id": rid(), "application_id": rid(), "name": "ns", "revision": 1, "created_at": NOW,
        },
        "orbit_credentials": {
            "id": rid(), "application_id": rid(), "name": "k", "secret_digest": os.urandom(32),
            "namespaces": '["*"]', "actions": '["tasks.read"]', "queues": None, "global_admin": 0,
            "revision": 1, "created_at": NOW,
        },
        "orbit_idempotency_keys": {
            "namespace_id": rid(), "id": rid(), "operation": "op", "scope": "", "idem_key": "k",
            "request_digest": os.urandom(32), "response_status": 201, "response_body": "{}",
            "created_at": NOW, "expires_at": LATER,
        },
        "orbit_events": {
            "namespace_id": rid(), "id": rid(), "type": "task.accepted", "subject_kind": "task",
            "subject_id": rid(), "data": "{}", "created_at": NOW,
        },
        "orbit_retention": {
            "namespace_id": rid(), "finished_tasks_days": 30, "events_days": 30,
            "audit_days": 365, "idempotency_hours": 24, "revision": 1, "next_run_at": NOW,
            "created_at": NOW, "updated_at": NOW,
        },
        "orbit_event_batches": {
            "namespace_id": rid(), "id": rid(), "type": "task.accepted", "subject_kind": "task",
            "subjects": 1, "entries": '[{"subject_id": null, "data": {}}]', "created_at": NOW,
        },
        "orbit_event_streams": {"namespace_id": rid(), "last_seq": 0, "updated_at": NOW},
        "orbit_result_events": {
            "namespace_id": rid(), "seq": 1, "event_id": rid(), "type": "task.succeeded",
            "task_id": rid(), "queue": "q", "kind": "k", "owner_id": rid(), "state": "SUCCEEDED",
            "result": '{"ok": 1.50}', "error": None, "attempts": 1, "finished_at": NOW,
            "created_at": NOW,
        },
        "orbit_subscriptions": {
            "namespace_id": rid(), "id": rid(), "name": "s", "filter": "{}",
            "start_spec": '"earliest"', "ack_timeout_ms": 1000, "max_deliveries": 3,
            "max_in_flight": 10, "revision": 1, "created_at": NOW, "updated_at": NOW,
        },
        "orbit_deliveries": {
            "namespace_id": rid(), "id": rid(), "subscription_id": rid(), "seq": 1,
            "event_id": rid(), "state": "PENDING", "attempts": 0, "budget": 3, "next_at": NOW,
            "revision": 1, "created_at": NOW, "updated_at": NOW,
        },
        "orbit_delivery_ranges": {
            "namespace_id": rid(), "id": rid(), "subscription_id": rid(), "id_bucket": 7,
            "seq_lo": 1, "seq_hi": 2, "n": 2, "seqs": b"", "event_ids": b"", "delivery_ids": b"",
            "proof_digests": b"", "acked_us": b"", "moved": b"\x00", "open_n": 2, "acked_n": 0,
            "state": "LEASED", "budget": 3, "lease_expires_at": NOW, "revision": 1,
            "created_at": NOW, "updated_at": NOW,
        },
        "orbit_audit_events": {
            "namespace_id": bytes(16), "id": rid(), "action": "applications.create",
            "resource_kind": "application", "outcome": "ok", "status_code": 201,
            "created_at": NOW,
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


# (table, changes, constraint name pattern). JSON columns also carry MariaDB's implicit
# per-column JSON_VALID check, so the pattern accepts either name where both apply.
CHECKS: list[tuple[str, dict[str, Any], str]] = [
    ("orbit_applications", {"status": "deleted"}, "ck_orbit_applications_status"),
    ("orbit_applications", {"name": "has space"}, "ck_orbit_applications_name"),
    ("orbit_applications", {"revision": 0}, "ck_orbit_applications_revision"),
    (
        "orbit_application_resources",
        {"unfinished_tasks": -1},
        "ck_orbit_application_resources_usage",
    ),
    ("orbit_application_resources", {"window_starts": -1}, "ck_orbit_application_resources_usage"),
    ("orbit_application_resources", {"revision": 0}, "ck_orbit_application_resources_revision"),
    ("orbit_namespaces", {"name": ""}, "ck_orbit_namespaces_name"),
    ("orbit_namespaces", {"name": "a/b"}, "ck_orbit_namespaces_name"),
    ("orbit_namespaces", {"revision": 0}, "ck_orbit_namespaces_revision"),
    ("orbit_credentials", {"namespaces": "{}"}, "ck_orbit_credentials_namespaces"),
    ("orbit_credentials", {"actions": '"admin"'}, "ck_orbit_credentials_actions"),
    ("orbit_credentials", {"queues": "{}"}, "ck_orbit_credentials_queues"),
    ("orbit_credentials", {"global_admin": 2}, "ck_orbit_credentials_global_admin"),
    ("orbit_credentials", {"name": ""}, "ck_orbit_credentials_name"),
    ("orbit_credentials", {"revision": 0}, "ck_orbit_credentials_revision"),
    ("orbit_idempotency_keys", {"idem_key": ""}, "ck_orbit_idempotency_keys_key"),
    ("orbit_idempotency_keys", {"response_status": 700}, "ck_orbit_idempotency_keys_status"),
    ("orbit_idempotency_keys", {"response_body": None}, "ck_orbit_idempotency_keys_response"),
    ("orbit_idempotency_keys", {"expires_at": NOW}, "ck_orbit_idempotency_keys_expiry"),
    ("orbit_events", {"data": "not json"}, "ck_orbit_events_data|\\.data`"),
    ("orbit_retention", {"finished_tasks_days": 0}, "ck_orbit_retention_tasks"),
    ("orbit_retention", {"events_days": 0}, "ck_orbit_retention_events"),
    ("orbit_retention", {"audit_days": 6}, "ck_orbit_retention_audit"),
    ("orbit_retention", {"idempotency_hours": 721}, "ck_orbit_retention_idempotency"),
    ("orbit_retention", {"revision": 0}, "ck_orbit_retention_revision"),
    ("orbit_event_batches", {"entries": "not json"}, "ck_orbit_event_batches_entries"),
    ("orbit_event_batches", {"subjects": 0}, "ck_orbit_event_batches_subjects"),
    ("orbit_result_events", {"type": "task.exploded"}, "ck_orbit_result_events_type"),
    ("orbit_result_events", {"state": "RUNNING"}, "ck_orbit_result_events_state"),
    ("orbit_result_events", {"type": "task.failed"}, "ck_orbit_result_events_type_state"),
    ("orbit_result_events", {"result": "{bad"}, "ck_orbit_result_events_result"),
    ("orbit_result_events", {"error": "{bad"}, "ck_orbit_result_events_error|\\.error`"),
    ("orbit_result_events", {"seq": 0}, "ck_orbit_result_events_seq"),
    ("orbit_subscriptions", {"name": "bad name"}, "ck_orbit_subscriptions_name"),
    ("orbit_subscriptions", {"filter": "[]"}, "ck_orbit_subscriptions_filter"),
    ("orbit_subscriptions", {"start_spec": "{bad"}, "ck_orbit_subscriptions_start|\\.start_spec`"),
    ("orbit_subscriptions", {"max_in_flight": 0}, "ck_orbit_subscriptions_limits"),
    ("orbit_subscriptions", {"revision": 0}, "ck_orbit_subscriptions_revision"),
    ("orbit_deliveries", {"state": "LOST"}, "ck_orbit_deliveries_state"),
    ("orbit_deliveries", {"state": "ACKED"}, "ck_orbit_deliveries_acked"),
    ("orbit_deliveries", {"acked_at": NOW}, "ck_orbit_deliveries_acked"),
    ("orbit_deliveries", {"state": "LEASED"}, "ck_orbit_deliveries_leased"),
    ("orbit_deliveries", {"attempts": 4}, "ck_orbit_deliveries_budget"),
    ("orbit_deliveries", {"budget": 0}, "ck_orbit_deliveries_budget"),
    ("orbit_deliveries", {"revision": 0}, "ck_orbit_deliveries_revision"),
    ("orbit_delivery_ranges", {"state": "LOST"}, "ck_orbit_delivery_ranges_state"),
    ("orbit_delivery_ranges", {"open_n": 0}, "ck_orbit_delivery_ranges_counts"),
    ("orbit_delivery_ranges", {"acked_n": 1}, "ck_orbit_delivery_ranges_counts"),
    ("orbit_delivery_ranges", {"state": "DONE"}, "ck_orbit_delivery_ranges_counts"),
    ("orbit_delivery_ranges", {"seq_lo": 3}, "ck_orbit_delivery_ranges_seq"),
    ("orbit_delivery_ranges", {"budget": 0}, "ck_orbit_delivery_ranges_budget"),
    ("orbit_delivery_ranges", {"revision": 0}, "ck_orbit_delivery_ranges_revision"),
    ("orbit_audit_events", {"outcome": "maybe"}, "ck_orbit_audit_events_outcome"),
    ("orbit_audit_events", {"status_code": 42}, "ck_orbit_audit_events_status"),
    ("orbit_audit_events", {"details": "{bad"}, "ck_orbit_audit_events_details|\\.details`"),
]


@pytest.mark.parametrize(
    ("table", "changes", "constraint"),
    CHECKS,
    ids=[c[2].split("|")[0] + ":" + ",".join(c[1]) for c in CHECKS],
)
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
        key = "id" if "id" in row else next(iter(row))
        cur.execute(f"SELECT COUNT(*) FROM {table} WHERE {key} = %s", (row[key],))
        assert cur.fetchone()[0] == 0


def test_every_platform_check_is_exercised(conn: pymysql.connections.Connection) -> None:
    with conn.cursor() as cur:
        cur.execute(
            "SELECT CONSTRAINT_NAME FROM information_schema.TABLE_CONSTRAINTS"
            " WHERE CONSTRAINT_SCHEMA = DATABASE() AND CONSTRAINT_TYPE = 'CHECK'"
            " AND TABLE_NAME LIKE 'orbit\\_%%' AND CONSTRAINT_NAME LIKE 'ck\\_%%'"
            " AND TABLE_NAME NOT LIKE 'orbit\\_schema\\_%%'"  # orbit-migrate's bookkeeping
        )
        names = {r[0] for r in cur.fetchall()}
    tested = {c[2].split("|")[0] for c in CHECKS}
    assert names, "no named checks found"
    assert names <= tested, f"untested checks: {sorted(names - tested)}"


IMMUTABLE = ["orbit_event_batches", "orbit_events", "orbit_result_events", "orbit_audit_events"]


@pytest.mark.parametrize("table", IMMUTABLE)
def test_immutable_table_rejects_update_and_delete(
    conn: pymysql.connections.Connection, table: str
) -> None:
    row = base_rows()[table]
    insert(conn, table, row)
    key_col = next(iter(row))
    key = row[key_col]
    with conn.cursor() as cur:
        for sql in (
            f"UPDATE {table} SET created_at = %s WHERE {key_col} = %s",
            f"DELETE FROM {table} WHERE {key_col} = %s",
        ):
            args = (LATER, key) if sql.startswith("UPDATE") else (key,)
            with pytest.raises(pymysql.MySQLError) as info:
                cur.execute(sql, args)
            assert info.value.args[0] == 1644
            assert "is immutable" in str(info.value.args[1])
        cur.execute(f"SELECT created_at FROM {table} WHERE {key_col} = %s", (key,))
        assert cur.fetchone()[0] == NOW


def test_triggers_are_exactly_the_immutable_ones(conn: pymysql.connections.Connection) -> None:
    with conn.cursor() as cur:
        cur.execute(
            "SELECT EVENT_OBJECT_TABLE, EVENT_MANIPULATION, ACTION_TIMING FROM information_schema.TRIGGERS"
            " WHERE TRIGGER_SCHEMA = DATABASE() AND EVENT_OBJECT_TABLE LIKE 'orbit\\_%%'"
        )
        found = {(t, m, w) for t, m, w in cur.fetchall()}
    expected = {(t, m, "BEFORE") for t in IMMUTABLE for m in ("UPDATE", "DELETE")}
    # The delete triggers refuse through orbit_history_guard, whose insert trigger signals.
    expected.add(("orbit_history_guard", "INSERT", "BEFORE"))
    assert found == expected


def test_comments_everywhere_and_no_foreign_keys(conn: pymysql.connections.Connection) -> None:
    with conn.cursor() as cur:
        cur.execute(
            "SELECT TABLE_NAME FROM information_schema.TABLES WHERE TABLE_SCHEMA = DATABASE()"
            " AND TABLE_NAME LIKE 'orbit\\_%%' AND TABLE_NAME <> 'orbit_schema_migrations'"
            " AND TABLE_NAME NOT LIKE 'orbit\\_schema\\_%%' AND TABLE_COMMENT = ''"
        )
        assert cur.fetchall() == ()
        tables = ", ".join(f"'{t}'" for t in base_rows())
        cur.execute(
            "SELECT TABLE_NAME, COLUMN_NAME FROM information_schema.COLUMNS WHERE TABLE_SCHEMA = DATABASE()"
            f" AND TABLE_NAME IN ({tables}) AND COLUMN_COMMENT = ''"
        )
        assert cur.fetchall() == ()
        cur.execute(
            "SELECT COUNT(*) FROM information_schema.REFERENTIAL_CONSTRAINTS WHERE CONSTRAINT_SCHEMA = DATABASE()"
        )
        assert cur.fetchone()[0] == 0


def test_runtime_tables_lead_with_namespace_id(conn: pymysql.connections.Connection) -> None:
    runtime = [t for t in base_rows() if "namespace_id" in base_rows()[t]]
    with conn.cursor() as cur:
        for table in runtime:
            cur.execute(
                "SELECT COLUMN_NAME FROM information_schema.KEY_COLUMN_USAGE WHERE TABLE_SCHEMA = DATABASE()"
                " AND TABLE_NAME = %s AND CONSTRAINT_NAME = 'PRIMARY' ORDER BY ORDINAL_POSITION",
                (table,),
            )
            assert cur.fetchone()[0] == "namespace_id", table


def test_names_are_case_sensitive(conn: pymysql.connections.Connection) -> None:
    app = base_rows()["orbit_applications"]
    name = "Case-" + os.urandom(4).hex()
    insert(conn, "orbit_applications", {**app, "name": name})
    insert(conn, "orbit_applications", {**base_rows()["orbit_applications"], "name": name.lower()})
    with pytest.raises(pymysql.err.IntegrityError):
        insert(conn, "orbit_applications", {**base_rows()["orbit_applications"], "name": name})
