"""Deliveries: each delivery's lease, proof and attempt budget — the rules, and everything
done under range and delivery row locks (docs/api/subscriptions.md). The hand-out, done
under the subscription's row lock, is in :mod:`orbit.delivery_pump`; first-time deliveries
live as slots of range rows (:mod:`orbit.delivery_ranges`) until an exception (nack,
expiry, release, budget) materialises one as its own row, where this module's per-row
machinery applies.

State machine (drawn in docs/delivery-semantics.md)::

    PENDING --hand-out--> LEASED --ack--> ACKED
       ^                    |
       +--nack / expiry ----+  (attempts < budget, after backoff)
                            +--nack / expiry--> EXHAUSTED --budget--> PENDING

Rules:

* **Hand-out** (:func:`orbit.delivery_pump.lease`) counts one attempt and gets a NEW
  one-time proof (only its SHA-256 digest is stored); the delivery id never changes. At most
  ``max_in_flight`` deliveries of a subscription are leased at once, across every connection
  and pull (like JetStream's ``max_ack_pending``).
* **Ack** with the proof of the latest hand-out is idempotent: ACKED once, a repeat answers
  ``replayed`` and changes nothing. A wrong or superseded proof → :class:`StaleProof` (409).
  An ack that arrives after the lease ended still counts while no newer hand-out replaced
  the proof (the work was done; redelivering it would only make a duplicate).
* **Nack** (optional ``retry_after_ms``) and lease expiry put it back to PENDING after a
  backoff (:func:`backoff_ms`), or to EXHAUSTED when ``attempts == budget``. EXHAUSTED
  deliveries are kept; :func:`add_budget` raises the budget and revives them; ``attempts``
  is never reset.
* **Release** (:func:`release_many`): a WebSocket connection that closes gives its unacked
  deliveries back at once (no backoff), so a reconnecting consumer gets them immediately;
  the attempt still counts. A consumer that dies without closing gets them back when the
  lease expires.

All decisions use the database clock (``now`` parameters pin it in tests).
"""

from __future__ import annotations

import logging
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from enum import StrEnum
from typing import Any

import msgspec

from orbit import backoff, delivery_slots
from orbit import delivery_ranges as dr
from orbit.errors import Conflict, InvalidRequest, NotFound, OrbitError
from orbit.events import ResultEvent
from orbit.ids import digest_matches, id_hex
from orbit.storage import Database, Tx
from orbit.store import deliveries as store
from orbit.store import delivery_ranges as range_store
from orbit.store.clock import clock_now
from orbit.store.deliveries import DeliveryRow
from orbit.store.delivery_ranges import RangeRow
from orbit.times import format_opt, format_time

log = logging.getLogger("orbit.deliveries")

#: Backoff after a nack without ``retry_after_ms`` or a lease expiry: the n-th attempt's
#: failure waits min(BACKOFF_MAX_MS, BACKOFF_INITIAL_MS * 2**(n-1)).
BACKOFF_INITIAL_MS = 1_000
BACKOFF_MAX_MS = 60_000
#: Largest ``retry_after_ms`` a nack may ask for (one day) and largest budget addition.
MAX_RETRY_AFTER_MS = 24 * 3600 * 1000
MAX_BUDGET_ADD = 1000
BUDGET_ACTION = "deliveries.budget"


class DeliveryState(StrEnum):
    """Where a delivery is in its life."""

    PENDING = "PENDING"  # waiting to be handed out (possibly in backoff until next_at)
    LEASED = "LEASED"  # handed out under a proof until lease_expires_at
    ACKED = "ACKED"  # acknowledged with its proof: final
    EXHAUSTED = "EXHAUSTED"  # attempts reached the budget: kept, revivable with budget


class StaleProof(Conflict):
    """409 ``stale_proof``: the proof is wrong, or a newer hand-out replaced it."""

    code = "stale_proof"

    def __init__(self, message: str = "delivery proof is stale or wrong", **details: Any) -> None:
        super().__init__(message, kind="stale_proof", **details)


# ---------------------------------------------------------------------------------------------
# Pure rules
# ---------------------------------------------------------------------------------------------


def backoff_ms(attempts: int) -> int:
    """Delay before the next hand-out after the ``attempts``-th one failed (nack/expiry)."""
    return backoff.backoff_ms(attempts, BACKOFF_INITIAL_MS, BACKOFF_MAX_MS)


def after_failure(
    attempts: int, budget: int, base: datetime, delay_ms: int
) -> tuple[DeliveryState, datetime]:
    """State and next_at after a failed hand-out: EXHAUSTED when the budget is spent."""
    if attempts >= budget:
        return DeliveryState.EXHAUSTED, base
    return DeliveryState.PENDING, base + timedelta(milliseconds=delay_ms)


# ---------------------------------------------------------------------------------------------
# Results and wire forms
# ---------------------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Leased:
    """One hand-out: the delivery, its clear one-time proof and the event snapshot.

    ``proof`` is secret: it is sent to the consumer once and never logged.
    """

    delivery_id: bytes
    seq: int
    event_id: bytes
    attempt: int
    lease_expires_at: datetime
    event: ResultEvent
    proof: str = field(repr=False)


class DeliveryOut(msgspec.Struct, frozen=True, kw_only=True):
    """A handed-out delivery (pull answer items and the WebSocket ``delivery`` frame body)."""

    delivery_id: str
    seq: int
    event_id: str
    proof: str
    event: msgspec.Raw
    attempt: int
    lease_expires_at: str


class DeliveryInfo(msgspec.Struct, frozen=True, kw_only=True):
    """A delivery in history, ack, nack and budget answers (never a proof)."""

    delivery_id: str
    seq: int
    event_id: str
    state: str
    attempts: int
    budget: int
    lease_expires_at: str | None
    next_at: str | None
    acked_at: str | None
    created_at: str
    updated_at: str


class AckResult(msgspec.Struct, frozen=True, kw_only=True):
    """``POST .../deliveries/{id}/ack``: ``applied`` the first time, ``replayed`` after."""

    outcome: str
    delivery: DeliveryInfo


_EVENT_JSON = msgspec.json.Encoder()


def event_json(event: ResultEvent) -> msgspec.Raw:
    """The API object of a result event, encoded once (``result`` kept byte for byte)."""
    return msgspec.Raw(_EVENT_JSON.encode(event.to_wire()))


def delivery_out(d: Leased) -> DeliveryOut:
    return DeliveryOut(
        delivery_id=id_hex(d.delivery_id),
        seq=d.seq,
        event_id=id_hex(d.event_id),
        proof=d.proof,
        event=event_json(d.event),
        attempt=d.attempt,
        lease_expires_at=format_time(d.lease_expires_at),
    )


def delivery_info(row: DeliveryRow) -> DeliveryInfo:
    return DeliveryInfo(
        delivery_id=id_hex(row.id),
        seq=row.seq,
        event_id=id_hex(row.event_id),
        state=row.state,
        attempts=row.attempts,
        budget=row.budget,
        lease_expires_at=format_opt(row.lease_expires_at),
        next_at=None if row.state in ("ACKED", "EXHAUSTED") else format_time(row.next_at),
        acked_at=format_opt(row.acked_at),
        created_at=format_time(row.created_at),
        updated_at=format_time(row.updated_at),
    )


# ---------------------------------------------------------------------------------------------
# Ack, nack, release, budget
# ---------------------------------------------------------------------------------------------


def _check_proof(row: DeliveryRow, proof: str) -> None:
    if row.proof_digest is None or not digest_matches(proof, row.proof_digest):
        raise StaleProof(delivery_id=id_hex(row.id))


async def _locked_row(
    tx: Tx, namespace_id: bytes, delivery_id: bytes, *, proof: str | None
) -> DeliveryRow:
    """The delivery's ``orbit_deliveries`` row, locked. Raises NotFound when it has none —
    or StaleProof when ``proof`` is given and the delivery lives in a range slot (a proof
    that does not locate its slot is not its proof)."""
    row = await store.delivery_get(tx, namespace_id, delivery_id, for_update=True)
    if row is not None:
        return row
    if proof is not None and await delivery_slots.find_slot(tx, namespace_id, delivery_id):
        raise StaleProof(delivery_id=id_hex(delivery_id))
    raise NotFound("delivery")


async def _reread(tx: Tx, row: DeliveryRow) -> DeliveryRow:
    fresh = await store.delivery_get(tx, row.namespace_id, row.id)
    assert fresh is not None
    return fresh


class AckItem(msgspec.Struct, frozen=True):
    """One ack of a node round: the delivery (namespace, id) and the proof presented."""

    namespace_id: bytes
    delivery_id: bytes
    proof: str


async def ack(
    db: Database,
    namespace_id: bytes,
    delivery_id: bytes,
    proof: str,
    *,
    now: datetime | None = None,
) -> AckResult:
    """Acknowledge a delivery with the proof of its latest hand-out.

    ``applied`` the first time; ``replayed`` when it is already ACKED with that proof
    (nothing changes, nothing is counted twice). StaleProof (409) for any other proof,
    NotFound (404) for an unknown delivery.
    """
    (outcome,) = await ack_round(db, [AckItem(namespace_id, delivery_id, proof)], now=now)
    if isinstance(outcome, OrbitError):
        raise outcome
    return outcome


#: Most acks applied in one round (:func:`ack_round`).
ACK_BATCH = 1024

_Key = tuple[bytes, bytes]


async def ack_round(
    db: Database, items: Sequence[AckItem], *, now: datetime | None = None
) -> list[AckResult | OrbitError]:
    """Acknowledge deliveries of any namespaces and subscriptions in ONE transaction (a node
    round of acks, :class:`orbit.rounds.NodeRound`): per item, in order, its
    :class:`AckResult` or the error :func:`ack` would raise for it alone
    (:class:`StaleProof`, :class:`NotFound`).

    A range proof locates its slot: the round locks those range rows by primary key (one
    statement, (namespace, id) order), checks each slot's delivery id and proof digest and
    sets its ack time; other proofs lock their ``orbit_deliveries`` row (one statement, after
    the ranges: the lock order). All applied acks are written with ONE guarded multi-row
    UPDATE per table, matched counts checked. Each item is judged alone, exactly as
    :func:`ack` judges it; the same delivery twice in a round: the first applies, the second
    replays. A failing statement fails the whole round (nothing is acked).
    """
    if not items:
        return []
    located = [dr.parse_proof(i.proof) for i in items]

    async def run(tx: Tx) -> list[AckResult | OrbitError]:
        range_keys = sorted(
            {(i.namespace_id, loc[0]) for i, loc in zip(items, located, strict=True) if loc}
        )
        row_keys = sorted({(i.namespace_id, i.delivery_id) for i, loc in zip(items, located, strict=True)
                           if loc is None})  # fmt: skip
        # The ranges (with the clock once they are locked) and the rows: one round trip.
        (ranges, clock), locked = await tx.pipeline(
            range_store.range_lock_keys_clock(tx, range_keys),
            store.delivery_lock_keys(tx, row_keys),
        )
        at = now or clock or await clock_now(tx)
        edits = delivery_slots.Edits()
        by_range = {(r.namespace_id, r.id): r for r in ranges}
        verdicts: list[tuple[str, RangeRow | None, int]] = []
        extra: set[_Key] = set()  # rows needed after all: moved slots, proofs of no slot
        for item, loc in zip(items, located, strict=True):
            rng = by_range.get((item.namespace_id, loc[0])) if loc else None
            index = loc[1] if loc else 0
            how = (
                "row"
                if loc is None
                else delivery_slots.locate(
                    rng, edits.slots(rng) if rng else None, index, item.delivery_id, item.proof
                )
            )
            if how in ("moved", "other"):
                extra.add((item.namespace_id, item.delivery_id))
            verdicts.append((how, rng, index))
        rows: dict[_Key, DeliveryRow] = {(r.namespace_id, r.id): r for r in locked}
        missing = sorted(extra - rows.keys())
        if missing:
            rows.update({(r.namespace_id, r.id): r for r in
                         await store.delivery_lock_keys(tx, missing)})  # fmt: skip
        out: list[AckResult | OrbitError] = []
        done: dict[_Key, DeliveryRow] = {}
        writes: list[DeliveryRow] = []
        for item, (how, rng, index) in zip(items, verdicts, strict=True):
            key = (item.namespace_id, item.delivery_id)
            if how in ("open", "acked") and rng is not None:
                slots = edits.slots(rng)
                if slots.is_open(index):
                    slots.ack(index, at)
                    row = delivery_slots.slot_row(rng, slots, index)
                    out.append(AckResult(outcome="applied", delivery=delivery_info(row)))
                else:
                    row = delivery_slots.slot_row(rng, slots, index)
                    out.append(AckResult(outcome="replayed", delivery=delivery_info(row)))
                continue
            if how == "stale":
                out.append(StaleProof(delivery_id=id_hex(item.delivery_id)))
                continue
            current: DeliveryRow | None = done.get(key) or rows.get(key)
            if current is None:
                found = await delivery_slots.find_slot(tx, item.namespace_id, item.delivery_id)
                out.append(StaleProof(delivery_id=id_hex(item.delivery_id)) if found
                           else NotFound("delivery"))  # fmt: skip
            elif current.proof_digest is None or not digest_matches(
                item.proof, current.proof_digest
            ):
                out.append(StaleProof(delivery_id=id_hex(current.id)))
            elif current.state == DeliveryState.ACKED:
                out.append(AckResult(outcome="replayed", delivery=delivery_info(current)))
            else:
                writes.append(current)
                done[key] = acked = msgspec.structs.replace(
                    current, state=DeliveryState.ACKED.value, acked_at=at, lease_expires_at=None,
                    revision=current.revision + 1, updated_at=at,
                )  # fmt: skip
                out.append(AckResult(outcome="applied", delivery=delivery_info(acked)))
        changed = [(r, s) for r, s in edits.ranges.values() if s.acked_us != r.slots().acked_us]
        counts = await tx.pipeline(
            range_store.range_update_many(tx, changed, now=at),
            store.deliveries_ack(tx, writes, now=at),
        )
        if counts != [len(changed), len(writes)]:
            # The rows are locked by this transaction: only a bug gets here.
            raise Conflict("delivery changed concurrently", kind="cas")
        return out

    return await db.transaction(run)


async def ack_many(
    db: Database,
    namespace_id: bytes,
    items: Sequence[tuple[bytes, str]],
    *,
    now: datetime | None = None,
) -> list[str | OrbitError]:
    """:func:`ack_round` for (delivery id, proof) pairs of one namespace: per item
    ``"applied"``, ``"replayed"`` or its error."""
    outcomes = await ack_round(db, [AckItem(namespace_id, d, p) for d, p in items], now=now)
    return [o if isinstance(o, OrbitError) else o.outcome for o in outcomes]


async def _locate_for_update(
    tx: Tx, namespace_id: bytes, delivery_id: bytes, proof: str
) -> tuple[str, RangeRow | None, int, delivery_slots.Edits]:
    """Lock the range a range proof points at and say how the proof relates to the slot
    (:func:`orbit.delivery_slots.locate`; ``"row"`` for other proofs)."""
    edits = delivery_slots.Edits()
    loc = dr.parse_proof(proof)
    if loc is None:
        return "row", None, 0, edits
    found = await range_store.range_lock_keys(tx, [(namespace_id, loc[0])])
    rng = found[0] if found else None
    how = delivery_slots.locate(rng, edits.slots(rng) if rng else None, loc[1], delivery_id, proof)
    return how, rng, loc[1], edits


async def nack(
    db: Database,
    namespace_id: bytes,
    delivery_id: bytes,
    proof: str,
    retry_after_ms: int | None = None,
    *,
    now: datetime | None = None,
) -> DeliveryInfo:
    """Give a leased delivery back: PENDING after ``retry_after_ms`` (default: backoff by
    attempts), or EXHAUSTED when its budget is spent.

    Idempotent: a repeat nack (already PENDING or EXHAUSTED under that proof) changes
    nothing. Conflict (409) when it was already acked; StaleProof (409) for another proof.
    """
    if retry_after_ms is not None and not 0 <= retry_after_ms <= MAX_RETRY_AFTER_MS:
        raise InvalidRequest(
            f"retry_after_ms must be from 0 to {MAX_RETRY_AFTER_MS}", field="retry_after_ms"
        )

    async def run(tx: Tx) -> DeliveryInfo:
        how, rng, index, edits = await _locate_for_update(tx, namespace_id, delivery_id, proof)
        if how == "stale":
            raise StaleProof(delivery_id=id_hex(delivery_id))
        if how == "acked":
            raise Conflict("delivery is already acked", kind="delivery_acked")
        if how == "open" and rng is not None:
            at = now or await clock_now(tx)
            delay = backoff_ms(1) if retry_after_ms is None else retry_after_ms
            state, next_at = after_failure(1, rng.budget, at, delay)
            row = edits.materialise(rng, index, state=state.value, next_at=next_at, now=at)
            await delivery_slots.write(tx, edits, now=at)
            return delivery_info(row)
        row = await _locked_row(tx, namespace_id, delivery_id, proof=proof)
        _check_proof(row, proof)
        if row.state == DeliveryState.ACKED:
            raise Conflict("delivery is already acked", kind="delivery_acked")
        if row.state != DeliveryState.LEASED:
            return delivery_info(row)
        at = now or await clock_now(tx)
        delay = backoff_ms(row.attempts) if retry_after_ms is None else retry_after_ms
        state, next_at = after_failure(row.attempts, row.budget, at, delay)
        if not await store.delivery_requeue_if_revision(
            tx, row, state=state, next_at=next_at, now=at
        ):
            raise Conflict("delivery changed concurrently", kind="cas")
        return delivery_info(await _reread(tx, row))

    return await db.transaction(run)


async def release_many(
    db: Database,
    namespace_id: bytes,
    held: Iterable[tuple[bytes, str]],
    *,
    now: datetime | None = None,
) -> int:
    """Give back deliveries a closing connection still holds, due at once (no backoff).

    ``held`` is (delivery id, proof) pairs; only deliveries still LEASED under that proof
    move (to PENDING, or EXHAUSTED when the budget is spent). Returns how many moved.
    Open range slots are materialised (their ranges locked first, in key order); other
    deliveries are moved on their rows.
    """
    pairs = list(held)
    if not pairs:
        return 0
    located = [dr.parse_proof(p) for _, p in pairs]

    async def run(tx: Tx) -> int:
        keys = sorted({(namespace_id, loc[0]) for loc in located if loc})
        ranges, clock = await range_store.range_lock_keys_clock(tx, keys)
        at = now or clock or await clock_now(tx)
        by_id = {r.id: r for r in ranges}
        edits = delivery_slots.Edits()
        rest: list[tuple[bytes, str]] = []
        for (delivery_id, proof), loc in zip(pairs, located, strict=True):
            rng = by_id.get(loc[0]) if loc else None
            if loc is None:
                rest.append((delivery_id, proof))
                continue
            how = delivery_slots.locate(
                rng, edits.slots(rng) if rng else None, loc[1], delivery_id, proof
            )
            if how == "open" and rng is not None:
                state, next_at = after_failure(1, rng.budget, at, 0)
                edits.materialise(rng, loc[1], state=state.value, next_at=next_at, now=at)
            elif how == "moved":
                rest.append((delivery_id, proof))
        moved = len(edits.rows)
        if edits.ranges:
            await delivery_slots.write(tx, edits, now=at)
        for delivery_id, proof in rest:
            row = await store.delivery_get(tx, namespace_id, delivery_id, for_update=True)
            if row is None or row.state != DeliveryState.LEASED:
                continue
            if row.proof_digest is None or not digest_matches(proof, row.proof_digest):
                continue
            state, next_at = after_failure(row.attempts, row.budget, at, 0)
            if await store.delivery_requeue_if_revision(
                tx, row, state=state, next_at=next_at, now=at
            ):
                moved += 1
        return moved

    return await db.transaction(run)
