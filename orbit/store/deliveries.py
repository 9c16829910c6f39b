"""SQL for ``orbit_deliveries`` (queries in ``orbit/sql/deliveries.sql``).

Each function runs one query in the caller's transaction and returns a typed row or a bool
for guarded updates (True = the guard held and the row changed).
"""

from __future__ import annotations

from collections.abc import Sequence
from datetime import datetime
from typing import Any

import msgspec

from orbit.storage import Tx, load_queries

Q = load_queries(__file__, "deliveries")

#: Unique index on (namespace_id, subscription_id, seq): one delivery per event per
#: subscription, the last line of defence against two pumps racing.
SUBSCRIPTION_SEQ_CONSTRAINT = "uq_orbit_deliveries_subscription_seq"


class DeliveryRow(msgspec.Struct, frozen=True, kw_only=True):
    """One ``orbit_deliveries`` row."""

    namespace_id: bytes
    id: bytes
    subscription_id: bytes
    seq: int
    event_id: bytes
    state: str
    proof_digest: bytes | None
    attempts: int
    budget: int
    lease_expires_at: datetime | None
    next_at: datetime
    acked_at: datetime | None
    revision: int
    created_at: datetime
    updated_at: datetime


def _row(row: dict[str, Any] | None) -> DeliveryRow | None:
    return None if row is None else msgspec.convert(row, DeliveryRow)


def _rows(rows: Sequence[dict[str, Any]]) -> list[DeliveryRow]:
    return [msgspec.convert(r, DeliveryRow) for r in rows]


async def delivery_clock_now(tx: Tx, now: datetime | None = None) -> datetime:
    """The database clock (UTC), read once per transaction that decides leases; ``now``
    instead when the caller pinned it (tests)."""
    if now is not None:
        return now
    value: datetime = await tx.fetchval(Q.delivery_clock_now)
    return value


async def delivery_insert_many(tx: Tx, rows: Sequence[dict[str, Any]]) -> None:
    """Insert deliveries with one multi-row INSERT.

    Raises DuplicateKey(SUBSCRIPTION_SEQ_CONSTRAINT) if any (subscription, seq) exists.
    """
    if rows:
        await tx.executemany(Q.delivery_insert_many, rows)


async def delivery_get(
    tx: Tx, namespace_id: bytes, delivery_id: bytes, *, for_update: bool = False
) -> DeliveryRow | None:
    sql = Q.delivery_get_for_update if for_update else Q.delivery_get
    return _row(await tx.fetchone(sql, {"namespace_id": namespace_id, "id": delivery_id}))


async def delivery_get_many_for_update(
    tx: Tx, namespace_id: bytes, delivery_ids: Sequence[bytes]
) -> list[DeliveryRow]:
    """Lock the deliveries of ``delivery_ids`` (primary-key order); missing ones are absent."""
    if not delivery_ids:
        return []
    args = {"namespace_id": namespace_id, "ids": tuple(delivery_ids)}
    return _rows(await tx.fetchall(Q.delivery_get_many_for_update, args))


def delivery_ack_statement(row: DeliveryRow, *, now: datetime) -> tuple[str, dict[str, Any]]:
    """The guarded ACK UPDATE of ``row`` as (sql, args), for :meth:`Tx.execute_batch`."""
    args = {"namespace_id": row.namespace_id, "id": row.id, "revision": row.revision, "now": now}
    return Q.delivery_ack_if_revision, args


class LeaseProbe(msgspec.Struct, frozen=True, kw_only=True):
    """What :func:`delivery_lease_probe` saw (no lock taken)."""

    last_seq: int  # the namespace's result stream position
    due: bool  # a PENDING delivery is due now
    expired: bool  # a LEASED delivery's lease has ended
    in_flight: int  # LEASED deliveries

    def idle(self, after_seq: int) -> bool:
        """Nothing to pump, hand out or reclaim."""
        return after_seq >= self.last_seq and not self.due and not self.expired


async def delivery_lease_probe(
    tx: Tx, namespace_id: bytes, subscription_id: bytes
) -> tuple[Any, LeaseProbe] | None:
    """The subscription row (a ``SubscriptionRow``) and a :class:`LeaseProbe`, or None when
    the subscription is gone. One statement, no locks."""
    key = (namespace_id, subscription_id)
    return (await delivery_lease_probe_many(tx, [key])).get(key)


async def delivery_lease_probe_many(
    tx: Tx, keys: Sequence[tuple[bytes, bytes]]
) -> dict[tuple[bytes, bytes], tuple[Any, LeaseProbe]]:
    """:func:`delivery_lease_probe` for many ``(namespace_id, subscription_id)`` in ONE
    statement (no locks); gone subscriptions are absent from the result."""
    from orbit.store.subscriptions import SubscriptionRow

    if not keys:
        return {}
    rows = await tx.fetchall(Q.delivery_lease_probe_many, {"keys": tuple(keys)})
    out: dict[tuple[bytes, bytes], tuple[Any, LeaseProbe]] = {}
    for row in rows:
        probe = LeaseProbe(last_seq=int(row["last_seq"]), due=bool(row["due"]),
                           expired=bool(row["expired"]), in_flight=int(row["in_flight"]))  # fmt: skip
        out[(row["namespace_id"], row["id"])] = (msgspec.convert(row, SubscriptionRow), probe)
    return out


async def delivery_count_leased(tx: Tx, namespace_id: bytes, subscription_id: bytes) -> int:
    args = {"namespace_id": namespace_id, "subscription_id": subscription_id}
    return int(await tx.fetchval(Q.delivery_count_leased, args) or 0)


async def delivery_list_due_for_update(
    tx: Tx, namespace_id: bytes, subscription_id: bytes, now: datetime, limit: int
) -> list[DeliveryRow]:
    """Lock up to ``limit`` PENDING deliveries due at ``now`` (others' locked rows skipped)."""
    args = {
        "namespace_id": namespace_id,
        "subscription_id": subscription_id,
        "now": now,
        "limit": limit,
    }
    return _rows(await tx.fetchall(Q.delivery_list_due_for_update, args))


async def delivery_list_expired_for_update(
    tx: Tx, namespace_id: bytes, subscription_id: bytes, now: datetime, limit: int
) -> list[DeliveryRow]:
    """Lock up to ``limit`` LEASED deliveries whose lease ended at or before ``now``."""
    args = {
        "namespace_id": namespace_id,
        "subscription_id": subscription_id,
        "now": now,
        "limit": limit,
    }
    return _rows(await tx.fetchall(Q.delivery_list_expired_for_update, args))


async def delivery_expired_exists(
    tx: Tx, namespace_id: bytes, subscription_id: bytes, now: datetime | None
) -> bool:
    """True when a LEASED delivery's lease ended at or before ``now`` (None: database clock)."""
    args = {"namespace_id": namespace_id, "subscription_id": subscription_id, "now": now}
    return await tx.fetchone(Q.delivery_expired_exists, args) is not None


async def delivery_lease_if_pending(
    tx: Tx,
    row: DeliveryRow,
    *,
    proof_digest: bytes,
    lease_expires_at: datetime,
    now: datetime,
) -> bool:
    """Hand ``row`` out once more under a new proof.

    False means the row is no longer PENDING at ``row.revision`` (acked, given budget or
    leased by someone else since it was read), or its budget is spent.
    """
    args = {
        "namespace_id": row.namespace_id,
        "id": row.id,
        "revision": row.revision,
        "proof_digest": proof_digest,
        "lease_expires_at": lease_expires_at,
        "now": now,
    }
    return await tx.execute(Q.delivery_lease_if_pending, args) == 1


async def delivery_requeue_if_revision(
    tx: Tx, row: DeliveryRow, *, state: str, next_at: datetime, now: datetime
) -> bool:
    """Move ``row`` to ``state`` (PENDING or EXHAUSTED) due at ``next_at``.

    False means the row changed since it was read (revision moved on).
    """
    args = {
        "namespace_id": row.namespace_id,
        "id": row.id,
        "revision": row.revision,
        "state": state,
        "next_at": next_at,
        "now": now,
    }
    return await tx.execute(Q.delivery_requeue_if_revision, args) == 1


async def delivery_ack_if_revision(tx: Tx, row: DeliveryRow, *, now: datetime) -> bool:
    """Mark ``row`` ACKED.

    False means it was already ACKED or changed since it was read.
    """
    args = {"namespace_id": row.namespace_id, "id": row.id, "revision": row.revision, "now": now}
    return await tx.execute(Q.delivery_ack_if_revision, args) == 1


async def delivery_set_budget_if_revision(
    tx: Tx, row: DeliveryRow, *, budget: int, state: str, next_at: datetime, now: datetime
) -> bool:
    """Raise the budget to ``budget`` and set ``state``/``next_at``.

    False means the row changed since it was read, or ``budget`` would lower it.
    """
    args = {
        "namespace_id": row.namespace_id,
        "id": row.id,
        "revision": row.revision,
        "budget": budget,
        "state": state,
        "next_at": next_at,
        "now": now,
    }
    return await tx.execute(Q.delivery_set_budget_if_revision, args) == 1


async def delivery_count_by_state(
    tx: Tx, namespace_id: bytes, subscription_id: bytes
) -> dict[str, int]:
    args = {"namespace_id": namespace_id, "subscription_id": subscription_id}
    rows = await tx.fetchall(Q.delivery_count_by_state, args)
    return {r["state"]: int(r["n"]) for r in rows}


async def delivery_count_open_by_state(
    tx: Tx, namespace_id: bytes, subscription_id: bytes
) -> dict[str, int]:
    """PENDING, LEASED and EXHAUSTED counts (for /metrics; ACKED is not counted)."""
    args = {"namespace_id": namespace_id, "subscription_id": subscription_id}
    rows = await tx.fetchall(Q.delivery_count_open_by_state, args)
    return {r["state"]: int(r["n"]) for r in rows}


async def delivery_list_page(
    tx: Tx,
    namespace_id: bytes,
    subscription_id: bytes,
    *,
    state: str | None,
    after_seq: int,
    limit: int,
) -> list[DeliveryRow]:
    """History in sequence order after ``after_seq``, optionally of one state."""
    args = {
        "namespace_id": namespace_id,
        "subscription_id": subscription_id,
        "state": state,
        "after_seq": after_seq,
        "limit": limit,
    }
    sql = Q.delivery_list_page if state is None else Q.delivery_list_page_by_state
    return _rows(await tx.fetchall(sql, args))


async def delivery_event_list_by_seq(
    tx: Tx, namespace_id: bytes, seqs: Sequence[int]
) -> list[dict[str, Any]]:
    """Result event rows for ``seqs`` (any order; missing ones are simply absent)."""
    if not seqs:
        return []
    args = {"namespace_id": namespace_id, "seqs": tuple(seqs)}
    return await tx.fetchall(Q.delivery_event_list_by_seq, args)
