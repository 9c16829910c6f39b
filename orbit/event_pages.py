"""One page of a namespace's result events (``GET …/events``), within its bounds.

* A key limited to some queues sees only the events of those queues; to keep one request
  bounded, at most ``SCAN_FACTOR × limit`` events are looked at, so a page can hold fewer
  than ``limit`` items with more to go on from.
* A page holds at most ``max_bytes`` of stored results and errors (at least one event): the
  events are sized first (seq, queue and byte count only) and only the chosen ones are read
  (orbit/pagination.py).
"""

from __future__ import annotations

from collections.abc import Callable, Collection

from orbit.events import ResultEvent, result_event_from_row
from orbit.pagination import MAX_LIMIT, MAX_PAGE_BYTES
from orbit.storage import Database, Tx
from orbit.store import events as store

#: A queue-limited key's request looks at most this many times ``limit`` events.
SCAN_FACTOR = 10


async def page_result_events(
    db: Database,
    namespace_id: bytes,
    after: int,
    limit: int,
    queues: Collection[str] | None = None,
    max_bytes: int = MAX_PAGE_BYTES,
    charge: Callable[[int], None] | None = None,
) -> tuple[list[ResultEvent], int, bool]:
    """(the events of the page, the last seq looked at, whether more may follow).
    ``charge(bytes)`` is called with the page's bytes before they are read (it may refuse:
    orbit/list_bytes.py)."""
    total = 0

    async def read(tx: Tx, seqs: list[int]) -> list[ResultEvent]:
        if charge is not None:
            charge(total)
        rows = await store.result_event_get_many(tx, namespace_id, seqs)
        return [result_event_from_row(r) for r in rows]

    async def run(tx: Tx) -> tuple[list[ResultEvent], int, bool]:
        nonlocal total
        chosen: list[int] = []
        total, last = 0, after
        budget = limit * (1 if queues is None else SCAN_FACTOR)
        while budget > 0:
            ask = min(budget, MAX_LIMIT)
            sized = await store.result_event_sizes_after(tx, namespace_id, last, ask)
            budget -= len(sized)
            for row in sized:
                if queues is None or row["queue"] in queues:
                    size = int(row["page_bytes"] or 0)
                    if chosen and total + size > max_bytes:
                        return await read(tx, chosen), last, True
                    chosen.append(int(row["seq"]))
                    total += size
                last = int(row["seq"])
                if len(chosen) == limit:
                    return await read(tx, chosen), last, True
            if len(sized) < ask:
                return await read(tx, chosen), last, False
        return await read(tx, chosen), last, True

    return await db.read(run)
