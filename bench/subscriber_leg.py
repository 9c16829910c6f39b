"""The subscriber leg alone (S4's suspect): how fast one WebSocket subscriber is handed out and
acks a burst of result events, with no task traffic at the same time.

``n`` result events of a fresh queue are appended to the namespace's result stream directly
(``orbit.events.append_result_events``, 500 a transaction — what task completions append),
then the SDK Subscriber consumes the subscription (``max_in_flight`` 1,000, so the acks gate
the hand-outs as they do in S1 once the subscriber is behind) and acks each delivery. Figures:
deliveries received/s and acks applied/s (the subscription's ACKED count in the database).
S4 runs it at every backlog level; ``--server-tree`` gives the same figure for another
checkout.
"""

from __future__ import annotations

import asyncio
import os
import secrets
import time
from typing import Any

import httpx

from bench.env import ScratchDatabase, Server
from bench.scenarios import Results, Tenant, put_queue


async def _ids(db: ScratchDatabase, t: Tenant, sub: str) -> tuple[bytes, bytes]:
    ((ns, sid),) = await db.query(
        "SELECT s.namespace_id, s.id FROM orbit_subscriptions s JOIN orbit_namespaces n"
        " ON n.id = s.namespace_id WHERE n.name = %s AND s.name = %s"
        " AND n.application_id = UNHEX(%s)",
        (t.namespace, sub, t.application_id),
    )
    return bytes(ns), bytes(sid)


async def _acked(db: ScratchDatabase, ns: bytes, sid: bytes) -> int:
    """Acked deliveries of the subscription: ACKED rows plus acked slots of delivery ranges
    (a tree without ranges has only the rows)."""
    ((n,),) = await db.query(
        "SELECT COUNT(*) FROM orbit_deliveries FORCE INDEX (ix_orbit_deliveries_state_seq)"
        " WHERE namespace_id = %s AND subscription_id = %s AND state = 'ACKED'",
        (ns, sid),
    )
    try:
        ((m,),) = await db.query(
            "SELECT COALESCE(SUM(acked_n), 0) FROM orbit_delivery_ranges"
            " WHERE namespace_id = %s AND subscription_id = %s",
            (ns, sid),
        )
    except Exception:  # no delivery ranges in this schema
        m = 0
    return int(n) + int(m)


async def subscriber_leg(
    server: Server, t: Tenant, db: ScratchDatabase, n: int = 4000, limit_s: float = 120.0
) -> dict[str, Any]:
    from orbit.events import ResultSnapshot, append_result_events
    from orbit.ids import new_id
    from orbit.storage import Database, Tx

    queue = f"sl-{secrets.token_hex(3)}"
    sub = f"sub-{queue}"
    body = {"filter": {"queues": [queue]}, "start": "latest", "ack_timeout_ms": 60_000,
            "max_deliveries": 10, "max_in_flight": 1000}  # fmt: skip
    async with httpx.AsyncClient(timeout=30.0) as client:
        await put_queue(client, t, queue)
        r = await client.put(f"{t.base()}/subscriptions/{sub}", headers=t.headers, json=body)
        r.raise_for_status()
    ns, sid = await _ids(db, t, sub)
    owner = bytes.fromhex(t.application_id)
    database = await Database.connect(db.dsn, maxsize=2)
    try:
        for start in range(0, n, 500):
            snaps = [
                ResultSnapshot(
                    task_id=new_id(),
                    queue=queue,
                    kind="noop",
                    owner_id=owner,
                    state="SUCCEEDED",
                    result=None,
                    attempts=1,
                )
                for _ in range(min(500, n - start))
            ]

            async def run(tx: Tx, snaps: list[ResultSnapshot] = snaps) -> list[int]:
                return await append_result_events(tx, ns, snaps)

            await database.transaction(run)
    finally:
        await database.close()
    results = Results(t, sub)
    began = time.monotonic()
    results.start()
    delivered_s = acked_s = None
    try:
        while time.monotonic() - began < limit_s:
            await asyncio.sleep(0.1)
            if delivered_s is None and results.count >= n:
                delivered_s = time.monotonic() - began
            if delivered_s is not None and await _acked(db, ns, sid) >= n:
                acked_s = time.monotonic() - began
                break
    finally:
        await results.stop()
    acked = await _acked(db, ns, sid)
    return {
        "n": n,
        "received": results.count,
        "acked": acked,
        "received_per_s": round(n / delivered_s, 1) if delivered_s else None,
        "acked_per_s": round(n / acked_s, 1) if acked_s else round(acked / limit_s, 1),
        "load_avg": [round(x, 2) for x in os.getloadavg()],
        "subscriber_error": repr(results.error) if results.error else None,
    }
