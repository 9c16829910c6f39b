"""Helpers for the fair-dispatch and priority tests (tests/integration/test_pulse_fair_*.py,
test_pulse_priority.py, tests/e2e/test_pulse_fairness_processes.py).

* :func:`add_owner` — a second application (a real one, with its resources row) whose tasks
  land in an existing tenant's namespace (the service layer takes the owner as a parameter;
  over HTTP the owner is the key's application).
* :func:`submit_as` — submit one task for a given owner through the real submit service.
* :func:`flood` — bulk-insert ``n`` WAITING copies of a submitted task (``INSERT … SELECT``
  from a sequence table), with the queue's and the owner's counters kept equal to the rows.
* :func:`finish_offers` — start and complete offered attempts through the real services.
"""

from __future__ import annotations

import secrets
from collections.abc import Sequence
from typing import Any

import msgspec
from pulse_fixtures import Tenant

from orbit.applications import insert_application
from orbit.audit import CLI_ACTOR
from orbit.ids import parse_id
from orbit.storage import Database, Tx
from pulse import attempts, wire
from pulse import submit as submit_service
from pulse.attempts import Report
from pulse.types import TaskSubmit


async def add_owner(db: Database) -> bytes:
    """A new application (no namespace of its own needed); its id."""

    async def run(tx: Tx) -> bytes:
        row = await insert_application(tx, CLI_ACTOR, f"owner-{secrets.token_hex(6)}")
        return row.id  # type: ignore[no-any-return]

    return await db.transaction(run)


async def submit_as(db: Database, t: Tenant, owner_id: bytes, **fields: Any) -> dict[str, Any]:
    """Submit one task owned by ``owner_id`` into ``t``'s namespace; the task API object."""
    fields.setdefault("queue", t.queue)
    fields.setdefault("kind", "k")
    payload = fields.pop("payload", None)
    body = msgspec.json.decode(msgspec.json.encode({**fields, "payload": payload}), type=TaskSubmit)
    res = await submit_service.submit_one(db, t.namespace_id, owner_id, body)
    return res.json()  # type: ignore[no-any-return]


async def flood(db: Database, t: Tenant, template_id: str, n: int, *, older_s: int = 3600) -> None:
    """Add ``n`` WAITING copies of task ``template_id`` (same owner, queue, priority), each
    available ``older_s`` seconds (and a few microseconds more each) before the template —
    so in plain dispatch order they all come first. Counters stay equal to the rows."""
    tid = bytes.fromhex(template_id)

    async def run(tx: Tx) -> None:
        # Every stored column (the generated dispatch_at is computed). namespace_id first,
        # named in the query so the SQL guard sees this is not a cross-namespace statement.
        cols = ["namespace_id"] + [
            r["COLUMN_NAME"]
            for r in await tx.fetchall(
                "SELECT COLUMN_NAME FROM information_schema.COLUMNS WHERE TABLE_SCHEMA ="
                " DATABASE() AND TABLE_NAME = 'pulse_tasks' AND EXTRA NOT LIKE %s"
                " AND COLUMN_NAME <> 'namespace_id' ORDER BY ORDINAL_POSITION",
                ("%GENERATED%",),
            )
        ]
        exprs = {
            "id": "UNHEX(MD5(CONCAT(HEX(t.id), '-', s.seq)))",
            "available_at": "t.available_at - INTERVAL %s SECOND - INTERVAL s.seq MICROSECOND",
        }
        select = ", ".join(exprs.get(c, f"t.{c}") for c in cols)
        left, offset = n, 0
        while left > 0:
            chunk = min(left, 50_000)
            await tx.execute(
                f"INSERT INTO pulse_tasks ({', '.join(cols)}) SELECT {select}"
                f" FROM pulse_tasks t JOIN seq_{offset + 1}_to_{offset + chunk} s"
                " WHERE t.namespace_id = %s AND t.id = %s",
                (older_s, t.namespace_id, tid),
            )
            left -= chunk
            offset += chunk
        row = await tx.fetchone(
            "SELECT queue_id, owner_id FROM pulse_tasks WHERE namespace_id = %s AND id = %s",
            (t.namespace_id, tid),
        )
        assert row is not None
        await tx.execute(
            "UPDATE pulse_queue_usage SET unfinished_tasks = unfinished_tasks + %s"
            " WHERE namespace_id = %s AND queue_id = %s",
            (n, t.namespace_id, row["queue_id"]),
        )
        await tx.execute(
            "UPDATE orbit_application_resources SET unfinished_tasks = unfinished_tasks + %s"
            " WHERE application_id = %s",
            (n, row["owner_id"]),
        )

    await db.transaction(run)


async def finish_offers(
    db: Database, t: Tenant, session_id: bytes, offers: Sequence[wire.Offer]
) -> None:
    """Start and complete every offer (the worker's part, through the real services)."""
    for offer in offers:
        aid = parse_id(offer.attempt_id)
        assert aid is not None
        started = await attempts.start(db, t.namespace_id, session_id, aid)
        assert isinstance(started, wire.Started), started
        await attempts.report(db, t.namespace_id, Report("complete", aid, started.execution_token))


async def set_max_reservations(db: Database, owner_id: bytes, limit: int | None) -> None:
    """Set an application's ``max_reservations`` quota (config only; usage untouched)."""

    async def run(tx: Tx) -> None:
        await tx.execute(
            "UPDATE orbit_application_resources SET max_reservations = %s"
            " WHERE application_id = %s",
            (limit, owner_id),
        )

    await db.transaction(run)


async def reservations_of(db: Database, owner_id: bytes) -> int:
    async def run(tx: Tx) -> int:
        return int(
            await tx.fetchval(
                "SELECT reservations FROM orbit_application_resources WHERE application_id = %s",
                (owner_id,),
            )
        )

    return await db.read(run)


async def leased_of(db: Database, t: Tenant, owner_id: bytes) -> int:
    """LEASED tasks of an owner in the tenant's namespace (a recount)."""

    async def run(tx: Tx) -> int:
        return int(
            await tx.fetchval(
                "SELECT COUNT(*) FROM pulse_tasks WHERE namespace_id = %s AND owner_id = %s"
                " AND state = 'LEASED'",
                (t.namespace_id, owner_id),
            )
        )

    return await db.read(run)
