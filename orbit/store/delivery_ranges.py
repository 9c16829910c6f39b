"""SQL for ``orbit_delivery_ranges`` (queries in ``orbit/sql/delivery_ranges.sql``).

Each function runs one query in the caller's transaction and returns typed rows or the
matched count of a guarded multi-row UPDATE (the caller checks it).
"""

from __future__ import annotations

from collections.abc import Sequence
from datetime import datetime
from typing import Any

import msgspec

from orbit.delivery_ranges import Slots
from orbit.storage import Tx, load_queries
from orbit.store.clock import clock_of
from orbit.store.deliveries import case_by_id, expand_keys

Q = load_queries(__file__, "delivery_ranges")


class RangeRow(msgspec.Struct, frozen=True, kw_only=True):
    """One ``orbit_delivery_ranges`` row (blobs as stored; :meth:`slots` decodes them)."""

    namespace_id: bytes
    id: bytes
    subscription_id: bytes
    id_bucket: int
    seq_lo: int
    seq_hi: int
    n: int
    seqs: bytes
    event_ids: bytes
    delivery_ids: bytes
    proof_digests: bytes
    acked_us: bytes
    moved: bytes
    open_n: int
    acked_n: int
    state: str
    budget: int
    lease_expires_at: datetime
    revision: int
    created_at: datetime
    updated_at: datetime

    def slots(self) -> Slots:
        return Slots.decode(
            self.seqs, self.delivery_ids, self.event_ids, self.proof_digests,
            self.acked_us, self.moved,
        )  # fmt: skip


def _rows(rows: Sequence[dict[str, Any]]) -> list[RangeRow]:
    return [msgspec.convert(r, RangeRow) for r in rows]


async def range_insert_many(tx: Tx, rows: Sequence[dict[str, Any]]) -> None:
    """Insert new LEASED ranges with one multi-row INSERT."""
    if rows:
        await tx.executemany(Q.range_insert_many, rows)


async def range_lock_keys(tx: Tx, keys: Sequence[tuple[bytes, bytes]]) -> list[RangeRow]:
    """Lock the ranges of (namespace_id, id) ``keys`` — any namespaces — in ONE statement,
    in (namespace, id) order; missing ones are absent."""
    return (await range_lock_keys_clock(tx, keys))[0]


async def range_lock_keys_clock(
    tx: Tx, keys: Sequence[tuple[bytes, bytes]]
) -> tuple[list[RangeRow], datetime | None]:
    """:func:`range_lock_keys` and the database clock read once they are locked
    (:func:`orbit.store.clock.clock_of`: None when none was locked)."""
    if not keys:
        return [], None
    sql, args = expand_keys(Q.range_lock_keys, keys)
    rows = await tx.fetchall(sql, args)
    return _rows(rows), clock_of(rows)


async def range_update_many(
    tx: Tx, changes: Sequence[tuple[RangeRow, Slots]], *, now: datetime
) -> int:
    """Write the edited slots of locked ranges with ONE guarded UPDATE; the matched count
    (must be ``len(changes)``)."""
    if not changes:
        return 0
    sql, where_args = expand_keys(Q.range_update_many, [(r.namespace_id, r.id) for r, _ in changes])
    args: list[Any] = []
    for marker, values in (
        ("acked_us", [(r.id, s.acked_blob()) for r, s in changes]),
        ("moved", [(r.id, s.moved) for r, s in changes]),
        ("open_n", [(r.id, s.open_n) for r, s in changes]),
        ("acked_n", [(r.id, s.acked_n) for r, s in changes]),
        ("state", [(r.id, s.state().value) for r, s in changes]),
    ):
        case, case_args = case_by_id(values)
        sql = sql.replace(f"/*{marker}*/", case)
        args += case_args
    guard, guard_args = case_by_id([(r.id, r.revision) for r, _ in changes])
    sql = sql.replace("/*revisions*/", guard)
    return await tx.execute(sql, [*args, now, *where_args, *guard_args])


async def range_in_flight(tx: Tx, namespace_id: bytes, subscription_id: bytes) -> int:
    args = {"namespace_id": namespace_id, "subscription_id": subscription_id}
    return int(await tx.fetchval(Q.range_in_flight, args) or 0)


async def range_list_expired_for_update(
    tx: Tx, namespace_id: bytes, subscription_id: bytes, now: datetime, limit: int
) -> list[RangeRow]:
    args = {"namespace_id": namespace_id, "subscription_id": subscription_id, "now": now,
            "limit": limit}  # fmt: skip
    return _rows(await tx.fetchall(Q.range_list_expired_for_update, args))


async def range_expired_exists(
    tx: Tx, namespace_id: bytes, subscription_id: bytes, now: datetime | None
) -> bool:
    args = {"namespace_id": namespace_id, "subscription_id": subscription_id, "now": now}
    return await tx.fetchone(Q.range_expired_exists, args) is not None


async def range_list_by_bucket(tx: Tx, namespace_id: bytes, bucket: int) -> list[RangeRow]:
    args = {"namespace_id": namespace_id, "id_bucket": bucket}
    return _rows(await tx.fetchall(Q.range_list_by_bucket, args))


async def range_list_page(
    tx: Tx, namespace_id: bytes, subscription_id: bytes, after_seq: int, limit: int
) -> list[RangeRow]:
    args = {"namespace_id": namespace_id, "subscription_id": subscription_id,
            "after_seq": after_seq, "limit": limit}  # fmt: skip
    return _rows(await tx.fetchall(Q.range_list_page, args))


async def range_list_leased(
    tx: Tx, namespace_id: bytes, subscription_id: bytes, after_seq: int
) -> list[RangeRow]:
    args = {"namespace_id": namespace_id, "subscription_id": subscription_id,
            "after_seq": after_seq}  # fmt: skip
    rows = _rows(await tx.fetchall(Q.range_list_leased, args))
    return sorted(rows, key=lambda r: r.seq_hi)


async def range_counts(tx: Tx, namespace_id: bytes, subscription_id: bytes) -> tuple[int, int]:
    """(open slots of LEASED ranges, slots acked) of a subscription."""
    args = {"namespace_id": namespace_id, "subscription_id": subscription_id}
    row = await tx.fetchone(Q.range_counts, args)
    return (int(row["open_n"]), int(row["acked_n"])) if row else (0, 0)


# ---- retention purge (orbit.retention_purge) ----------------------------------------------


async def range_min_open_seq(tx: Tx, namespace_id: bytes, subscription_id: bytes) -> int | None:
    """Smallest seq of the subscription's hand-outs with a slot still leased, None when none."""
    args = {"namespace_id": namespace_id, "subscription_id": subscription_id}
    value = await tx.fetchval(Q.range_min_open_seq, args)
    return None if value is None else int(value)


async def range_subscription_ids(tx: Tx, namespace_id: bytes) -> list[bytes]:
    rows = await tx.fetchall(Q.range_subscription_ids, {"namespace_id": namespace_id})
    return [bytes(r["subscription_id"]) for r in rows]


async def range_purge_upto(
    tx: Tx, namespace_id: bytes, subscription_id: bytes, upto_seq: int
) -> int:
    """Delete the subscription's finished hand-outs whose every seq is up to ``upto_seq``."""
    args = {"namespace_id": namespace_id, "subscription_id": subscription_id,
            "upto_seq": upto_seq}  # fmt: skip
    return await tx.execute(Q.range_purge_upto, args)
