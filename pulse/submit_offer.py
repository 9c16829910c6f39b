"""The idle-latency offer: a submit offers its new task in its own transaction.

When a worker session streams to this node, waits with free slots on the task's queue and
nothing older or more urgent is due there, the submit that creates the task also leases it
to that session (WAITING → LEASED, an OFFERED attempt), exactly as a dispatch transaction
would, and the offer is pushed once the submit has committed. The task then reaches the
worker without a separate dispatch transaction in its path: on an idle system, submit →
start is two durable transactions (the submit and the start), not three.

Everything the dispatcher checks is checked here, in the submit's transaction, on locked
rows: the session is ACTIVE, not expired and held by this node, and holds fewer attempts
than its ``max_concurrency``; the namespace and the queue are not paused; the owner's
``max_reservations`` / ``max_active_attempts`` and the queue's ``max_concurrency`` leave room
(judged on the resources and usage rows the submit locked first). Keyed tasks, delayed
tasks and tasks of a queue with other due work are left to dispatch, which keeps the
queue's order and the keys' permits.

**Lock order.** A submit has locked the owner's resources row and the queues' usage rows
before it takes a session row, while dispatch locks session rows first. The submit
therefore takes session rows only with ``SKIP LOCKED`` and never waits for one: a session
that a dispatch transaction is serving is skipped (its task stays WAITING for dispatch),
and no wait cycle can form between the two.
"""

from __future__ import annotations

import logging
from collections import defaultdict
from collections.abc import Sequence
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import Any

from orbit.ids import id_hex, new_id
from orbit.storage import Tx
from orbit.store.clock import clock_of
from pulse import transitions, wire
from pulse.attempt_rules import offer_rows
from pulse.attempts import Change
from pulse.hub import Connection, Hub
from pulse.store import attempts as attempt_store
from pulse.store import dispatch as dispatch_store
from pulse.store import queues as queue_store
from pulse.store import sessions as session_store

log = logging.getLogger("pulse.submit_offer")

Row = dict[str, Any]

#: Most sessions of one queue a submit looks at (the first ones with room take the tasks).
MAX_SESSIONS = 8


@dataclass
class Offered:
    """What one group's offers did: the pushes to make after COMMIT and the leased rows
    (by task id, as the lease left them)."""

    pushes: list[tuple[Connection, list[wire.Offer]]] = field(default_factory=list)
    rows: dict[bytes, Row] = field(default_factory=dict)


class IdleOffer:
    """Offers new tasks to this node's waiting sessions inside the submit's transaction."""

    def __init__(self, hub: Hub) -> None:
        self.hub = hub
        #: Tasks offered by submits (for /metrics and the tests).
        self.offered = 0

    def _waiting(self, namespace_id: bytes, queue_id: bytes) -> list[Connection]:
        out: list[Connection] = []
        for conn in self.hub.connections():
            if (
                conn.info.namespace_id == namespace_id
                and conn.wants_offers()
                and any(q.id == queue_id for q in conn.queues)
            ):
                out.append(conn)
                if len(out) >= MAX_SESSIONS:
                    break
        return out

    async def offer_in_tx(
        self,
        tx: Tx,
        namespace_id: bytes,
        owner_id: bytes,
        created: Sequence[Row],
        now: datetime | None = None,
    ) -> Offered:
        """Lease what it can of ``created`` (the rows a submit just inserted, WAITING, all of
        ``owner_id``) to sessions waiting on this node; nothing when none waits."""
        out = Offered()
        stamp = created[0]["created_at"] if created else None
        due: dict[bytes, list[Row]] = defaultdict(list)
        for row in created:
            if (
                row["concurrency_key"] is None
                and row["available_at"] <= row["created_at"]
                and (row["deadline_at"] is None or row["deadline_at"] > row["created_at"])
            ):
                due[row["queue_id"]].append(row)
        conns: dict[bytes, list[Connection]] = {}
        for queue_id in list(due):
            waiting = self._waiting(namespace_id, queue_id)
            if waiting:
                conns[queue_id] = waiting
            else:
                del due[queue_id]
        if not due or stamp is None:
            return out
        by_session = {c.info.session_id: c for cs in conns.values() for c in cs}
        ids = sorted(by_session)
        new_ids = [row["id"] for row in created]
        queue_ids = sorted(due)
        got = await tx.pipeline(
            session_store.session_lock_offer_skip_locked(tx, namespace_id, ids),
            session_store.session_count_held_many(tx, namespace_id, ids),
            queue_store.gate_get_many(tx, namespace_id, [queue_store.NAMESPACE_GATE, *queue_ids]),
            *(
                session_store.session_queue_has_due_work(tx, namespace_id, q, stamp, new_ids)
                for q in queue_ids
            ),
        )
        locked: list[Row] = got[0]
        held: dict[bytes, int] = got[1]
        gates: dict[bytes, Row] = got[2]
        busy = dict(zip(queue_ids, got[3:], strict=True))
        # The clock once the sessions are locked (none locked: no room, nothing to offer).
        t = now or clock_of(locked)
        if t is None or _paused(gates, queue_store.NAMESPACE_GATE):
            return out
        room: dict[bytes, int] = {}
        for s in locked:
            sid = bytes(s["id"])
            if s["state"] == "ACTIVE" and s["expires_at"] > t and s["node_id"] == self.hub.node_id:
                free = int(s["max_concurrency"]) - held.get(sid, 0)
                if free > 0:
                    room[sid] = free
        queue_ids = [q for q in queue_ids if not busy[q] and not _paused(gates, q)]
        if not room or not queue_ids:
            return out
        # The owner's and the queues' limits, on the rows this transaction locked first.
        apps, usage = await dispatch_store.usage_lock_with_limits(
            tx, namespace_id, queue_ids, [owner_id]
        )
        owner_left = _owner_room(apps.get(owner_id))
        plan: list[tuple[Row, Connection]] = []
        for queue_id in queue_ids:
            queue_left = _queue_room(usage.get(queue_id))
            for row in due[queue_id]:
                if owner_left == 0 or queue_left == 0:
                    break
                conn = next(
                    (c for c in conns[queue_id] if room.get(c.info.session_id, 0) > 0), None
                )
                if conn is None:
                    break
                room[conn.info.session_id] -= 1
                owner_left = owner_left - 1 if owner_left is not None else None
                queue_left = queue_left - 1 if queue_left is not None else None
                plan.append((row, conn))
        if plan:
            await self._write(tx, namespace_id, owner_id, t, plan, out)
        return out

    async def _write(
        self,
        tx: Tx,
        ns: bytes,
        owner_id: bytes,
        t: datetime,
        plan: list[tuple[Row, Connection]],
        out: Offered,
    ) -> None:
        """The dispatcher's writes for ``plan``: the leases (one guarded UPDATE), the OFFERED
        attempts, the reservations on the rows locked first, the ``task.leased`` events."""
        offer_lease = t + timedelta(milliseconds=self.hub.settings.offer_lease_ms)
        leased: list[Row] = []
        attempts: list[Row] = []
        changes: list[Change] = []
        per_queue: dict[bytes, int] = defaultdict(int)
        pushes: dict[bytes, tuple[Connection, list[wire.Offer]]] = {}
        for row, conn in plan:
            attempt_id = new_id()
            session_id = conn.info.session_id
            leased.append({"id": row["id"], "attempt_id": attempt_id,
                           "revision": row["revision"], "session_id": session_id})  # fmt: skip
            attempt, after = offer_rows(ns, row, attempt_id, session_id, offer_lease, t)
            attempts.append(attempt)
            per_queue[row["queue_id"]] += 1
            changes.append((after, transitions.EVENT_LEASED, {"session_id": id_hex(session_id)}))
            out.rows[row["id"]] = after
            offer = wire.offer_from_row(row, attempt_id, attempt["generation"], offer_lease)
            pushes.setdefault(session_id, (conn, []))[1].append(offer)
        statements = [
            attempt_store.tasks_lease_statement(ns, leased, offer_lease, t),
            *dispatch_store.reservation_statements(ns, {owner_id: len(plan)}, per_queue),
        ]
        counts, *_ = await tx.pipeline(
            tx.execute_batch(statements),
            attempt_store.attempt_insert_many(tx, attempts),
            transitions.record_many(tx, ns, changes, now=t),
        )
        if counts[0] != len(leased):  # pragma: no cover - the rows were inserted by this tx
            raise RuntimeError("a task the submit created changed before its offer")
        out.pushes.extend(pushes.values())
        self.offered += len(plan)

    async def push(self, pushes: Sequence[tuple[Connection, list[wire.Offer]]]) -> None:
        """After COMMIT: send the offers (one that does not arrive expires and recovery
        returns its task to WAITING, as for any offer)."""
        for conn, offers in pushes:
            try:
                await self.hub.push_offers(conn, offers)
            except Exception:  # the submit committed: a lost push is a lost offer, no more
                log.exception("offers to session %s not pushed", id_hex(conn.info.session_id))


def _paused(gates: dict[bytes, Row], queue_id: bytes) -> bool:
    gate = gates.get(queue_id)
    return gate is not None and bool(gate["paused"])


def _owner_room(app: Row | None) -> int | None:
    """Offers the owner may still get (None: unlimited), as the dispatcher judges it."""
    if app is None:
        return None
    rooms: list[int] = []
    if app.get("max_reservations") is not None:
        rooms.append(int(app["max_reservations"]) - int(app["reservations"]))
    if app.get("max_active_attempts") is not None:
        rooms.append(
            int(app["max_active_attempts"]) - int(app["active_attempts"]) - int(app["reservations"])
        )
    return max(0, min(rooms)) if rooms else None


def _queue_room(usage: Row | None) -> int | None:
    """Offers the queue may still get under its ``max_concurrency`` (None: unlimited)."""
    if usage is None or usage.get("max_concurrency") is None:
        return None
    return max(
        0, int(usage["max_concurrency"]) - int(usage["active_attempts"]) - int(usage["reservations"])
    )
