"""0003_weave.sql on a real MariaDB: it applies, every CHECK rejects a bad row, immutable tables
reject UPDATE and DELETE, and the unique indexes de-duplicate what they must."""

from __future__ import annotations

import os
from datetime import datetime
from typing import Any

import pytest

from orbit.storage import Database, DuplicateKey, Tx
from orbit.storage.errors import CHECK_VIOLATED, TRIGGER_SIGNAL, error_code

NOW = datetime(2026, 1, 2, 3, 4, 5, 123456)


def rid() -> bytes:
    return os.urandom(16)


def base_rows() -> dict[str, dict[str, Any]]:
    """One valid row per weave table (fresh ids each call)."""
    ns = rid()
    return {
        "weave_definitions": {
            "namespace_id": ns, "id": rid(), "name": f"wf-{rid().hex()[:8]}", "owner_id": rid(),
            "latest_version": 1, "revision": 1, "created_at": NOW, "updated_at": NOW,
        },
        "weave_definition_versions": {
            "namespace_id": ns, "id": rid(), "definition_id": rid(), "version": 1,
            "definition": '{"steps": [{"id": "a", "type": "succeed"}]}', "definition_digest": os.urandom(32),
            "language_version": 1, "step_count": 1, "published_by": None, "created_at": NOW,
        },
        "weave_instances": {
            "namespace_id": ns, "id": rid(), "owner_id": rid(), "definition_id": rid(),
            "definition_name": "wf", "version": 1, "business_key": None, "input": '{"a": 1.50}',
            "output": None, "error": None, "state": "RUNNING", "paused": 0, "control_revision": 1,
            "history_seq": 0, "created_by": None, "revision": 1, "created_at": NOW, "updated_at": NOW,
            "finished_at": None,
        },
        "weave_steps": {
            "namespace_id": ns, "id": rid(), "instance_id": rid(), "step_path": "a", "step_type": "task",
            "state": "RUNNING", "next_step": None, "activations": 0, "output": None, "error": None,
            "seq": 1, "started_at": NOW, "finished_at": None, "revision": 1,
        },
        "weave_activations": {
            "namespace_id": ns, "id": rid(), "instance_id": rid(), "step_path": "a", "activation_no": 1,
            "kind": "task", "task_id": rid(), "state": "RUNNING", "result": None, "error": None,
            "condition_met": None, "seq": 1, "started_at": NOW, "finished_at": None, "revision": 1,
        },
        "weave_waits": {
            "namespace_id": ns, "id": rid(), "instance_id": rid(), "step_path": "w", "activation_id": None,
            "kind": "signal", "signal_name": "go", "correlation_key": None, "due_at": None, "state": "OPEN",
            "signal_row_id": None, "notified_at": None, "seq": 1, "created_at": NOW, "resolved_at": None,
            "revision": 1,
        },
        "weave_signals": {
            "namespace_id": ns, "id": rid(), "instance_id": rid(), "signal_id": "sig-1", "name": "go",
            "correlation_key": None, "payload": "{}", "request_digest": os.urandom(32),
            "matched_wait_id": None, "matched_at": None, "sent_by": None, "received_at": NOW, "revision": 1,
        },
        "weave_poll_states": {
            "namespace_id": ns, "id": rid(), "instance_id": rid(), "step_path": "p", "state": "ACTIVE",
            "rounds_started": 0, "rounds_completed": 0, "max_rounds": 3, "max_attempts": 1, "interval_ms": 0,
            "deadline_at": None, "next_round_at": None, "current_activation_id": None, "last_result": None,
            "exhausted_reason": None, "started_at": NOW, "finished_at": None, "revision": 1,
        },
        "weave_poll_rounds": {
            "namespace_id": ns, "id": rid(), "poll_state_id": rid(), "instance_id": rid(), "step_path": "p",
            "round_no": 1, "activation_id": rid(), "task_id": rid(), "outcome": "not_met", "result": "{}",
            "error": None, "evaluated_at": NOW,
        },
        "weave_inbox": {
            "namespace_id": ns, "id": rid(), "instance_id": rid(), "kind": "task_finished",
            "source_event_id": rid(), "step_path": None, "payload": None, "data": None, "available_at": NOW,
            "attempts": 0, "last_error": None, "processed_at": None, "outcome": None, "created_at": NOW,
            "revision": 1,
        },
        "weave_pending_advances": {
            "namespace_id": ns, "id": rid(), "instance_id": rid(), "inbox_id": rid(), "reason": "paused",
            "checkpoint": None, "control_revision": 1, "state": "PENDING", "created_at": NOW,
            "resolved_at": None, "revision": 1,
        },
    }  # fmt: skip


# (table, check name, overrides that break exactly that check)
BAD_ROWS: list[tuple[str, str, dict[str, Any]]] = [
    ("weave_definitions", "name", {"name": "bad name"}),
    ("weave_definitions", "latest_version", {"latest_version": 0}),
    ("weave_definitions", "revision", {"revision": 0}),
    ("weave_definition_versions", "version", {"version": 0}),
    ("weave_definition_versions", "json", {"definition": "[1, 2]"}),
    ("weave_definition_versions", "steps", {"step_count": 0}),
    ("weave_definition_versions", "language", {"language_version": 0}),
    ("weave_instances", "state", {"state": "DONE", "finished_at": NOW}),
    ("weave_instances", "finished", {"finished_at": NOW}),
    ("weave_instances", "finished", {"state": "CANCELLED"}),
    ("weave_instances", "output", {"output": "{}"}),
    ("weave_instances", "output", {"state": "SUCCEEDED", "finished_at": NOW}),
    ("weave_instances", "failed_error", {"state": "FAILED", "finished_at": NOW}),
    ("weave_instances", "paused", {"paused": 2}),
    ("weave_instances", "paused_running", {"state": "CANCELLED", "finished_at": NOW, "paused": 1}),
    ("weave_instances", "input_json", {"input": "{nope"}),
    (
        "weave_instances",
        "output_json",
        {"state": "SUCCEEDED", "finished_at": NOW, "output": "{nope"},
    ),
    ("weave_instances", "error_json", {"error": "{nope"}),
    ("weave_instances", "business_key", {"business_key": ""}),
    ("weave_instances", "version", {"version": 0}),
    ("weave_instances", "revision", {"control_revision": 0}),
    ("weave_steps", "type", {"step_type": "loop"}),
    ("weave_steps", "state", {"state": "WAITING", "finished_at": NOW}),
    ("weave_steps", "finished", {"finished_at": NOW}),
    ("weave_steps", "output_json", {"output": "{nope"}),
    ("weave_steps", "error_json", {"error": "{nope"}),
    ("weave_steps", "path", {"step_path": ""}),
    ("weave_steps", "seq", {"seq": 0}),
    ("weave_steps", "revision", {"revision": 0}),
    ("weave_activations", "kind", {"kind": "loop", "task_id": None}),
    ("weave_activations", "state", {"state": "WAITING", "finished_at": NOW}),
    ("weave_activations", "finished", {"state": "SUCCEEDED"}),
    ("weave_activations", "task_link", {"task_id": None}),
    ("weave_activations", "task_link", {"kind": "timer"}),
    ("weave_activations", "condition", {"condition_met": 1}),
    ("weave_activations", "result_json", {"result": "{nope"}),
    ("weave_activations", "error_json", {"error": "{nope"}),
    ("weave_activations", "number", {"activation_no": 0}),
    ("weave_activations", "revision", {"revision": 0}),
    ("weave_waits", "kind", {"kind": "loop", "signal_name": None, "due_at": NOW}),
    ("weave_waits", "state", {"state": "DONE", "resolved_at": NOW}),
    ("weave_waits", "signal_name", {"signal_name": None}),
    ("weave_waits", "signal_name_rule", {"signal_name": "bad name"}),
    (
        "weave_waits",
        "correlation",
        {"kind": "sleep", "signal_name": None, "due_at": NOW, "correlation_key": "k"},
    ),
    ("weave_waits", "timer_due", {"kind": "sleep", "signal_name": None}),
    ("weave_waits", "matched", {"state": "MATCHED", "resolved_at": NOW}),
    (
        "weave_waits",
        "matched_kind",
        {
            "kind": "sleep",
            "signal_name": None,
            "due_at": NOW,
            "state": "MATCHED",
            "signal_row_id": rid(),
            "resolved_at": NOW,
        },
    ),
    ("weave_waits", "fired_due", {"state": "FIRED", "resolved_at": NOW}),
    ("weave_waits", "resolved", {"resolved_at": NOW}),
    ("weave_waits", "seq", {"seq": 0}),
    ("weave_waits", "revision", {"revision": 0}),
    ("weave_signals", "name", {"name": "bad name"}),
    ("weave_signals", "signal_id", {"signal_id": ""}),
    ("weave_signals", "payload_json", {"payload": "{nope"}),
    ("weave_signals", "matched", {"matched_wait_id": rid()}),
    ("weave_signals", "revision", {"revision": 0}),
    ("weave_poll_states", "state", {"state": "DONE", "finished_at": NOW}),
    ("weave_poll_states", "budget", {"max_attempts": 0}),
    ("weave_poll_states", "rounds", {"rounds_completed": 1}),
    ("weave_poll_states", "rounds", {"rounds_started": 4, "rounds_completed": 4}),
    ("weave_poll_states", "finished", {"finished_at": NOW}),
    ("weave_poll_states", "exhausted", {"state": "EXHAUSTED", "finished_at": NOW}),
    (
        "weave_poll_states",
        "reason",
        {"state": "EXHAUSTED", "finished_at": NOW, "exhausted_reason": "bored"},
    ),
    ("weave_poll_states", "result_json", {"last_result": "{nope"}),
    ("weave_poll_states", "revision", {"revision": 0}),
    ("weave_poll_rounds", "outcome", {"outcome": "maybe"}),
    ("weave_poll_rounds", "failed_error", {"outcome": "failed"}),
    ("weave_poll_rounds", "failed_error", {"error": '{"code": "x"}'}),
    ("weave_poll_rounds", "result_json", {"result": "{nope"}),
    ("weave_poll_rounds", "error_json", {"outcome": "failed", "error": "{nope"}),
    ("weave_poll_rounds", "round", {"round_no": 0}),
    ("weave_inbox", "kind", {"kind": "tick"}),
    ("weave_inbox", "outcome", {"processed_at": NOW, "outcome": "maybe"}),
    ("weave_inbox", "processed", {"processed_at": NOW}),
    ("weave_inbox", "payload_json", {"payload": "{nope"}),
    ("weave_inbox", "data_json", {"data": "{nope"}),
    ("weave_inbox", "last_error_json", {"last_error": "{nope"}),
    ("weave_inbox", "revision", {"revision": 0}),
    ("weave_pending_advances", "reason", {"reason": "whim"}),
    ("weave_pending_advances", "state", {"state": "LOST", "resolved_at": NOW}),
    ("weave_pending_advances", "resolved", {"resolved_at": NOW}),
    ("weave_pending_advances", "paused_inbox", {"inbox_id": None}),
    ("weave_pending_advances", "checkpoint_json", {"checkpoint": "{nope"}),
    ("weave_pending_advances", "revision", {"control_revision": 0}),
]

#: JSON-typed columns: MariaDB adds its own CHECK (json_valid(col)), reported as
#: `table.column`, which fires before ours (MySQL has no such check, so ours is the guard).
JSON_COLUMNS = {"error", "data", "last_error", "checkpoint"}


async def insert(db: Database, table: str, row: dict[str, Any]) -> None:
    cols = ", ".join(row)
    vals = ", ".join(f"%({c})s" for c in row)

    async def run(tx: Tx) -> None:
        await tx.execute(f"INSERT INTO {table} ({cols}) VALUES ({vals})", row)

    await db.transaction(run)


async def run_sql(db: Database, sql: str, args: Any = None) -> int:
    async def run(tx: Tx) -> int:
        return await tx.execute(sql, args)

    return await db.transaction(run)


async def test_schema_applies_with_comments_names_and_no_foreign_keys(db: Database) -> None:
    tables = await db.fetchall(
        "SELECT TABLE_NAME, TABLE_COMMENT, TABLE_COLLATION FROM information_schema.TABLES"
        " WHERE TABLE_SCHEMA = DATABASE() AND TABLE_NAME LIKE 'weave\\_%%'"
    )
    names = {t["TABLE_NAME"] for t in tables}
    assert names == set(base_rows())
    for t in tables:
        assert t["TABLE_COMMENT"], t["TABLE_NAME"]
        assert t["TABLE_COLLATION"] == "utf8mb4_bin", t["TABLE_NAME"]
    uncommented = await db.fetchall(
        "SELECT TABLE_NAME, COLUMN_NAME FROM information_schema.COLUMNS WHERE TABLE_SCHEMA = DATABASE()"
        " AND TABLE_NAME LIKE 'weave\\_%%' AND COLUMN_COMMENT = ''"
    )
    assert uncommented == []
    fks = await db.fetchone(
        "SELECT COUNT(*) AS n FROM information_schema.REFERENTIAL_CONSTRAINTS WHERE CONSTRAINT_SCHEMA = DATABASE()"
    )
    assert fks is not None and fks["n"] == 0
    pks = await db.fetchall(
        "SELECT TABLE_NAME, GROUP_CONCAT(COLUMN_NAME ORDER BY ORDINAL_POSITION) AS cols"
        " FROM information_schema.KEY_COLUMN_USAGE WHERE TABLE_SCHEMA = DATABASE()"
        " AND TABLE_NAME LIKE 'weave\\_%%' AND CONSTRAINT_NAME = 'PRIMARY' GROUP BY TABLE_NAME"
    )
    assert {p["cols"] for p in pks} == {"namespace_id,id"}
    ids = await db.fetchall(
        "SELECT TABLE_NAME, COLUMN_NAME, COLUMN_TYPE FROM information_schema.COLUMNS WHERE TABLE_SCHEMA = DATABASE()"
        " AND TABLE_NAME LIKE 'weave\\_%%' AND (COLUMN_NAME = 'id' OR COLUMN_NAME LIKE '%%\\_id')"
        " AND COLUMN_NAME NOT IN ('signal_id', 'source_event_id')"
    )
    assert {(c["COLUMN_TYPE"]) for c in ids} == {"binary(16)"}
    times = await db.fetchall(
        "SELECT DISTINCT COLUMN_TYPE FROM information_schema.COLUMNS WHERE TABLE_SCHEMA = DATABASE()"
        " AND TABLE_NAME LIKE 'weave\\_%%' AND COLUMN_NAME LIKE '%%\\_at'"
    )
    assert [t["COLUMN_TYPE"] for t in times] == ["datetime(6)"]


async def test_every_check_constraint_has_a_bad_row_case(db: Database) -> None:
    rows = await db.fetchall(
        "SELECT CONSTRAINT_NAME FROM information_schema.CHECK_CONSTRAINTS"
        " WHERE CONSTRAINT_SCHEMA = DATABASE() AND CONSTRAINT_NAME LIKE 'ck\\_weave\\_%%'"
    )
    in_schema = {r["CONSTRAINT_NAME"] for r in rows}
    covered = {f"ck_{table}_{check}" for table, check, _ in BAD_ROWS}
    assert in_schema == covered
    assert len(in_schema) == len(rows), "CHECK names must be unique across the schema"


async def test_base_rows_are_valid(db: Database) -> None:
    for table, row in base_rows().items():
        await insert(db, table, row)


@pytest.mark.parametrize(
    ("table", "check", "overrides"), BAD_ROWS, ids=[f"{t}.{c}" for t, c, _ in BAD_ROWS]
)
async def test_check_rejects_bad_row(
    db: Database, table: str, check: str, overrides: dict[str, Any]
) -> None:
    row = {**base_rows()[table], **overrides}
    with pytest.raises(Exception) as exc:
        await insert(db, table, row)
    assert error_code(exc.value) in CHECK_VIOLATED, exc.value
    message = str(exc.value)
    json_col = next((c for c in overrides if c in JSON_COLUMNS and overrides[c] == "{nope"), None)
    if json_col is not None:
        assert f"ck_{table}_{check}" in message or f"`{table}.{json_col}`" in message, message
    else:
        assert f"ck_{table}_{check}" in message, message


@pytest.mark.parametrize("table", ["weave_definition_versions", "weave_poll_rounds"])
async def test_immutable_tables_reject_update_and_delete(db: Database, table: str) -> None:
    row = base_rows()[table]
    await insert(db, table, row)
    key = {"ns": row["namespace_id"], "id": row["id"]}
    with pytest.raises(Exception) as exc:
        await run_sql(db, f"UPDATE {table} SET created_at = created_at WHERE namespace_id = %(ns)s AND id = %(id)s"
                      if table == "weave_definition_versions" else
                      f"UPDATE {table} SET evaluated_at = evaluated_at WHERE namespace_id = %(ns)s AND id = %(id)s", key)  # fmt: skip
    assert error_code(exc.value) == TRIGGER_SIGNAL and f"{table} is immutable" in str(exc.value)
    with pytest.raises(Exception) as exc:
        await run_sql(db, f"DELETE FROM {table} WHERE namespace_id = %(ns)s AND id = %(id)s", key)
    assert error_code(exc.value) == TRIGGER_SIGNAL
    still = await db.fetchone(
        f"SELECT COUNT(*) AS n FROM {table} WHERE namespace_id = %s AND id = %s",
        (row["namespace_id"], row["id"]),
    )
    assert still is not None and still["n"] == 1


async def test_mutable_tables_have_no_triggers(db: Database) -> None:
    rows = await db.fetchall(
        "SELECT EVENT_OBJECT_TABLE AS t, EVENT_MANIPULATION AS m FROM information_schema.TRIGGERS"
        " WHERE TRIGGER_SCHEMA = DATABASE() AND EVENT_OBJECT_TABLE LIKE 'weave\\_%%'"
    )
    assert sorted((r["t"], r["m"]) for r in rows) == [
        ("weave_definition_versions", "DELETE"),
        ("weave_definition_versions", "UPDATE"),
        ("weave_poll_rounds", "DELETE"),
        ("weave_poll_rounds", "UPDATE"),
    ]


async def test_signals_are_deduplicated_per_instance_by_signal_id(db: Database) -> None:
    first = base_rows()["weave_signals"]
    await insert(db, "weave_signals", first)
    again = {**first, "id": rid(), "payload": '{"other": true}'}
    with pytest.raises(DuplicateKey) as exc:
        await insert(db, "weave_signals", again)
    assert exc.value.key == "uq_weave_signals_signal_id"
    # the same signal id for another instance, or another id for the same one, is fine
    await insert(db, "weave_signals", {**first, "id": rid(), "instance_id": rid()})
    await insert(db, "weave_signals", {**first, "id": rid(), "signal_id": "sig-2"})
    # an early signal stays unmatched, then is matched to its wait
    n = await run_sql(
        db,
        "UPDATE weave_signals SET matched_wait_id = %s, matched_at = %s, revision = revision + 1"
        " WHERE namespace_id = %s AND id = %s AND matched_wait_id IS NULL",
        (rid(), NOW, first["namespace_id"], first["id"]),
    )
    assert n == 1


@pytest.mark.parametrize(
    ("table", "index", "same"),
    [
        ("weave_definitions", "uq_weave_definitions_name", ["name"]),
        (
            "weave_definition_versions",
            "uq_weave_definition_versions_version",
            ["definition_id", "version"],
        ),
        ("weave_instances", "uq_weave_instances_business_key", ["definition_id", "business_key"]),
        ("weave_steps", "uq_weave_steps_path", ["instance_id", "step_path"]),
        (
            "weave_activations",
            "uq_weave_activations_number",
            ["instance_id", "step_path", "activation_no"],
        ),
        ("weave_activations", "uq_weave_activations_task", ["task_id"]),
        ("weave_poll_states", "uq_weave_poll_states_step", ["instance_id", "step_path"]),
        ("weave_poll_rounds", "uq_weave_poll_rounds_round", ["poll_state_id", "round_no"]),
        ("weave_inbox", "uq_weave_inbox_source", ["source_event_id"]),
    ],
)
async def test_unique_indexes(db: Database, table: str, index: str, same: list[str]) -> None:
    first = base_rows()[table]
    if table == "weave_instances":
        first["business_key"] = "order-1"
    await insert(db, table, first)
    second = base_rows()[table]
    second["namespace_id"] = first["namespace_id"]
    for col in same:
        second[col] = first[col]
    with pytest.raises(DuplicateKey) as exc:
        await insert(db, table, second)
    assert exc.value.key == index
    # the same values in another namespace never collide
    await insert(db, table, {**second, "namespace_id": rid()})


async def test_null_business_keys_never_collide(db: Database) -> None:
    a = base_rows()["weave_instances"]
    await insert(db, "weave_instances", a)
    await insert(db, "weave_instances", {**a, "id": rid()})


async def test_business_json_is_kept_byte_exact(db: Database) -> None:
    row = base_rows()["weave_instances"]
    row["input"] = '{"price": 19.90, "n": 1e2,  "s": "é"}'
    await insert(db, "weave_instances", row)
    got = await db.fetchone(
        "SELECT input FROM weave_instances WHERE namespace_id = %s AND id = %s",
        (row["namespace_id"], row["id"]),
    )
    assert got is not None and got["input"] == row["input"]


async def explain(db: Database, sql: str) -> list[dict[str, Any]]:
    """EXPLAIN on a raw pooled connection: these are the engine's future cross-namespace
    scans, which are not store queries yet (so outside the SQL guard)."""
    async with db.pool.acquire() as conn, conn.cursor() as cur:
        await cur.execute("EXPLAIN " + sql, (NOW,))
        rows = list(await cur.fetchall())
        await conn.rollback()
        return rows


async def test_due_timer_and_pending_inbox_indexes_are_used(db: Database) -> None:
    plan = await explain(
        db,
        "SELECT namespace_id, id FROM weave_waits WHERE state = 'OPEN' AND notified_at IS NULL"
        " AND due_at <= %s ORDER BY due_at LIMIT 10",
    )
    assert plan[0]["key"] == "ix_weave_waits_due", plan
    plan = await explain(
        db,
        "SELECT namespace_id, id FROM weave_inbox WHERE processed_at IS NULL AND available_at <= %s"
        " ORDER BY available_at LIMIT 10",
    )
    assert plan[0]["key"] == "ix_weave_inbox_pending", plan
