"""Operator budget and delivery history: the parts of :mod:`orbit.deliveries` that find a
delivery by its id alone (a row, or a slot of a delivery range found through its id bucket)
and answer for it.

* :func:`add_budget` / :func:`add_budget_reply` — ``POST …/deliveries/{id}/budget``.
* :func:`get_delivery` — one delivery as a row (a slot's view when it lives in a range).
* :func:`list_history` — ``GET …/subscriptions/{name}/deliveries``: rows and range slots
  merged in sequence order.
"""

from __future__ import annotations

from datetime import datetime

import msgspec

from orbit import audit, delivery_slots, idempotency
from orbit.audit import Actor
from orbit.deliveries import (
    BUDGET_ACTION,
    MAX_BUDGET_ADD,
    DeliveryInfo,
    DeliveryState,
    _reread,
    delivery_info,
)
from orbit.errors import Conflict, InvalidRequest, NotFound
from orbit.idempotency import IdemRequest, Reply
from orbit.ids import id_hex
from orbit.storage import Database, Tx
from orbit.store import deliveries as store
from orbit.store import delivery_ranges as range_store
from orbit.store.clock import clock_now
from orbit.store.deliveries import DeliveryRow

_JSON = msgspec.json.Encoder()


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
        body = _JSON.encode(info)
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
    row = await store.delivery_get(tx, namespace_id, delivery_id, for_update=True)
    if row is None:
        # A range slot: acked → answered unchanged; leased → materialised as a LEASED row
        # (same id, proof digest and lease) that carries the larger budget from now on.
        slot = await delivery_slots.find_slot(tx, namespace_id, delivery_id, for_update=True)
        if slot is None:
            row = await store.delivery_get(tx, namespace_id, delivery_id, for_update=True)
            if row is None:
                raise NotFound("delivery")
        else:
            rng, i = slot
            edits = delivery_slots.Edits()
            slots = edits.slots(rng)
            if slots.is_acked(i):
                return delivery_info(delivery_slots.slot_row(rng, slots, i))
            at = now or await clock_now(tx)
            moved = edits.materialise(
                rng, i, state=DeliveryState.LEASED.value, next_at=rng.lease_expires_at,
                lease_expires_at=rng.lease_expires_at, budget=rng.budget + add, now=at,
            )  # fmt: skip
            await delivery_slots.write(tx, edits, now=at)
            await audit.record(
                tx, actor=actor, action=BUDGET_ACTION, resource_kind="delivery",
                resource_id=delivery_id, namespace_id=namespace_id, request_id=request_id,
                details={"add": add, "budget": moved.budget, "revived": False}, now=now,
            )  # fmt: skip
            return delivery_info(moved)
    if row.state == DeliveryState.ACKED:
        return delivery_info(row)
    at = now or await clock_now(tx)
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
    await audit.record(
        tx, actor=actor, action=BUDGET_ACTION, resource_kind="delivery",
        resource_id=delivery_id, namespace_id=namespace_id, request_id=request_id,
        details={"add": add, "budget": row.budget + add, "revived": revive}, now=now,
    )  # fmt: skip
    return delivery_info(await _reread(tx, row))


async def get_delivery(db: Database, namespace_id: bytes, delivery_id: bytes) -> DeliveryRow:
    """A delivery as a row: its ``orbit_deliveries`` row, or its range slot's view."""

    async def run(tx: Tx) -> DeliveryRow | None:
        row = await store.delivery_get(tx, namespace_id, delivery_id)
        if row is not None:
            return row
        slot = await delivery_slots.find_slot(tx, namespace_id, delivery_id)
        if slot is None:
            return await store.delivery_get(tx, namespace_id, delivery_id)
        rng, i = slot
        return delivery_slots.slot_row(rng, rng.slots(), i)

    row = await db.read(run)
    if row is None:
        raise NotFound("delivery")
    return row


#: Slots outside the moved ones are LEASED or ACKED: other states live on rows only.
_SLOT_STATES = (DeliveryState.LEASED.value, DeliveryState.ACKED.value)


async def list_history(
    db: Database,
    namespace_id: bytes,
    subscription_id: bytes,
    *,
    state: str | None,
    after_seq: int,
    limit: int,
) -> list[DeliveryRow]:
    """Deliveries of a subscription in sequence order after ``after_seq`` (optionally of one
    state): its rows and the slots of its ranges (moved slots are rows), merged by seq."""
    if state is not None and state not in DeliveryState.__members__:
        raise InvalidRequest(
            f"state is one of {', '.join(DeliveryState.__members__)}", field="state"
        )

    async def run(tx: Tx) -> list[DeliveryRow]:
        rows = await store.delivery_list_page(
            tx, namespace_id, subscription_id, state=state, after_seq=after_seq, limit=limit
        )
        if state is not None and state not in _SLOT_STATES:
            return rows
        slots = await _slot_page(tx, namespace_id, subscription_id, state, after_seq, limit)
        merged = sorted([*rows, *slots], key=lambda r: r.seq)
        return merged[:limit]

    return await db.read(run)


async def _slot_page(
    tx: Tx,
    namespace_id: bytes,
    subscription_id: bytes,
    state: str | None,
    after_seq: int,
    limit: int,
) -> list[DeliveryRow]:
    """Up to ``limit`` slot views after ``after_seq`` in seq order (ranges read a few at a
    time until enough slots are found; LEASED ones from the LEASED ranges only)."""
    out: list[DeliveryRow] = []
    if state == DeliveryState.LEASED.value:
        pages = [await range_store.range_list_leased(tx, namespace_id, subscription_id, after_seq)]
    else:
        pages = None
    cursor = after_seq
    while len(out) < limit:
        if pages is not None:
            if not pages:
                break
            batch = pages.pop()
        else:
            batch = await range_store.range_list_page(tx, namespace_id, subscription_id,
                                                      cursor, 8)  # fmt: skip
        for rng in batch:
            slots = rng.slots()
            for i in range(len(slots)):
                if slots.seqs[i] <= after_seq or slots.is_moved(i):
                    continue
                view = delivery_slots.slot_row(rng, slots, i)
                if state is None or view.state == state:
                    out.append(view)
            cursor = max(cursor, rng.seq_hi)
        if pages is None and len(batch) < 8:
            break
    out.sort(key=lambda r: r.seq)
    return out[:limit]
