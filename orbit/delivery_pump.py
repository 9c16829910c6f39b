"""The hand-out: everything done under a subscription's row lock.

* :func:`hand_out_locked` — first the due exceptions (``orbit_deliveries`` rows: nacked,
  expired, released or revived deliveries, and rows from before delivery ranges), each under
  a new one-time proof; then new result events after the subscription's cursor
  (``after_seq``) that match its filter, as ONE range row (:mod:`orbit.delivery_ranges`),
  and the cursor advanced — in one transaction. Nothing is written for events before they
  are handed out, so a subscription's storage grows with what is in flight, not with its
  backlog.
* :func:`reclaim_locked` / :func:`reclaim_subscription` — expired leases: rows back to
  PENDING (after backoff) or EXHAUSTED; open slots of expired ranges materialised the same
  way.
* :func:`lease` — reclaim, then hand out within ``max_in_flight``.

Holding the subscription row (``FOR UPDATE``; the background sweep uses ``SKIP LOCKED``) is
what makes these safe on many nodes: one hand-out per subscription at a time, an exact count
of leased deliveries for ``max_in_flight`` (LEASED rows plus open slots of LEASED ranges).
Ack, nack, release and budget (:mod:`orbit.deliveries`) lock only range and delivery rows,
so the lock order is always subscription row → range rows → delivery rows, never the
reverse; the reclaim locks with ``SKIP LOCKED`` so it never waits on an ack round. The rules
(states, backoff, proofs) are in :mod:`orbit.deliveries`; docs/delivery-semantics.md
explains the guarantees.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime, timedelta

from orbit import delivery_ranges as dr
from orbit import delivery_slots
from orbit.deliveries import DeliveryState, Leased, after_failure, backoff_ms
from orbit.delivery_budget import Ask, HandOutBudget
from orbit.delivery_probes import PROBE_BATCH, LeaseProbes  # noqa: F401 (re-exported)
from orbit.errors import Conflict, NotFound, OrbitError
from orbit.events import ResultEvent, result_event_from_row
from orbit.ids import digest, id_hex, new_id, new_secret
from orbit.pagination import MAX_PAGE_BYTES
from orbit.rounds import NodeRound
from orbit.storage import Database, Tx
from orbit.store import deliveries as store
from orbit.store import delivery_ranges as range_store
from orbit.store import subscriptions as sub_store
from orbit.store.clock import clock_now
from orbit.store.subscriptions import SubscriptionRow
from orbit.subscriptions import compile_filter

log = logging.getLogger("orbit.deliveries")

#: Result events read per statement while looking for matching ones (a selective filter).
SCAN_BATCH = 500
#: Statements of SCAN_BATCH one hand-out reads at most (then the next hand-out goes on).
SCAN_ROUNDS = 4
#: Expired leases (rows, ranges) reclaimed per transaction.
RECLAIM_BATCH = 500


@dataclass
class HandOutStats:
    """What this process's hand-outs did (``orbit_deliveries_created_total`` and friends)."""

    created: int = 0  # first-time deliveries handed out (slots of new ranges)
    ranges: int = 0  # range rows written
    redelivered: int = 0  # exception rows handed out again


#: This process's hand-out totals (read by the delivery loop's metrics).
STATS = HandOutStats()


@dataclass(frozen=True, slots=True)
class LeaseBatch:
    """The hand-outs of one :func:`lease` call and the subscription config they used."""

    subscription: SubscriptionRow
    deliveries: list[Leased]
    in_flight: int  # leased deliveries of the subscription after this hand-out
    behind: bool = False  # result events after the cursor are left (hand out again at once)
    retry_in_s: float | None = None  # when nothing was handed out: the next PENDING one is due


# ---------------------------------------------------------------------------------------------
# Lease expiry
# ---------------------------------------------------------------------------------------------


async def reclaim_locked(
    tx: Tx, sub: SubscriptionRow, now: datetime, limit: int = RECLAIM_BATCH
) -> tuple[int, int]:
    """Expired leases of ``sub`` (row locked by this transaction) back to PENDING after
    backoff, or EXHAUSTED; return (redelivered, exhausted). Rows and open slots of ranges
    alike; the backoff counts from the lease's end, not from when this runs."""
    ranges, rows = await tx.pipeline(  # lock order: ranges, then delivery rows
        range_store.range_list_expired_for_update(tx, sub.namespace_id, sub.id, now, limit),
        store.delivery_list_expired_for_update(tx, sub.namespace_id, sub.id, now, limit),
    )
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
    edits = delivery_slots.Edits()
    for rng in ranges:
        slots = edits.slots(rng)
        state, next_at = after_failure(1, rng.budget, rng.lease_expires_at, backoff_ms(1))
        for i in range(len(slots)):
            if slots.is_open(i):
                edits.materialise(rng, i, state=state.value, next_at=next_at, now=now)
                states.append(state)
    done = list(await tx.pipeline(*requeues))  # every guarded requeue in one round trip
    if edits.ranges:
        await delivery_slots.write(tx, edits, now=now)
        done += [True] * len(edits.rows)
    exhausted = sum(
        1 for s, ok in zip(states, done, strict=True) if ok and s is DeliveryState.EXHAUSTED
    )
    redelivered = sum(done) - exhausted
    return redelivered, exhausted


# ---------------------------------------------------------------------------------------------
# Hand-out
# ---------------------------------------------------------------------------------------------


async def in_flight_locked(tx: Tx, sub: SubscriptionRow) -> int:
    """LEASED rows plus open slots of LEASED ranges (exact under the subscription lock):
    ONE statement."""
    return await store.delivery_in_flight(tx, sub.namespace_id, sub.id)


async def hand_out_locked(
    tx: Tx,
    sub: SubscriptionRow,
    want: int,
    now: datetime,
    max_bytes: int = MAX_PAGE_BYTES,
    *,
    budget: HandOutBudget | None = None,
    rows: bool = True,
) -> tuple[list[Leased], int, bool]:
    """Lease up to ``want`` deliveries of ``sub`` (row locked by this transaction), never
    more than ``max_in_flight`` leased at once nor, past the first, more than ``max_bytes``
    of stored result JSON (:mod:`orbit.delivery_budget`; ``budget`` instead splits one
    hand-out among several asks): due exceptions first, then new events as one range.
    ``rows`` False skips the due rows (a probe saw none due and no lease ended).
    Return (hand-outs, leased after, deliveries left that could be handed out at once)."""
    in_flight = await in_flight_locked(tx, sub)
    if budget is None:
        budget = HandOutBudget.single(want, max_bytes)
    budget.limit = room = min(budget.wanted, sub.max_in_flight - in_flight, dr.MAX_SLOTS)
    if room <= 0:
        return [], in_flight, False
    out = await _hand_out_rows(tx, sub, budget, now) if rows else []
    behind = budget.cut
    if budget.open:
        fresh, behind = await _hand_out_range(tx, sub, budget, now)
        out += fresh
    return out, in_flight + len(out), behind


async def _hand_out_rows(
    tx: Tx, sub: SubscriptionRow, budget: HandOutBudget, now: datetime
) -> list[Leased]:
    """Due PENDING rows within the budget, each under a new proof (ONE guarded multi-row
    UPDATE). The rows are sized first; those past the budget stay PENDING, not leased."""
    due = await store.delivery_list_due_for_update(tx, sub.namespace_id, sub.id, now, budget.limit)
    if not due:
        return []
    sizes = await store.delivery_event_sizes_by_seq(tx, sub.namespace_id, [r.seq for r in due])
    rows = []
    for row in due:
        if not budget.take(sizes.get(row.seq, 0)):
            break
        rows.append(row)
    if not rows:
        return []
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
    STATS.redelivered += len(rows)
    events = {int(r["seq"]): r for r in event_rows}
    out: list[Leased] = []
    for row, proof in zip(rows, proofs, strict=True):
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
                event=result_event_from_row(ev),
                proof=proof,
            )
        )
    return out


async def _hand_out_range(
    tx: Tx, sub: SubscriptionRow, budget: HandOutBudget, now: datetime
) -> tuple[list[Leased], bool]:
    """New matching events after the cursor, within the budget, as ONE range row; the cursor
    moves past every event considered (matched or not), never past one left for later. The
    events are scanned with their sizes, no further than the bytes the budget has left and
    with their results only within those bytes; a chosen event whose result did not come is
    read with the range write. Returns (hand-outs, events left
    after the cursor)."""
    flt = compile_filter(sub)
    selective = any(v is not None for v in (flt.queues, flt.kinds, flt.states, flt.owner_id))
    batch = SCAN_BATCH if selective else budget.limit - budget.taken
    position = sub.after_seq
    matched: list[ResultEvent] = []
    later: list[int] = []  # seqs of matched events whose result the scan did not carry
    behind = False
    for _ in range(SCAN_ROUNDS):
        reach = budget.bytes_left
        rows = await store.delivery_event_scan_after(tx, sub.namespace_id, position, batch, reach)
        cut = bool(rows) and int(rows[-1]["walk_bytes"] or 0) >= reach  # sized up to reach
        full = False
        for row in rows:
            ev = result_event_from_row(row)
            if ev.seq != position + 1:  # ruled out by orbit.events' locking: only a guard
                log.warning("result stream gap in namespace %s after seq %d",
                            id_hex(sub.namespace_id), position)  # fmt: skip
                rows, cut = [], False
                break
            if flt.matches(ev):
                if not budget.take(int(row["page_bytes"] or 0)):
                    full = True
                    break
                matched.append(ev)
                if not row["inline"]:
                    later.append(ev.seq)
            position = ev.seq
        if full or not budget.open:
            behind = True  # maybe more: the caller asks again (a probe says if not)
            break
        if len(rows) < batch and not cut:
            break
    else:
        behind = True  # SCAN_ROUNDS full batches read: maybe more
    if position == sub.after_seq:
        return [], behind
    lease_end = now + timedelta(milliseconds=sub.ack_timeout_ms)
    writes = []
    range_id = new_id()
    bucket, ids = dr.new_delivery_ids(len(matched))
    proofs = [dr.make_proof(range_id, i) for i in range(len(matched))]
    if matched:
        writes.append(range_store.range_insert_many(tx, [{
            "namespace_id": sub.namespace_id,
            "id": range_id,
            "subscription_id": sub.id,
            "id_bucket": dr.bucket_of(bucket),
            "seq_lo": matched[0].seq,
            "seq_hi": matched[-1].seq,
            "n": len(matched),
            "seqs": dr.pack_seqs([ev.seq for ev in matched]),
            "event_ids": dr.pack_fixed([ev.event_id for ev in matched], dr.ID_BYTES),
            "delivery_ids": dr.pack_fixed(ids, dr.ID_BYTES),
            "proof_digests": dr.pack_fixed([digest(p) for p in proofs], dr.DIGEST_BYTES),
            "acked_us": dr.pack_seqs([0] * len(matched)),
            "moved": dr.empty_bitmap(len(matched)),
            "budget": sub.max_deliveries,
            "lease_expires_at": lease_end,
            "now": now,
        }]))  # fmt: skip
    # The range, the new cursor (guarded by its old value) and the results the scan did not
    # carry: ONE round trip.
    *_, advanced, event_rows = await tx.pipeline(
        *writes,
        sub_store.subscription_advance_if_position(
            tx, sub.namespace_id, sub.id, sub.after_seq, position
        ),
        store.delivery_event_list_by_seq(tx, sub.namespace_id, later),
    )
    if not advanced:
        raise Conflict("subscription cursor moved concurrently", kind="handout_position")
    read = {int(r["seq"]): result_event_from_row(r) for r in event_rows}
    out = [
        Leased(
            delivery_id=did,
            seq=ev.seq,
            event_id=ev.event_id,
            attempt=1,
            lease_expires_at=lease_end,
            event=read.get(ev.seq, ev),
            proof=proof,
        )
        for did, ev, proof in zip(ids, matched, proofs, strict=True)
    ]
    STATS.created += len(out)  # counted before COMMIT: a rolled-back hand-out counts too
    STATS.ranges += 1 if out else 0
    return out, behind


@dataclass(frozen=True, slots=True)
class LeaseAsk:
    """One consumer's hand-out request in a node round (:func:`lease_round`)."""

    namespace_id: bytes
    subscription_id: bytes
    want: int
    max_bytes: int = MAX_PAGE_BYTES
    #: What the probe before the ask saw (:class:`~orbit.store.deliveries.LeaseProbe`): a
    #: lease ended (so reclaim), a PENDING delivery due (so read the due rows). False skips
    #: that step's statements; what became so since the probe waits for the next hand-out.
    expired: bool = True
    due: bool = True


async def lease_round(db: Database, asks: Sequence[LeaseAsk]) -> list[LeaseBatch | OrbitError]:
    """The hand-outs of every consumer of this node that asked while the previous round ran,
    across namespaces and subscriptions, in ONE transaction: the subscription rows locked in
    one statement ((namespace, id) order), then each subscription's reclaim and hand-out
    with their statements sent together (one round trip per step for all of them). Several
    asks of one subscription share its room: each gets up to its ``want`` and its
    ``max_bytes`` in order (:class:`~orbit.delivery_budget.HandOutBudget`). Per ask, its
    :class:`LeaseBatch` or NotFound for a gone subscription."""
    if not asks:
        return []
    keys = sorted({(a.namespace_id, a.subscription_id) for a in asks})
    shares: dict[tuple[bytes, bytes], list[Ask]] = {}
    steps: dict[tuple[bytes, bytes], tuple[bool, bool]] = {}  # (expired, due) of any ask
    for a in asks:
        k = (a.namespace_id, a.subscription_id)
        shares.setdefault(k, []).append(Ask(max(0, a.want), a.max_bytes))
        expired, due = steps.get(k, (False, False))
        steps[k] = (expired or a.expired, due or a.due)

    async def run(tx: Tx) -> list[LeaseBatch | OrbitError]:
        # The rows and the clock once they are locked: one statement (none locked: no time
        # needed, nothing is handed out).
        subs, at = await sub_store.subscription_lock_keys_clock(tx, keys)
        locked = [s for s in subs if (s.namespace_id, s.id) in shares]
        budgets = {(s.namespace_id, s.id): HandOutBudget(shares[(s.namespace_id, s.id)], 0)
                   for s in locked}  # fmt: skip
        done: list[LeaseBatch] = []
        if at is not None:
            done = await tx.pipeline(
                *(
                    _lease_locked(tx, s, budgets[k], at, *steps[k])
                    for s in locked
                    for k in [(s.namespace_id, s.id)]
                )
            )
        batches = {(s.namespace_id, s.id): b for s, b in zip(locked, done, strict=True)}
        out: list[LeaseBatch | OrbitError] = []
        taken: dict[tuple[bytes, bytes], tuple[int, int]] = {}  # (asks served, deliveries)
        for a in asks:
            k = (a.namespace_id, a.subscription_id)
            got = batches.get(k)
            if got is None:
                out.append(NotFound("subscription"))
                continue
            served, start = taken.get(k, (0, 0))
            end = start + budgets[k].shares[served]
            taken[k] = (served + 1, end)
            out.append(LeaseBatch(subscription=got.subscription,
                                  deliveries=got.deliveries[start:end],
                                  in_flight=got.in_flight, behind=got.behind))  # fmt: skip
        return out

    return await db.transaction(run)


async def _lease_locked(
    tx: Tx,
    sub: SubscriptionRow,
    budget: HandOutBudget,
    at: datetime,
    expired: bool = True,
    due: bool = True,
) -> LeaseBatch:
    """Reclaim (when a probe saw a lease ended, or without a probe), then hand out within
    ``budget``, for ``sub`` whose row this transaction holds. Due rows are read when a
    probe saw one due or a lease ended (a reclaimed delivery may be due at once)."""
    if expired:
        await reclaim_locked(tx, sub, at)
    if budget.wanted <= 0:
        return LeaseBatch(
            subscription=sub, deliveries=[], in_flight=await in_flight_locked(tx, sub)
        )
    out, in_flight, behind = await hand_out_locked(
        tx, sub, 0, at, budget=budget, rows=due or expired
    )
    return LeaseBatch(subscription=sub, deliveries=out, in_flight=in_flight, behind=behind)


async def lease(
    db: Database,
    namespace_id: bytes,
    subscription_id: bytes,
    want: int,
    *,
    max_bytes: int = MAX_PAGE_BYTES,
    now: datetime | None = None,
    probes: LeaseProbes | None = None,
    rounds: NodeRound[LeaseAsk, LeaseBatch] | None = None,
) -> LeaseBatch:
    """Hand out up to ``want`` deliveries of one subscription in one transaction, and past
    the first no more than ``max_bytes`` of stored result JSON (:mod:`orbit.delivery_budget`:
    the rest stay available to the next hand-out, ``behind`` is then True).

    Locks the subscription row (waiting for it: other consumers hold it briefly), reclaims
    expired leases, then hands out due exceptions and new events within ``max_in_flight``.
    NotFound when the subscription is gone.

    On the database clock (``now`` None) a non-locking probe runs first and the call returns
    no deliveries without locking anything when there is nothing to hand out or reclaim, or
    when ``max_in_flight`` is reached with nothing to reclaim. With ``probes`` the probe is
    coalesced with other consumers' (:class:`LeaseProbes`); with ``rounds`` (the node's
    round of hand-outs, :func:`lease_round`) the hand-out shares one transaction with every
    other consumer's of this node that asked meanwhile.
    """

    if now is None:
        # Most hand-outs of a consumer that keeps up find nothing to do: one non-locking
        # statement says so, and the subscription row is locked only when there is
        # something to hand out or reclaim. (A change committed after the probe is seen by
        # the next poll or wake.)
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
        full = probe.in_flight >= sub_seen.max_in_flight
        if probe.idle(sub_seen.after_seq) or (full and not probe.expired):
            return LeaseBatch(subscription=sub_seen, deliveries=[], in_flight=probe.in_flight,
                              retry_in_s=None if full else probe.retry_in_s)  # fmt: skip
        if rounds is not None:
            return await rounds.submit(
                LeaseAsk(namespace_id, subscription_id, want, max_bytes, probe.expired, probe.due)
            )
        expired, due = probe.expired, probe.due
    else:
        expired = due = True

    async def run(tx: Tx) -> LeaseBatch:
        sub, at = await _lock_with_clock(tx, namespace_id, subscription_id, now)
        if sub is None:
            raise NotFound("subscription")
        budget = HandOutBudget.single(max(0, want), max_bytes)
        return await _lease_locked(tx, sub, budget, at, expired, due)

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
        clock_now(tx, now),
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
