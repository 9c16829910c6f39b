"""Review: pause/resume of a gate decides "does this change anything" under a lock, so
concurrent identical requests make one change: one raw event and one audit row."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator

import httpx
import pytest
from event_rows import raw_events
from platform_fixtures import make_app, pulse_routes

from orbit.storage import Database, Tx


@pytest.fixture
async def http(db: Database) -> AsyncIterator[httpx.AsyncClient]:
    app = make_app(db, pulse_routes)
    transport = httpx.ASGITransport(app=app)
    async with httpx.AsyncClient(transport=transport, base_url="http://orbit.test") as client:
        yield client


async def _gate_rows(db: Database, namespace_id: bytes) -> tuple[list[str], list[str]]:
    async def run(tx: Tx) -> list[dict[str, object]]:
        return await raw_events(tx, namespace_id, type_prefix="gate.")

    events = await db.read(run)
    audits = await db.fetchall(
        "SELECT action FROM orbit_audit_events WHERE namespace_id = %s"
        " AND action IN ('queues.pause', 'queues.resume')",
        (namespace_id,),
    )
    return [r["type"] for r in events], [r["action"] for r in audits]


@pytest.mark.parametrize("scope", ["queue", "namespace"])
async def test_concurrent_pauses_make_one_change(
    http: httpx.AsyncClient, tenant, db: Database, scope: str
) -> None:
    t = await tenant()
    base = f"/v1/namespaces/{t.namespace}"
    target = f"{base}/queues/default" if scope == "queue" else base
    for round_ in range(2):  # first use of the gate (insert), then an existing row (update)
        rs = await asyncio.gather(*[http.post(f"{target}/pause", headers=t.auth) for _ in range(6)])
        assert {r.status_code for r in rs} == {200}
        rs = await asyncio.gather(
            *[http.post(f"{target}/resume", headers=t.auth) for _ in range(6)]
        )
        assert {r.status_code for r in rs} == {200}
        events, audits = await _gate_rows(db, t.namespace_id)
        assert events.count("gate.paused") == events.count("gate.resumed") == round_ + 1, events
        assert audits.count("queues.pause") == audits.count("queues.resume") == round_ + 1
    gate = (await http.get(f"{base}/gate", headers=t.auth)).json()
    if scope == "namespace":
        assert gate["control_revision"] == 4 and gate["paused"] is False
    else:
        q = (await http.get(f"{base}/queues/default", headers=t.auth)).json()
        assert q["gate"]["control_revision"] == 4 and q["paused"] is False
