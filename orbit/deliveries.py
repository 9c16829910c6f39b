"""Deliveries: each delivery's lease, proof and attempt budget — the rules, and everything
done under one delivery's row lock (docs/api/subscriptions.md). The pump and the
hand-out, done under the subscription's row lock, are in :mod:`orbit.delivery_pump`.

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

from orbit import audit, idempotency
from orbit.audit import Actor
from orbit.errors import Conflict, InvalidRequest, NotFound, OrbitError
from orbit.events import ResultEvent
from orbit.idempotency import IdemRequest, Reply
from orbit.ids import digest_matches, id_hex
from orbit.storage import Database, Tx
from orbit.store import deliveries as store
from orbit.store.deliveries import DeliveryRow
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
    if attempts <= 1:
        return BACKOFF_INITIAL_MS
    return min(BACKOFF_MAX_MS, BACKOFF_INITIAL_MS * 2 ** min(attempts - 1, 30))


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


async def _locked(tx: Tx, namespace_id: bytes, delivery_id: bytes) -> DeliveryRow:
    row = await store.delivery_get(tx, namespace_id, delivery_id, for_update=True)
    if row is None:
        raise NotFound("delivery")
    return row


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


async def ack_round(
    db: Database, items: Sequence[AckItem], *, now: datetime | None = None
) -> list[AckResult | OrbitError]:
    """Acknowledge deliveries of any namespaces and subscriptions in ONE transaction (a node
    round of acks, :class:`orbit.rounds.NodeRound`): per item, in order, its
    :class:`AckResult` or the error :func:`ack` would raise for it alone
    (:class:`StaleProof`, :class:`NotFound`).

    Each item is judged alone, exactly as :func:`ack` judges it: its row locked (the round's
    rows in one statement, (namespace, id) order), its proof checked against the stored
    digest. Every applied ack is written by ONE multi-row UPDATE whose rows each keep their
    own revision guard; its matched count must equal the rows. The same delivery twice in a
    round: the first applies, the second replays. A failing statement fails the whole round
    (nothing is acked), like any transaction.
    """
    if not items:
        return []

    async def run(tx: Tx) -> list[AckResult | OrbitError]:
        keys = sorted({(i.namespace_id, i.delivery_id) for i in items})
        locked, at = await tx.pipeline(  # the rows and the clock in one round trip
            store.delivery_lock_keys(tx, keys), store.delivery_clock_now(tx, now)
        )
        rows = {(r.namespace_id, r.id): r for r in locked}
        out: list[AckResult | OrbitError] = []
        done: dict[tuple[bytes, bytes], DeliveryRow] = {}
        writes: list[DeliveryRow] = []
        for item in items:
            key = (item.namespace_id, item.delivery_id)
            row = done.get(key) or rows.get(key)
            if row is None:
                out.append(NotFound("delivery"))
            elif row.proof_digest is None or not digest_matches(item.proof, row.proof_digest):
                out.append(StaleProof(delivery_id=id_hex(row.id)))
            elif row.state == DeliveryState.ACKED:
                out.append(AckResult(outcome="replayed", delivery=delivery_info(row)))
            else:
                writes.append(row)
                done[key] = acked = msgspec.structs.replace(
                    row, state=DeliveryState.ACKED.value, acked_at=at, lease_expires_at=None,
                    revision=row.revision + 1, updated_at=at,
                )  # fmt: skip
                out.append(AckResult(outcome="applied", delivery=delivery_info(acked)))
        if writes and await store.deliveries_ack(tx, writes, now=at) != len(writes):
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
        row = await _locked(tx, namespace_id, delivery_id)
        _check_proof(row, proof)
        if row.state == DeliveryState.ACKED:
            raise Conflict("delivery is already acked", kind="delivery_acked")
        if row.state != DeliveryState.LEASED:
            return delivery_info(row)
        at = now or await store.delivery_clock_now(tx)
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
    """
    pairs = list(held)
    if not pairs:
        return 0

    async def run(tx: Tx) -> int:
        at = now or await store.delivery_clock_now(tx)
        moved = 0
        for delivery_id, proof in pairs:
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


async def add_budget(
    db: Database,
    namespace_id: bytes,
    delivery_id: bytes,
    add: int,
    *,
    actor: Actor | None = None,
    request_id: str | None = None,
    idem: IdemRequest | None = None,
    now: datetime | None = None,
) -> DeliveryInfo:
    """``POST .../deliveries/{id}/budget {"add": n}``: raise the budget by ``n`` (1..1000).

    An EXHAUSTED delivery becomes PENDING, due at once; its attempts and history are kept
    (the attempt counter continues). Other states only get the larger budget; an ACKED one
    is answered unchanged. Adding is not idempotent by itself: pass ``idem`` (the request's
    ``Idempotency-Key``) so a retried request replays the first answer instead of adding
    again — :func:`add_budget_reply` gives the HTTP reply with the replay flag.
    """
    reply = await add_budget_reply(
        db, namespace_id, delivery_id, add, actor=actor, request_id=request_id, idem=idem, now=now
    )
    return msgspec.json.decode(reply.body, type=DeliveryInfo)


async def add_budget_reply(
    db: Database,
    namespace_id: bytes,
    delivery_id: bytes,
    add: int,
    *,
    actor: Actor | None = None,
    request_id: str | None = None,
    idem: IdemRequest | None = None,
    now: datetime | None = None,
) -> Reply:
    """:func:`add_budget` as a stored/replayable HTTP reply (200 + the delivery)."""
    if isinstance(add, bool) or not 1 <= add <= MAX_BUDGET_ADD:
        raise InvalidRequest(f"add must be an integer from 1 to {MAX_BUDGET_ADD}", field="add")
    scope = id_hex(delivery_id)

    async def run(tx: Tx) -> Reply:
        if idem is not None:  # first statement: a waiting duplicate holds nothing else
            replay = await idempotency.claim(
                tx, namespace_id, BUDGET_ACTION, scope, idem.key, idem.digest, now=now
            )
            if replay is not None:
                return Reply(replay.status, replay.body, replayed=True)
        info = await _add_budget_locked(tx, namespace_id, delivery_id, add, actor, request_id, now)
        body = _EVENT_JSON.encode(info)
        if idem is not None:
            await idempotency.store_response(
                tx, namespace_id, BUDGET_ACTION, scope, idem.key, 200, body
            )
        return Reply(200, body)

    return await db.transaction(run)


async def _add_budget_locked(
    tx: Tx,
    namespace_id: bytes,
    delivery_id: bytes,
    add: int,
    actor: Actor | None,
    request_id: str | None,
    now: datetime | None,
) -> DeliveryInfo:
    row = await _locked(tx, namespace_id, delivery_id)
    if row.state == DeliveryState.ACKED:
        return delivery_info(row)
    at = now or await store.delivery_clock_now(tx)
    revive = row.state == DeliveryState.EXHAUSTED
    ok = await store.delivery_set_budget_if_revision(
        tx,
        row,
        budget=row.budget + add,
        state=DeliveryState.PENDING.value if revive else row.state,
        next_at=at if revive else row.next_at,
        now=at,
    )
    if not ok:
        raise Conflict("delivery changed concurrently", kind="cas")
    if actor is not None:
        await audit.record(
            tx,
            actor=actor,
            action=BUDGET_ACTION,
            resource_kind="delivery",
            resource_id=delivery_id,
            namespace_id=namespace_id,
            request_id=request_id,
            details={"add": add, "budget": row.budget + add, "revived": revive},
            now=now,
        )
    return delivery_info(await _reread(tx, row))


async def get_delivery(db: Database, namespace_id: bytes, delivery_id: bytes) -> DeliveryRow:
    async def run(tx: Tx) -> DeliveryRow | None:
        return await store.delivery_get(tx, namespace_id, delivery_id)

    row = await db.read(run)
    if row is None:
        raise NotFound("delivery")
    return row


async def list_history(
    db: Database,
    namespace_id: bytes,
    subscription_id: bytes,
    *,
    state: str | None,
    after_seq: int,
    limit: int,
) -> list[DeliveryRow]:
    """Deliveries of a subscription in sequence order after ``after_seq``."""
    if state is not None and state not in DeliveryState.__members__:
        raise InvalidRequest(
            f"state is one of {', '.join(DeliveryState.__members__)}", field="state"
        )

    async def run(tx: Tx) -> list[DeliveryRow]:
        return await store.delivery_list_page(
            tx, namespace_id, subscription_id, state=state, after_seq=after_seq, limit=limit
        )

    return await db.read(run)
