"""Range slots in a transaction: finding a delivery by id or proof, materialising a slot as
an ``orbit_deliveries`` row (the exception path), and a slot's history view.

Lock order everywhere: subscription row → range rows (sorted by namespace, id) → delivery
rows. Callers hold the range row locks they edit; :func:`write` writes every edited range
with one guarded UPDATE and every materialised row with one multi-row INSERT.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from orbit import delivery_ranges as dr
from orbit.errors import Conflict
from orbit.ids import digest_matches
from orbit.storage import Tx
from orbit.store import deliveries as store
from orbit.store import delivery_ranges as range_store
from orbit.store.deliveries import DeliveryRow
from orbit.store.delivery_ranges import RangeRow


@dataclass
class Edits:
    """The ranges a transaction edited and the rows it materialised, written by :func:`write`."""

    ranges: dict[tuple[bytes, bytes], tuple[RangeRow, dr.Slots]] = field(default_factory=dict)
    rows: list[dict[str, Any]] = field(default_factory=list)

    def slots(self, rng: RangeRow) -> dr.Slots:
        """The (possibly already edited) slots of a locked range."""
        key = (rng.namespace_id, rng.id)
        if key not in self.ranges:
            self.ranges[key] = (rng, rng.slots())
        return self.ranges[key][1]

    def materialise(
        self,
        rng: RangeRow,
        i: int,
        *,
        state: str,
        next_at: datetime,
        now: datetime,
        budget: int | None = None,
        lease_expires_at: datetime | None = None,
    ) -> DeliveryRow:
        """Move open slot ``i`` of ``rng`` out into an ``orbit_deliveries`` row: the same
        delivery id and proof digest, attempts 1 (its hand-out in the range)."""
        slots = self.slots(rng)
        slots.move(i)
        row = DeliveryRow(
            namespace_id=rng.namespace_id,
            id=slots.delivery_ids[i],
            subscription_id=rng.subscription_id,
            seq=slots.seqs[i],
            event_id=slots.event_ids[i],
            state=state,
            proof_digest=slots.digests[i],
            attempts=1,
            budget=rng.budget if budget is None else budget,
            lease_expires_at=lease_expires_at,
            next_at=next_at,
            acked_at=None,
            revision=1,
            created_at=rng.created_at,
            updated_at=now,
        )
        self.rows.append({f: getattr(row, f) for f in row.__struct_fields__})
        return row


async def write(tx: Tx, edits: Edits, *, now: datetime) -> None:
    """The edited ranges (one guarded UPDATE, matched count checked) and the materialised
    rows (one INSERT), in lock order: ranges, then delivery rows."""
    changes = list(edits.ranges.values())
    counts = await tx.pipeline(
        range_store.range_update_many(tx, changes, now=now),
        store.delivery_insert_many(tx, edits.rows),
    )
    if counts[0] != len(changes):  # the ranges are locked by this transaction
        raise Conflict("delivery range changed concurrently", kind="cas")


def slot_row(rng: RangeRow, slots: dr.Slots, i: int) -> DeliveryRow:
    """Slot ``i`` as a delivery (ACKED or LEASED) for history and answers. Only meaningful
    while the slot is not moved (a moved slot's row is the truth)."""
    acked = slots.is_acked(i)
    acked_at = dr.from_us(slots.acked_us[i]) if acked else None
    return DeliveryRow(
        namespace_id=rng.namespace_id,
        id=slots.delivery_ids[i],
        subscription_id=rng.subscription_id,
        seq=slots.seqs[i],
        event_id=slots.event_ids[i],
        state="ACKED" if acked else "LEASED",
        proof_digest=slots.digests[i],
        attempts=1,
        budget=rng.budget,
        lease_expires_at=None if acked else rng.lease_expires_at,
        next_at=acked_at or rng.lease_expires_at,
        acked_at=acked_at,
        revision=rng.revision,
        created_at=rng.created_at,
        updated_at=acked_at or rng.created_at,
    )


async def find_slot(
    tx: Tx, namespace_id: bytes, delivery_id: bytes, *, for_update: bool = False
) -> tuple[RangeRow, int] | None:
    """The range and slot index holding ``delivery_id`` (not moved out), or None. Reads the
    ranges of the id's bucket; ``for_update`` then locks the one found."""
    for rng in await range_store.range_list_by_bucket(tx, namespace_id, dr.bucket_of(delivery_id)):
        i = rng.slots().index_of(delivery_id)
        if i is None:
            continue
        if for_update:
            (locked,) = await range_store.range_lock_keys(tx, [(rng.namespace_id, rng.id)])
            rng = locked
        if rng.slots().is_moved(i):
            return None
        return rng, i
    return None


def locate(
    rng: RangeRow | None, slots: dr.Slots | None, index: int, delivery_id: bytes, proof: str
) -> str:
    """How a range proof relates to slot ``index``: ``"other"`` (not this delivery's slot:
    look the delivery up by id), ``"stale"`` (this delivery, wrong proof), ``"acked"``,
    ``"moved"`` (its row is the truth now) or ``"open"``."""
    if rng is None or slots is None or index >= len(slots):
        return "other"
    if slots.delivery_ids[index] != delivery_id:
        return "other"
    if not digest_matches(proof, slots.digests[index]):
        return "stale"
    if slots.is_moved(index):
        return "moved"
    return "acked" if slots.is_acked(index) else "open"
