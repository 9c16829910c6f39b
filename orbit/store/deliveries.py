"""SQL for ``orbit_deliveries`` (queries in ``orbit/sql/deliveries.sql``).

Each function runs one query in the caller's transaction and returns a typed row or a bool
for guarded updates (True = the guard held and the row changed).
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from datetime import datetime
from typing import Any

import msgspec

from orbit.storage import Tx, load_queries
from orbit.storage.db import placeholders

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


# -- many rows of many namespaces, one statement ----------------------------------------------
#
# A node round (orbit.rounds) touches rows of several namespaces in one statement. Every
# statement keeps the namespace predicate per group — ``(namespace_id = %s AND id IN (…)) OR
# (namespace_id = %s AND id IN (…))`` — never a row-constructor ``(namespace_id, id) IN
# ((…), (…))``, which MariaDB plans and runs several times slower. Each row keeps its own
# guard (``revision = CASE id WHEN … END``) and the caller checks the matched-row count.
# Built here rather than in deliveries.sql: the text depends on the round's shape.


def namespace_groups(
    keys: Iterable[tuple[bytes, bytes]], column: str = "id", alias: str = ""
) -> tuple[str, list[Any]]:
    """``((ns = %s AND id IN (%s, …)) OR …)`` for (namespace_id, key) pairs, groups and
    keys sorted (so a locking read takes its rows in one global order)."""
    groups: dict[bytes, set[bytes]] = {}
    for ns, key in keys:
        groups.setdefault(ns, set()).add(key)
    if not groups:
        raise ValueError("no keys")
    parts: list[str] = []
    args: list[Any] = []
    for ns in sorted(groups):
        ids = sorted(groups[ns])
        parts.append(f"({alias}namespace_id = %s AND {alias}{column} IN ({placeholders(ids)}))")
        args += [ns, *ids]
    return "(" + " OR ".join(parts) + ")", args


def expand_keys(
    sql: str, keys: Iterable[tuple[bytes, bytes]], alias: str = ""
) -> tuple[str, list[Any]]:
    """``sql`` with its one ``(namespace_id = %s AND id IN (/*ids*/))`` group (as written in
    the .sql file) repeated for every namespace of ``keys`` and OR-ed; the arguments of
    that part, in order."""
    group = f"({alias}namespace_id = %s AND {alias}id IN (/*ids*/))"
    if group not in sql:
        raise ValueError("query has no namespace group")
    where, args = namespace_groups(keys, alias=alias)
    return sql.replace(group, where[1:-1], 1), args


def case_by_id(values: Sequence[tuple[bytes, Any]], column: str = "id") -> tuple[str, list[Any]]:
    """``CASE id WHEN %s THEN %s … END`` (the per-row value or guard of a multi-row UPDATE)."""
    args: list[Any] = []
    for key, value in values:
        args += [key, value]
    return f"CASE {column}" + " WHEN %s THEN %s" * len(values) + " END", args


async def delivery_lock_keys(tx: Tx, keys: Sequence[tuple[bytes, bytes]]) -> list[DeliveryRow]:
    """Lock the deliveries of (namespace_id, id) ``keys`` — any namespaces — in ONE
    statement, in (namespace, id) order; missing ones are absent."""
    if not keys:
        return []
    sql, args = expand_keys(Q.delivery_lock_keys, keys)
    return _rows(await tx.fetchall(sql, args))


async def deliveries_ack(tx: Tx, rows: Sequence[DeliveryRow], *, now: datetime) -> int:
    """ACK every row of ``rows`` (locked by this transaction; any namespaces) with ONE
    guarded UPDATE; return the matched count, which must be ``len(rows)``."""
    if not rows:
        return 0
    sql, where_args = expand_keys(Q.deliveries_ack, [(r.namespace_id, r.id) for r in rows])
    guard, guard_args = case_by_id([(r.id, r.revision) for r in rows])
    sql = sql.replace("/*revisions*/", guard)
    return await tx.execute(sql, [now, now, *where_args, *guard_args])


async def deliveries_lease(
    tx: Tx,
    rows: Sequence[DeliveryRow],
    proof_digests: Sequence[bytes],
    *,
    lease_expires_at: datetime,
    now: datetime,
) -> int:
    """Hand out every row of ``rows`` (PENDING, locked by this transaction) under its own
    new proof digest with ONE guarded UPDATE; return the matched count (``len(rows)`` unless
    a row moved on, which its lock rules out)."""
    if not rows:
        return 0
    sql, where_args = expand_keys(Q.deliveries_lease, [(r.namespace_id, r.id) for r in rows])
    digests, digest_args = case_by_id([(r.id, d) for r, d in zip(rows, proof_digests, strict=True)])
    guard, guard_args = case_by_id([(r.id, r.revision) for r in rows])
    sql = sql.replace("/*digests*/", digests).replace("/*revisions*/", guard)
    args = [*digest_args, lease_expires_at, lease_expires_at, now, *where_args, *guard_args]
    return await tx.execute(sql, args)


class LeaseProbe(msgspec.Struct, frozen=True, kw_only=True):
    """What :func:`delivery_lease_probe` saw (no lock taken)."""

    last_seq: int  # the namespace's result stream position
    due: bool  # a PENDING delivery is due now
    expired: bool  # a LEASED delivery's lease has ended
    in_flight: int  # LEASED deliveries
    #: Seconds until the earliest PENDING delivery is due (database clock), None when none
    #: is waiting: a consumer with nothing else to do sleeps that long, no longer.
    retry_in_s: float | None = None

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
    sql, args = expand_keys(Q.delivery_lease_probe_many, keys, alias="s.")
    rows = await tx.fetchall(sql, args)
    out: dict[tuple[bytes, bytes], tuple[Any, LeaseProbe]] = {}
    for row in rows:
        due_at = row.get("next_due")
        retry = None if due_at is None else max(0.0, (due_at - row["db_now"]).total_seconds())
        probe = LeaseProbe(last_seq=int(row["last_seq"]), due=bool(row["due"]),
                           expired=bool(row["expired"]), in_flight=int(row["in_flight"]),
                           retry_in_s=retry)  # fmt: skip
        out[(row["namespace_id"], row["id"])] = (msgspec.convert(row, SubscriptionRow), probe)
    return out


async def delivery_count_leased(tx: Tx, namespace_id: bytes, subscription_id: bytes) -> int:
    args = {"namespace_id": namespace_id, "subscription_id": subscription_id}
    return int(await tx.fetchval(Q.delivery_count_leased, args) or 0)


async def delivery_in_flight(tx: Tx, namespace_id: bytes, subscription_id: bytes) -> int:
    """LEASED rows plus open slots of LEASED ranges of a subscription: ONE statement."""
    args = {"namespace_id": namespace_id, "subscription_id": subscription_id}
    return int(await tx.fetchval(Q.delivery_in_flight, args) or 0)


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


async def delivery_event_sizes_by_seq(
    tx: Tx, namespace_id: bytes, seqs: Sequence[int]
) -> dict[int, int]:
    """seq → bytes of the stored result and error, for ``seqs`` (missing ones absent)."""
    if not seqs:
        return {}
    args = {"namespace_id": namespace_id, "seqs": tuple(seqs)}
    rows = await tx.fetchall(Q.delivery_event_sizes_by_seq, args)
    return {int(r["seq"]): int(r["page_bytes"] or 0) for r in rows}


async def delivery_event_scan_after(
    tx: Tx, namespace_id: bytes, after_seq: int, limit: int, max_bytes: int
) -> list[dict[str, Any]]:
    """Up to ``limit`` result event rows with ``seq > after_seq`` in sequence order, their
    bytes in ``page_bytes`` and the running total in ``walk_bytes``; the rows end at the first
    whose total reaches ``max_bytes`` (or at a gap in the seqs). ``result`` and ``error`` are
    there only while the total is within ``max_bytes`` (``inline`` true), else None."""
    args = {"namespace_id": namespace_id, "after_seq": after_seq, "limit": limit,
            "max_bytes": max_bytes}  # fmt: skip
    return await tx.fetchall(Q.delivery_event_scan_after, args)


# ---- retention purge (orbit.retention_purge) ----------------------------------------------


async def delivery_min_open_seq(tx: Tx, namespace_id: bytes, subscription_id: bytes) -> int | None:
    """Seq of the subscription's oldest PENDING or LEASED delivery row, None when none."""
    args = {"namespace_id": namespace_id, "subscription_id": subscription_id}
    value = await tx.fetchval(Q.delivery_min_open_seq, args)
    return None if value is None else int(value)


async def delivery_subscription_ids(tx: Tx, namespace_id: bytes) -> list[bytes]:
    rows = await tx.fetchall(Q.delivery_subscription_ids, {"namespace_id": namespace_id})
    return [bytes(r["subscription_id"]) for r in rows]


async def delivery_purge_upto(
    tx: Tx, namespace_id: bytes, subscription_id: bytes, upto_seq: int
) -> int:
    """Delete the subscription's delivery rows of result events up to ``upto_seq``."""
    args = {"namespace_id": namespace_id, "subscription_id": subscription_id,
            "upto_seq": upto_seq}  # fmt: skip
    return await tx.execute(Q.delivery_purge_upto, args)
