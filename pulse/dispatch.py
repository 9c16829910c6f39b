"""The dispatcher: two-step dispatch, step 1 (lease due tasks to connected sessions).

For each session connected to this node that wants offers, one transaction:

1. lock the session row and check, by the database, that it is ACTIVE, not expired and
   held by this node; count the attempts it holds (OFFERED + RUNNING) —
   ``free = max_concurrency - held`` is the flow-control budget, so a session never holds
   more than its ``max_concurrency``;
2. skip queues whose gate (namespace or queue) is closed;
3. per queue, ``SELECT … FOR UPDATE SKIP LOCKED`` due tasks (``WAITING``, available, not
   past the deadline, keyed only for sessions that handle keys), ordered by ``dispatch_at``
   then id, at most ``min(free, batch)``; update them by primary key with their revisions
   (WAITING → LEASED; one round trip of per-row guarded UPDATEs), insert the OFFERED
   attempts (generation = attempts + 1, a short offer lease) with one INSERT;
4. add the reservations to the owners' application rows and the queues' usage rows with the
   summed deltas (these rows are locked from here to COMMIT only: the dispatcher judges no
   limit on them, and SKIP LOCKED means it never waits on a task while holding them), write
   the raw events;
5. commit — and only then push the offers to the worker (a transaction may be retried; a
   push cannot be taken back). An offer that never arrives expires and recovery returns the
   task to WAITING.

Concurrent dispatchers (threads, processes, nodes) get disjoint tasks from SKIP LOCKED; the
guarded UPDATEs and the start transaction's checks mean no task is offered twice at once and
no attempt starts twice. New work wakes this node's dispatcher at once (Hub.notify_new_work);
other nodes find it within ``dispatch_poll_ms``.
"""

from __future__ import annotations

import asyncio
import logging
import random
import time
from collections import defaultdict
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any

from orbit.ids import id_hex, new_id
from orbit.metrics import Registry
from orbit.storage import Database, Tx
from pulse import transitions, wire
from pulse.attempts import Change, now_in_tx
from pulse.hub import CLOSE_REPLACED, CLOSE_SESSION_GONE, Connection, Hub
from pulse.store import attempts as store
from pulse.store import queues as queue_store
from pulse.store import sessions as session_store

log = logging.getLogger("pulse.dispatch")


@dataclass
class _Outcome:
    offers: list[wire.Offer]
    #: None: the session is fine. Else why this node must drop its connection.
    gone: str | None = None
    #: True when some queue gave a full batch (more may be due).
    more: bool = False


class Dispatcher:
    """Leases due tasks to this node's connected sessions. Safe on many nodes at once."""

    def __init__(self, db: Database, hub: Hub, *, metrics: Registry | None = None) -> None:
        self.db = db
        self.hub = hub
        self.settings = hub.settings
        self._rotation = 0
        self._more = False
        self._metrics = metrics
        if metrics is not None:
            self._offers = metrics.counter("pulse_offers_total", "Attempts offered to workers")
            self._seconds = metrics.histogram(
                "pulse_dispatch_seconds", "Time of one dispatch transaction"
            )

    async def run_once(self, *, now: datetime | None = None) -> int:
        """One dispatch round over the connected sessions; return the number of offers."""
        total = 0
        conns = [c for c in self.hub.connections() if c.wants_offers()]
        if not conns:
            return 0
        self._rotation += 1
        self._more = False
        start = self._rotation % len(conns)
        for conn in conns[start:] + conns[:start]:
            try:
                total += await self.dispatch_to(conn, now=now)
            except asyncio.CancelledError:
                raise
            except Exception:
                log.exception("dispatch to session %s failed", id_hex(conn.info.session_id))
        return total

    async def dispatch_to(self, conn: Connection, *, now: datetime | None = None) -> int:
        """Offer due tasks to one session (one transaction), then push them."""
        began = time.perf_counter()
        outcome = await self.db.transaction(lambda tx: self._lease(tx, conn, now))
        if self._metrics is not None:
            self._seconds.observe(time.perf_counter() - began)
        if outcome.gone is not None:
            self.hub.unregister(conn)
            code = CLOSE_REPLACED if outcome.gone == "moved" else CLOSE_SESSION_GONE
            await conn.close(code, "session_" + outcome.gone)
            return 0
        if outcome.more:
            self._more = True
        if outcome.offers:
            if self._metrics is not None:
                self._offers.inc(len(outcome.offers))
            await self.hub.push_offers(conn, outcome.offers)
        return len(outcome.offers)

    async def _lease(self, tx: Tx, conn: Connection, now: datetime | None) -> _Outcome:
        info = conn.info
        ns = info.namespace_id
        session = await session_store.session_lock(tx, ns, info.session_id)
        t = await now_in_tx(tx, now)
        if session is None or session["state"] != "ACTIVE" or session["expires_at"] <= t:
            return _Outcome([], gone="expired")
        if session["node_id"] != self.hub.node_id:
            return _Outcome([], gone="moved")
        free = int(session["max_concurrency"]) - await session_store.session_count_held(
            tx, ns, info.session_id
        )
        if free <= 0 or not conn.queues:
            return _Outcome([])
        gates = await queue_store.gate_get_many(
            tx, ns, [queue_store.NAMESPACE_GATE, *(q.id for q in conn.queues)]
        )
        if _paused(gates, queue_store.NAMESPACE_GATE):
            return _Outcome([])
        keys_ok = bool(session["concurrency_keys"])
        n = len(conn.queues)
        first = self._rotation % n
        batch = self.settings.dispatch_batch
        candidates = [
            q for q in conn.queues[first:] + conn.queues[:first] if not _paused(gates, q.id)
        ]
        if not candidates:
            return _Outcome([])
        # No usage row is locked up front: the dispatcher judges no limit on them (the start
        # does). The claim takes the tasks (SKIP LOCKED: it never waits on another
        # transaction's tasks); the reservations are added at the end with the summed
        # deltas, so the application and queue rows are held only from there to COMMIT.
        offer_lease = t + timedelta(milliseconds=self.settings.offer_lease_ms)
        offers: list[wire.Offer] = []
        attempts: list[dict[str, Any]] = []
        leased: list[tuple[dict[str, Any], bytes]] = []  # (claimed row, attempt id)
        reservations: dict[tuple[bytes, bytes], int] = defaultdict(int)
        more = False
        leases: list[tuple[str, Any]] = []
        for q in candidates:
            if free <= 0:
                more = True
                break
            want = min(free, batch)
            rows = await store.task_claim_due(tx, ns, q.id, t, keys_ok, want)
            more = more or len(rows) == want
            for row in rows:
                attempt_id = new_id()
                generation = int(row["attempts"]) + 1
                leases.append((
                    store.Q.task_lease_if_waiting,
                    {
                        "namespace_id": ns, "id": row["id"], "attempt_id": attempt_id,
                        "session_id": info.session_id, "lease_expires_at": offer_lease,
                        "now": t, "revision": row["revision"],
                    },
                ))  # fmt: skip
                attempts.append(
                    {
                        "namespace_id": ns,
                        "id": attempt_id,
                        "task_id": row["id"],
                        "generation": generation,
                        "session_id": info.session_id,
                        "lease_expires_at": offer_lease,
                        "now": t,
                    }
                )
                leased.append((row, attempt_id))
                reservations[(row["queue_id"], row["owner_id"])] += 1
                offers.append(wire.offer_from_row(row, attempt_id, generation, offer_lease))
                free -= 1
        # Every claimed row is locked by this transaction: one round trip of guarded per-row
        # UPDATEs (WAITING → LEASED by primary key and revision), each with its own count.
        counts = await tx.execute_batch(leases)
        if any(c != 1 for c in counts):  # pragma: no cover - the rows are locked by this tx
            raise RuntimeError("a claimed task changed while locked")
        if not offers:
            return _Outcome([])
        await store.attempt_insert_many(tx, attempts)
        for (queue_id, owner_id), count in sorted(reservations.items()):
            await transitions.adjust_usage(tx, ns, queue_id, reservations=count, owner_id=owner_id)
        # The leased rows as task_lease_if_waiting left them (computed, not re-read: the
        # events need only what the claim returned plus what the UPDATE set).
        changes: list[Change] = [
            (
                {
                    **row, "state": "LEASED", "current_attempt_id": attempt_id,
                    "session_id": info.session_id, "lease_expires_at": offer_lease,
                    "state_version": int(row["state_version"]) + 1, "state_changed_at": t,
                    "revision": int(row["revision"]) + 1,
                },
                transitions.EVENT_LEASED,
                {"session_id": id_hex(info.session_id)},
            )
            for row, attempt_id in leased
        ]  # fmt: skip
        await transitions.record_many(tx, ns, changes, now=t)
        return _Outcome(offers, more=more)

    async def run(self, stop: asyncio.Event | None = None) -> None:
        """Dispatch until ``stop`` is set (or the task is cancelled): at once when woken, else
        every ``dispatch_poll_ms`` (with jitter, so nodes do not poll in step)."""
        poll_s = self.settings.dispatch_poll_ms / 1000
        while stop is None or not stop.is_set():
            self._more = False
            try:
                await self.run_once()
            except asyncio.CancelledError:
                raise
            except Exception:
                log.exception("dispatch round failed")
                await asyncio.sleep(poll_s)
            if self._more:
                await asyncio.sleep(0)
                continue
            await self.hub.wait_for_work(poll_s * random.uniform(0.8, 1.2), stop)


def _paused(gates: dict[bytes, dict[str, Any]], queue_id: bytes) -> bool:
    gate = gates.get(queue_id)
    return gate is not None and bool(gate["paused"])
