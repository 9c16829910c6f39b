"""The database clock (``orbit/sql/clock.sql``), read once per transaction that decides
leases, deadlines or expiry: the only clock those are judged by, whatever the node's."""

from __future__ import annotations

from datetime import datetime

from orbit.storage import Tx, load_queries

Q = load_queries(__file__, "clock")


async def clock_now(tx: Tx, now: datetime | None = None) -> datetime:
    """``now`` when the caller pinned it (tests), else the database clock (UTC)."""
    if now is not None:
        return now
    value = await tx.fetchval(Q.clock_now, {"now": None})
    assert isinstance(value, datetime)
    return value
