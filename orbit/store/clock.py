"""The database clock (``orbit/sql/clock.sql``), read once per transaction that decides
leases, deadlines or expiry: the only clock those are judged by, whatever the node's."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from datetime import datetime
from typing import Any

from orbit.storage import Tx, load_queries

Q = load_queries(__file__, "clock")


async def clock_now(tx: Tx, now: datetime | None = None) -> datetime:
    """``now`` when the caller pinned it (tests), else the database clock (UTC)."""
    if now is not None:
        return now
    value = await tx.fetchval(Q.clock_now, {"now": None})
    assert isinstance(value, datetime)
    return value


def clock_of(rows: Sequence[Mapping[str, Any]]) -> datetime | None:
    """The database clock carried by a locking read as its ``db_now`` column
    (``SYSDATE(6) AS db_now``: evaluated as each row is read, so after that row's lock is
    held — the last row's is after every lock of the statement, as a clock read in the next
    statement would be, minus its statement); None without rows (the caller then reads
    :func:`clock_now` if it still needs a time)."""
    if not rows:
        return None
    value = rows[-1]["db_now"]
    assert isinstance(value, datetime)
    return value
