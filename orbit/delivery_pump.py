"""The pump and the hand-out: everything done under a subscription's row lock.

* :func:`pump_locked` / :func:`pump_subscription` — turn result events after the scan
  position into deliveries and advance the position, in one transaction.
* :func:`reclaim_locked` / :func:`reclaim_subscription` — expired leases back to PENDING
  (after backoff) or EXHAUSTED.
* :func:`lease` — pump, reclaim, then hand out due deliveries within ``max_in_flight``, each
  with a new one-time proof.

Holding the subscription row (``FOR UPDATE``; the background loop uses ``SKIP LOCKED``) is
what makes these safe on many nodes: one pump per subscription at a time, an exact count of
leased deliveries for ``max_in_flight``. Ack, nack, release and budget
(:mod:`orbit.deliveries`) lock only their delivery row, so the lock order is always
subscription row → delivery rows, never the reverse. The rules (states, backoff, proofs)
are in :mod:`orbit.deliveries`; docs/delivery-semantics.md explains the guarantees.
"""

from __future__ import annotations

import asyncio
import logging
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any

from orbit.deliveries import DeliveryState, Leased, after_failure, backoff_ms
from orbit.errors import Conflict, NotFound
from orbit.events import ResultEvent, read_result_events
from orbit.ids import digest, id_hex, new_id, new_secret
from orbit.storage import Database, Tx
from orbit.store import deliveries as store
from orbit.store import subscriptions as sub_store
from orbit.store.subscriptions import SubscriptionRow
from orbit.subscriptions import compile_filter

log = logging.getLogger("orbit.deliveries")

#: Result events read per pump transaction.
PUMP_BATCH = 500
#: Expired leases reclaimed per transaction.
RECLAIM_BATCH = 500


@dataclass(frozen=True, slots=True)
class PumpResult:
    """What one pump transaction did for one subscription."""

    scanned: int  # events read after the old position
    created: int  # deliveries inserted (matching events)
    position: int  # scan position after the transaction


@dataclass(frozen=True, slots=True)
class LeaseBatch:
    """The hand-outs of one :func:`lease` call and the subscription config they used."""

    subscription: SubscriptionRow
    deliveries: list[Leased]
    in_flight: int  # LEASED deliveries of the subscription after this hand-out


# ---------------------------------------------------------------------------------------------
# Pump
# ---------------------------------------------------------------------------------------------


async def pump_locked(
    tx: Tx, sub: SubscriptionRow, now: datetime, limit: int = PUMP_BATCH
) -> PumpResult:
    """Pump one batch for ``sub``, whose row this transaction has locked.

    Reads up to ``limit`` events after the position, stops at the first gap in the sequence
    (a gap cannot be seen with orbit.events' locking, so this is only a guard: nothing past a
    hole is ever skipped), inserts deliveries for the matching ones and advances the
    position to the last contiguous event read.
    """
    events = await read_result_events(tx, sub.namespace_id, sub.after_seq, limit)
    position = sub.after_seq
    matched: list[ResultEvent] = []
    flt = compile_filter(sub)
    for ev in events:
        if ev.seq != position + 1:
            log.warning(
                "result stream gap in namespace %s after seq %d", id_hex(sub.namespace_id), position
            )
            break
        position = ev.seq
        if flt.matches(ev):
            matched.append(ev)
    if position == sub.after_seq:
        return PumpResult(scanned=0, created=0, position=position)
    # The deliveries and the new position in ONE round trip (Tx.pipeline).
    _, advanced = await tx.pipeline(store.delivery_insert_many(
        tx,
        [
            {
                "namespace_id": sub.namespace_id,
                "id": new_id(),
                "subscription_id": sub.id,
                "seq": ev.seq,
                "event_id": ev.event_id,
                "state": DeliveryState.PENDING.value,
                "proof_digest": None,
                "attempts": 0,
                "budget": sub.max_deliveries,
                "lease_expires_at": None,
                "next_at": now,
                "acked_at": None,
                "revision": 1,
                "created_at": now,
                "updated_at": now,
            }
            for ev in matched
        ],
    ), sub_store.subscription_advance_if_position(
        tx, sub.namespace_id, sub.id, sub.after_seq, position
    ))  # fmt: skip
    if not advanced:
        raise Conflict("subscription position moved concurrently", kind="pump_position")
    return PumpResult(scanned=position - sub.after_seq, created=len(matched), position=position)


async def pump_subscription(
    db: Database,
    namespace_id: bytes,
    subscription_id: bytes,
    *,
    now: datetime | None = None,
    limit: int = PUMP_BATCH,
    skip_locked: bool = True,
) -> PumpResult | None:
    """One pump transaction for one subscription.

    None when the subscription is gone or (``skip_locked``) another transaction holds it
    right now — it is being pumped or handed out elsewhere, so there is nothing to do here.
    """

    async def run(tx: Tx) -> PumpResult | None:
        sub, at = await _lock_with_clock(tx, namespace_id, subscription_id, now, skip_locked)
        if sub is None:
            return None
        return await pump_locked(tx, sub, at, limit)

    return await db.transaction(run)


# ---------------------------------------------------------------------------------------------
# Lease expiry and hand-out
# ---------------------------------------------------------------------------------------------


async def reclaim_locked(
    tx: Tx, sub: SubscriptionRow, now: datetime, limit: int = RECLAIM_BATCH
) -> tuple[int, int]:
    """Turn expired leases of ``sub`` (row locked by this transaction) back into PENDING
    after backoff, or EXHAUSTED; return (redelivered, exhausted).

    The backoff counts from the lease's end, not from when this runs, so redelivery timing
    does not depend on how often the loop runs.
    """
    rows = await store.delivery_list_expired_for_update(tx, sub.namespace_id, sub.id, now, limit)
    states: list[DeliveryState] = []
    requeues = []
    for row in rows:
        expired_at = row.lease_expires_at or row.next_at
        state, next_at = after_failure(
            row.attempts, row.budget, expired_at, backoff_ms(row.attempts)
        )
        states.append(state)
        requeues.append(
            store.delivery_requeue_if_revision(tx, row, state=state, next_at=next_at, now=now)
        )
    done = await tx.pipeline(*requeues)  # every guarded requeue in one round trip
    exhausted = sum(
        1 for s, ok in zip(states, done, strict=True) if ok and s is DeliveryState.EXHAUSTED
    )
    redelivered = sum(done) - exhausted
    return redelivered, exhausted


async def hand_out_locked(
    tx: Tx, sub: SubscriptionRow, want: int, now: datetime
) -> tuple[list[Leased], int]:
    """Lease up to ``want`` due deliveries of ``sub`` (row locked by this transaction),
    never more than ``max_in_flight`` leased at once; return (hand-outs, leased after)."""
    in_flight = await store.delivery_count_leased(tx, sub.namespace_id, sub.id)
    room = min(want, sub.max_in_flight - in_flight)
    if room <= 0:
        return [], in_flight
    rows = await store.delivery_list_due_for_update(tx, sub.namespace_id, sub.id, now, room)
    if not rows:
        return [], in_flight
    lease_end = now + timedelta(milliseconds=sub.ack_timeout_ms)
    proofs = [new_secret(24) for _ in rows]
    # Every lease (ONE guarded multi-row UPDATE) and the rows' result events: one round trip.
    leased, event_rows = await tx.pipeline(
        store.deliveries_lease(
            tx, rows, [digest(p) for p in proofs], lease_expires_at=lease_end, now=now
        ),
        store.delivery_event_list_by_seq(tx, sub.namespace_id, [r.seq for r in rows]),
    )
    if leased != len(rows):  # the rows are locked by this transaction: only a bug gets here
        raise Conflict("delivery changed concurrently", kind="cas")
    taken = list(zip(rows, proofs, strict=True))
    events = {int(r["seq"]): r for r in event_rows}
    out: list[Leased] = []
    for row, proof in taken:
        ev = events.get(row.seq)
        if ev is None:  # result events are immutable and never deleted
            raise RuntimeError(f"result event seq {row.seq} of a delivery is missing")
        out.append(
            Leased(
                delivery_id=row.id,
                seq=row.seq,
                event_id=row.event_id,
                attempt=row.attempts + 1,
                lease_expires_at=lease_end,
                event=_result_event(ev),
                proof=proof,
            )
        )
    return out, in_flight + len(out)


def _result_event(row: dict[str, Any]) -> ResultEvent:
    return ResultEvent(
        seq=int(row["seq"]),
        event_id=bytes(row["event_id"]),
        type=row["type"],
        created_at=row["created_at"],
        task_id=bytes(row["task_id"]),
        queue=row["queue"],
        kind=row["kind"],
        owner_id=bytes(row["owner_id"]),
        state=row["state"],
        result=row["result"],
        error=row["error"],
        attempts=int(row["attempts"]),
        finished_at=row["finished_at"],
    )


#: Most subscriptions one coalesced probe statement looks at.
PROBE_BATCH = 200

_Probed = tuple[SubscriptionRow, store.LeaseProbe] | None


class LeaseProbes:
    """Coalesces the hand-out probes of this node's consumers (:func:`lease`): the probes
    asked for while one probe statement is in flight, or in the same turn of the event loop,
    go together in the next one (``delivery_lease_probe_many``, at most :data:`PROBE_BATCH`
    subscriptions a statement). Consumers that poll on a shared tick (the subscription
    stream does) therefore cost one read a tick, not one each. Same answers as one probe
    each; a failed statement fails the probes it carried.
    """

    def __init__(self, db: Database) -> None:
        self.db = db
        self._pending: dict[tuple[bytes, bytes], list[asyncio.Future[_Probed]]] = {}
        self._drainer: asyncio.Task[None] | None = None
        #: Probe statements sent and subscriptions they carried (tests, metrics).
        self.statements = 0
        self.probed = 0

    async def probe(self, namespace_id: bytes, subscription_id: bytes) -> _Probed:
        """The subscription row and its :class:`~orbit.store.deliveries.LeaseProbe`, or None
        when the subscription is gone."""
        fut: asyncio.Future[_Probed] = asyncio.get_running_loop().create_future()
        self._pending.setdefault((namespace_id, subscription_id), []).append(fut)
        if self._drainer is None or self._drainer.done():
            self._drainer = asyncio.ensure_future(self._drain())
        return await fut

    async def _drain(self) -> None:
        while self._pending:
            await asyncio.sleep(0)  # let the probes of this turn of the loop join
            keys = list(self._pending)[:PROBE_BATCH]
            waiters = {k: self._pending.pop(k) for k in keys}
            self.statements += 1
            self.probed += len(keys)
            try:
                seen = await self.db.read(
                    lambda tx, k=keys: store.delivery_lease_probe_many(tx, k)  # type: ignore[misc]
                )
            except Exception as exc:
                for futs in waiters.values():
                    for f in futs:
                        if not f.done():
                            f.set_exception(exc)
                continue
            for k, futs in waiters.items():
                for f in futs:
                    if not f.done():
                        f.set_result(seen.get(k))


async def lease(
    db: Database,
    namespace_id: bytes,
    subscription_id: bytes,
    want: int,
    *,
    now: datetime | None = None,
    pump: bool = True,
    probes: LeaseProbes | None = None,
) -> LeaseBatch:
    """Hand out up to ``want`` deliveries of one subscription in one transaction.

    Locks the subscription row (waiting for it: pumps and other consumers hold it briefly),
    pumps one batch of new events (``pump``), reclaims expired leases, then leases due
    deliveries within ``max_in_flight``. NotFound when the subscription is gone.

    On the database clock (``now`` None, ``pump``) a non-locking probe runs first and the
    call returns no deliveries without locking anything when there is nothing to pump, hand
    out or reclaim, or when ``max_in_flight`` is reached with nothing to pump or reclaim.
    With ``probes`` the probe is coalesced with other consumers' (:class:`LeaseProbes`).
    """

    if now is None and pump:
        # Most hand-outs of a consumer that keeps up find nothing to do (it polls, and wakes
        # on every new delivery of its namespace): one non-locking statement says so, and
        # the subscription row is locked only when there is something to pump, hand out or
        # reclaim. (A change committed after the probe is seen by the next poll or wake.)
        async def look(tx: Tx) -> tuple[SubscriptionRow, store.LeaseProbe] | None:
            return await store.delivery_lease_probe(tx, namespace_id, subscription_id)

        seen = (
            await probes.probe(namespace_id, subscription_id)
            if probes is not None
            else await db.read(look)
        )
        if seen is None:
            raise NotFound("subscription")
        sub_seen, probe = seen
        caught_up = sub_seen.after_seq >= probe.last_seq and not probe.expired
        full = probe.in_flight >= sub_seen.max_in_flight
        if probe.idle(sub_seen.after_seq) or (caught_up and full):
            return LeaseBatch(subscription=sub_seen, deliveries=[], in_flight=probe.in_flight)

    async def run(tx: Tx) -> LeaseBatch:
        sub, at = await _lock_with_clock(tx, namespace_id, subscription_id, now)
        if sub is None:
            raise NotFound("subscription")
        # The pump and the reclaim touch different deliveries (new PENDING ones; expired
        # LEASED ones) under the one subscription lock: their statements go together.
        await tx.pipeline(
            *([pump_locked(tx, sub, at)] if pump else []), reclaim_locked(tx, sub, at)
        )
        if want <= 0:
            in_flight = await store.delivery_count_leased(tx, namespace_id, subscription_id)
            return LeaseBatch(subscription=sub, deliveries=[], in_flight=in_flight)
        out, in_flight = await hand_out_locked(tx, sub, want, at)
        return LeaseBatch(subscription=sub, deliveries=out, in_flight=in_flight)

    return await db.transaction(run)


async def _lock_with_clock(
    tx: Tx,
    namespace_id: bytes,
    subscription_id: bytes,
    now: datetime | None,
    skip_locked: bool = False,
) -> tuple[SubscriptionRow | None, datetime]:
    """The subscription row locked, and the time to decide at (``now`` or the database
    clock): ONE round trip."""
    sub, at = await tx.pipeline(
        sub_store.subscription_lock(tx, namespace_id, subscription_id, skip_locked=skip_locked),
        store.delivery_clock_now(tx, now),
    )
    return sub, at


async def reclaim_subscription(
    db: Database,
    namespace_id: bytes,
    subscription_id: bytes,
    *,
    now: datetime | None = None,
    limit: int = RECLAIM_BATCH,
) -> tuple[int, int] | None:
    """Reclaim expired leases of one subscription (skipped, None, when it is locked)."""

    async def run(tx: Tx) -> tuple[int, int] | None:
        sub, at = await _lock_with_clock(tx, namespace_id, subscription_id, now, True)
        if sub is None:
            return None
        return await reclaim_locked(tx, sub, at, limit)

    return await db.transaction(run)
