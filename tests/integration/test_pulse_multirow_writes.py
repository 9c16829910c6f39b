"""The batch writes as ONE guarded UPDATE per table (pulse/store/attempts.py): every row keeps
its own guard (id, state, revision) and its own values, and the statement's matched count
counts only the rows whose guard held — what one statement per row gave, row by row."""

from __future__ import annotations

from datetime import timedelta
from typing import Any

import pytest
from pulse_worker_support import FakeConn, connect, open_session, task_row

from orbit.ids import id_hex, parse_id
from orbit.storage import Database, Tx
from pulse import wire
from pulse.dispatch import Dispatcher
from pulse.hub import Hub
from pulse.store import attempts as store


class _Undo(Exception):
    def __init__(self, value: Any) -> None:
        self.value = value


async def _then_roll_back(db: Database, fn: Any) -> Any:
    """Run ``fn(tx)`` and roll it back; return what it returned."""

    async def run(tx: Tx) -> None:
        raise _Undo(await fn(tx))

    with pytest.raises(_Undo) as undone:
        await db.transaction(run)
    return undone.value.value


async def _offers(db: Database, hub: Hub, conn: FakeConn, n: int) -> list[wire.Offer]:
    assert await Dispatcher(db, hub).dispatch_to(conn) == n
    return conn.take_offers()  # type: ignore[no-any-return]


async def test_one_lease_statement_gives_each_task_its_own_attempt(db, tenant) -> None:
    t = await tenant()
    for _ in range(3):
        await t.submit()
    info, _ = await open_session(db, t, max_concurrency=3)
    hub = Hub("node-multirow")
    offers = await _offers(db, hub, await connect(db, hub, info), 3)
    for o in offers:
        row = await task_row(db, t, o.task.id)
        assert row["state"] == "LEASED" and id_hex(row["current_attempt_id"]) == o.attempt_id
        assert row["session_id"] == info.session_id and int(row["revision"]) == 2


async def test_one_start_statement_counts_only_rows_whose_guard_held(db, tenant) -> None:
    t = await tenant()
    for _ in range(3):
        await t.submit()
    info, _ = await open_session(db, t, max_concurrency=3)
    hub = Hub("node-multirow-start")
    offers = await _offers(db, hub, await connect(db, hub, info), 3)
    rows = [await task_row(db, t, o.task.id) for o in offers]
    ns = t.namespace_id

    async def start(tx: Tx, stale: int | None) -> tuple[int, list[dict[str, Any]]]:
        now = await tx.fetchval("SELECT UTC_TIMESTAMP(6)")
        items = [
            {
                "id": r["id"], "attempt_id": parse_id(o.attempt_id), "generation": 1,
                "lease_expires_at": now + timedelta(seconds=30 + i),
                "revision": int(r["revision"]) + (5 if i == stale else 0),
            }
            for i, (r, o) in enumerate(zip(rows, offers, strict=True))
        ]  # fmt: skip
        n = await tx.execute(*store.tasks_start_statement(ns, items, now))
        after = [
            await tx.fetchone(
                "SELECT state, attempts, lease_expires_at, revision FROM pulse_tasks"
                " WHERE namespace_id = %s AND id = %s",
                (ns, r["id"]),
            )
            for r in rows
        ]
        return n, [
            {**a, "want_lease": it["lease_expires_at"]} for a, it in zip(after, items, strict=True)
        ]

    # Every guard holds: all three, each with its own lease.
    n, after = await _then_roll_back(db, lambda tx: start(tx, None))
    assert n == 3
    for a in after:
        assert a["state"] == "RUNNING" and a["attempts"] == 1 and a["revision"] == 3
        assert a["lease_expires_at"] == a["want_lease"]
    # The second row's revision moved: the statement matches the other two, and that row is
    # untouched (a caller compares the count with the number of rows and rolls back).
    n, after = await _then_roll_back(db, lambda tx: start(tx, 1))
    assert n == 2
    assert [a["state"] for a in after] == ["RUNNING", "LEASED", "RUNNING"]

    async def attempts_start(tx: Tx) -> tuple[int, list[Any]]:
        now = await tx.fetchval("SELECT UTC_TIMESTAMP(6)")
        items = [
            {
                "id": parse_id(o.attempt_id), "token_digest": bytes([i]) * 32,
                "concurrency_token": None if i else 7, "lease_expires_at": now, "revision": 1,
            }
            for i, o in enumerate(offers)
        ]  # fmt: skip
        n = await tx.execute(*store.attempts_start_statement(ns, items, now))
        got = [
            await tx.fetchone(
                "SELECT state, execution_token_digest, concurrency_token FROM pulse_attempts"
                " WHERE namespace_id = %s AND id = %s",
                (ns, it["id"]),
            )
            for it in items
        ]
        return n, got

    n, got = await _then_roll_back(db, attempts_start)
    assert n == 3
    assert [g["state"] for g in got] == ["RUNNING"] * 3
    assert [bytes(g["execution_token_digest"]) for g in got] == [bytes([i]) * 32 for i in range(3)]
    assert [g["concurrency_token"] for g in got] == [7, None, None]
