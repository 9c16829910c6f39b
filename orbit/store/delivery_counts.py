"""Bounded delivery counts for the ``orbit_deliveries`` gauge (``orbit/sql/delivery_counts.sql``)."""

from __future__ import annotations

from orbit.storage import Tx, load_queries

Q = load_queries(__file__, "delivery_counts")


async def delivery_count_open_capped(
    tx: Tx, namespace_id: bytes, subscription_id: bytes, cap: int
) -> dict[str, int]:
    """PENDING / LEASED / EXHAUSTED deliveries of one subscription, each at most ``cap``."""
    rows = await tx.fetchall(
        Q.delivery_count_open_capped,
        {"namespace_id": namespace_id, "subscription_id": subscription_id, "cap": cap},
    )
    return {str(r["state"]): int(r["n"]) for r in rows}
