"""SQL for ``orbit_subscriptions`` (queries in ``orbit/sql/subscriptions.sql``).

Each function runs one query in the caller's transaction and returns a typed row.
"""

from __future__ import annotations

from collections.abc import Sequence
from datetime import datetime
from typing import Any

import msgspec

from orbit.storage import Tx, load_queries
from orbit.store.clock import clock_of

Q = load_queries(__file__, "subscriptions")

#: Unique index on (namespace_id, name): a concurrent create of the same name.
NAME_CONSTRAINT = "uq_orbit_subscriptions_name"


class SubscriptionRow(msgspec.Struct, frozen=True, kw_only=True):
    """One ``orbit_subscriptions`` row. ``filter``/``start_spec`` are the stored JSON text."""

    namespace_id: bytes
    id: bytes
    name: str
    filter: str
    start_spec: str
    after_seq: int
    ack_timeout_ms: int
    max_deliveries: int
    max_in_flight: int
    revision: int
    created_at: datetime
    updated_at: datetime


class BehindRow(msgspec.Struct, frozen=True, kw_only=True):
    """A subscription whose scan position is behind its namespace's last sequence number."""

    namespace_id: bytes
    id: bytes
    after_seq: int
    last_seq: int


class SubscriptionKey(msgspec.Struct, frozen=True, kw_only=True):
    namespace_id: bytes
    id: bytes


def _row(row: dict[str, Any] | None) -> SubscriptionRow | None:
    return None if row is None else msgspec.convert(row, SubscriptionRow)


async def subscription_get_by_name(
    tx: Tx, namespace_id: bytes, name: str, *, for_update: bool = False
) -> SubscriptionRow | None:
    """The subscription named ``name`` (locked when ``for_update``), or None."""
    sql = Q.subscription_get_by_name_for_update if for_update else Q.subscription_get_by_name
    return _row(await tx.fetchone(sql, {"namespace_id": namespace_id, "name": name}))


async def subscription_get(
    tx: Tx, namespace_id: bytes, subscription_id: bytes
) -> SubscriptionRow | None:
    """The subscription with this id (no lock), or None."""
    return _row(
        await tx.fetchone(Q.subscription_get, {"namespace_id": namespace_id, "id": subscription_id})
    )


async def subscription_lock(
    tx: Tx, namespace_id: bytes, subscription_id: bytes, *, skip_locked: bool = False
) -> SubscriptionRow | None:
    """Lock the subscription row for this transaction and return it.

    None means it does not exist or, with ``skip_locked``, that another transaction holds it.
    """
    sql = Q.subscription_lock_skip_locked if skip_locked else Q.subscription_lock
    return _row(await tx.fetchone(sql, {"namespace_id": namespace_id, "id": subscription_id}))


async def subscription_delete_if_revision(
    tx: Tx, namespace_id: bytes, subscription_id: bytes, revision: int
) -> bool:
    """Delete the subscription row. False: the revision moved on."""
    n = await tx.execute(
        Q.subscription_delete_if_revision,
        {"namespace_id": namespace_id, "id": subscription_id, "revision": revision},
    )
    return n == 1


async def subscription_lock_keys(
    tx: Tx, keys: Sequence[tuple[bytes, bytes]]
) -> list[SubscriptionRow]:
    """Lock the subscriptions of (namespace_id, id) ``keys`` — any namespaces — in ONE
    statement, in (namespace, id) order; gone ones are absent."""
    return (await subscription_lock_keys_clock(tx, keys))[0]


async def subscription_lock_keys_clock(
    tx: Tx, keys: Sequence[tuple[bytes, bytes]]
) -> tuple[list[SubscriptionRow], datetime | None]:
    """:func:`subscription_lock_keys` and the database clock read once they are locked
    (:func:`orbit.store.clock.clock_of`: None when none was locked)."""
    from orbit.store.deliveries import expand_keys

    if not keys:
        return [], None
    sql, args = expand_keys(Q.subscription_lock_keys, keys)
    rows = await tx.fetchall(sql, args)
    return [msgspec.convert(r, SubscriptionRow) for r in rows], clock_of(rows)


async def subscription_insert(tx: Tx, row: dict[str, Any]) -> None:
    """Insert a new subscription (revision 1). Raises DuplicateKey(NAME_CONSTRAINT)."""
    await tx.execute(Q.subscription_insert, row)


async def subscription_update_if_revision(tx: Tx, row: dict[str, Any]) -> bool:
    """Update the configuration; bump revision.

    False means the revision moved on (a concurrent update) or the row is gone.
    """
    return await tx.execute(Q.subscription_update_if_revision, row) == 1


async def subscription_advance_if_position(
    tx: Tx, namespace_id: bytes, subscription_id: bytes, old_seq: int, new_seq: int
) -> bool:
    """Move the scan position from ``old_seq`` to ``new_seq``.

    False means the position is no longer ``old_seq`` (another pump advanced it) or
    ``new_seq`` is not ahead of it.
    """
    args = {
        "namespace_id": namespace_id,
        "id": subscription_id,
        "old_seq": old_seq,
        "new_seq": new_seq,
    }
    return await tx.execute(Q.subscription_advance_if_position, args) == 1


async def subscription_list_behind(tx: Tx, limit: int) -> list[BehindRow]:
    """Subscriptions (all namespaces) with result events past their scan position."""
    rows = await tx.fetchall(Q.subscription_list_behind, {"limit": limit})
    return [msgspec.convert(r, BehindRow) for r in rows]


async def subscription_stream_tops(tx: Tx, namespace_ids: Sequence[bytes]) -> dict[bytes, int]:
    """``last_seq`` of each namespace's result stream (absent: no result event yet)."""
    if not namespace_ids:
        return {}
    rows = await tx.fetchall(
        Q.subscription_stream_tops, {"namespace_ids": tuple(sorted(set(namespace_ids)))}
    )
    return {bytes(r["namespace_id"]): int(r["last_seq"]) for r in rows}


async def subscription_streams_moved(
    tx: Tx, namespace_ids: Sequence[bytes], window_s: int
) -> dict[bytes, int]:
    """``last_seq`` of the namespaces among ``namespace_ids`` whose result stream moved in the
    last ``window_s`` seconds (by the database clock); the others are absent."""
    if not namespace_ids:
        return {}
    rows = await tx.fetchall(
        Q.subscription_streams_moved,
        {"namespace_ids": tuple(sorted(set(namespace_ids))), "window_s": int(window_s)},
    )
    return {bytes(r["namespace_id"]): int(r["last_seq"]) for r in rows}


async def subscription_list_page(
    tx: Tx, after: tuple[bytes, bytes] | None, limit: int
) -> list[SubscriptionKey]:
    """Subscription keys (all namespaces) after ``after`` in key order."""
    ns, sid = after or (b"", b"")
    rows = await tx.fetchall(
        Q.subscription_list_page, {"after_namespace_id": ns, "after_id": sid, "limit": limit}
    )
    return [msgspec.convert(r, SubscriptionKey) for r in rows]


async def subscription_count_of_application(tx: Tx, application_id: bytes, cap: int) -> int:
    """The application's subscriptions over all its namespaces, counted up to ``cap``."""
    n = await tx.fetchval(
        Q.subscription_count_of_application, {"application_id": application_id, "cap": cap}
    )
    return int(n or 0)


async def subscription_cursors(tx: Tx, namespace_id: bytes) -> list[tuple[bytes, int]]:
    """(id, after_seq) of every subscription of the namespace (retention purge bound)."""
    rows = await tx.fetchall(Q.subscription_cursors, {"namespace_id": namespace_id})
    return [(bytes(r["id"]), int(r["after_seq"])) for r in rows]
