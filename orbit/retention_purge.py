"""The retention purge: deletes, in short bounded transactions, the history of a namespace
that is past its window (:mod:`orbit.retention`) and no longer referenced.

A pass over one namespace (claimed with ``FOR UPDATE SKIP LOCKED`` on ``orbit_retention``,
so nodes share namespaces and never work on the same one) runs each *part* in turn; each
part deletes at most ``max_batches`` batches of ``batch`` rows, each batch its own
transaction, so dispatch never waits behind the purge for more than one small batch's row
locks. A namespace not caught up is due again at once (after the others that are due).

Parts of the platform (here): raw events (``events_days``), result events with their
deliveries (``events_days``, never past what a subscription still needs), audit events
(``audit_days``). Other packages add parts (Pulse: finished tasks) and *holders*: the oldest
time open work still refers to (the oldest unfinished task, the oldest running workflow
instance); raw and result events younger than that are kept whatever the window.

Every delete runs with the session flag ``@orbit_retention_purge`` set (and cleared before
the transaction ends); the history tables' delete triggers refuse deletes without it and
deletes of rows younger than the namespace's window (migrations/0015, docs/security.md).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import TypeVar

from orbit.context import AppContext
from orbit.ids import id_hex
from orbit.storage import Database, Tx
from orbit.store import audit as audit_store
from orbit.store import deliveries as delivery_store
from orbit.store import delivery_ranges as range_store
from orbit.store import events as event_store
from orbit.store import retention as store
from orbit.store import subscriptions as subscription_store
from orbit.store.clock import clock_now
from orbit.store.retention import RetentionRow

log = logging.getLogger("orbit.retention")
T = TypeVar("T")
DAY = timedelta(days=1)
#: A pass holds its namespace this long before another node may claim it again.
CLAIM_MS = 10 * 60 * 1000
#: No subscription bounds the result events a namespace without subscriptions may lose.
NO_BOUND = 2**63 - 1


@dataclass(slots=True)
class PurgePass:
    """What a part needs for one pass over one namespace."""

    db: Database
    settings: RetentionRow
    now: datetime  # the database clock at the start of the pass
    floor: datetime | None  # oldest time open work still refers to (None: nothing open)
    batch: int
    max_batches: int
    idempotency_s: int  # the namespace's Idempotency-Key window
    duty: float = 1.0  # share of the time the pass may spend in purge transactions

    async def run(self, fn: Callable[[Tx], Awaitable[T]]) -> T:
        """One batch (:func:`purge_transaction`), then a pause so that batches take at most
        ``duty`` of the time: a batch slowed by a busy database is followed by a longer
        pause, so the purge yields to dispatch when the database is the bottleneck."""
        started = time.monotonic()
        out = await purge_transaction(self.db, fn)
        if self.duty < 1.0:
            await asyncio.sleep((time.monotonic() - started) * (1.0 / self.duty - 1.0))
        return out

    @property
    def namespace_id(self) -> bytes:
        return self.settings.namespace_id

    def events_cutoff(self, days: int) -> datetime:
        cutoff = self.now - days * DAY
        return cutoff if self.floor is None else min(cutoff, self.floor)


@dataclass(slots=True)
class PartResult:
    """Rows deleted by table, and how far behind the part still is (0: caught up)."""

    deleted: dict[str, int] = field(default_factory=dict)
    lag_s: float = 0.0

    def add(self, table: str, n: int) -> None:
        if n:
            self.deleted[table] = self.deleted.get(table, 0) + n


Part = Callable[[PurgePass], Awaitable[PartResult]]
Holder = Callable[[Tx, bytes], Awaitable[datetime | None]]


async def purge_transaction(db: Database, fn: Callable[[Tx], Awaitable[T]]) -> T:
    """Run ``fn`` in one transaction with the purge session flag set, cleared at its end."""

    async def run(tx: Tx) -> T:
        await store.purge_begin(tx)
        try:
            return await fn(tx)
        finally:
            await store.purge_end(tx)

    return await db.transaction(run)


async def _batches(
    p: PurgePass, table: str, delete: Callable[[Tx], Awaitable[int]], out: PartResult
) -> bool:
    """Run ``delete`` (one bounded batch) until a batch deletes fewer than ``p.batch`` rows;
    True when caught up within ``p.max_batches``."""
    for _ in range(p.max_batches):

        async def run(tx: Tx) -> int:
            n = await delete(tx)
            if n:
                await store.retention_add_progress(tx, p.namespace_id, n)
            return n

        n = await p.run(run)
        out.add(table, n)
        if n < p.batch:
            return True
    return False


async def purge_raw_events(p: PurgePass) -> PartResult:
    """Raw event rows (batches, and the rows from before batches) past ``events_days``."""
    out = PartResult()
    days = p.settings.events_days
    if days is None:
        return out
    cutoff = p.events_cutoff(days)
    ns = p.namespace_id

    async def batches(tx: Tx) -> int:
        return await event_store.event_batch_purge(tx, ns, cutoff, p.batch)

    async def legacy(tx: Tx) -> int:
        return await event_store.event_legacy_purge(tx, ns, cutoff, p.batch)

    done = await _batches(p, "orbit_event_batches", batches, out)
    done = await _batches(p, "orbit_events", legacy, out) and done
    if not done:
        oldest = await p.db.read(lambda tx: event_store.event_batch_oldest(tx, ns))
        out.lag_s = max(0.0, (cutoff - oldest).total_seconds()) if oldest else 0.0
    return out


async def purge_audit(p: PurgePass) -> PartResult:
    """Audit events past ``audit_days``."""
    out = PartResult()
    days = p.settings.audit_days
    if days is None:
        return out
    cutoff = p.now - days * DAY
    ns = p.namespace_id

    async def delete(tx: Tx) -> int:
        return await audit_store.audit_purge(tx, ns, cutoff, p.batch)

    if not await _batches(p, "orbit_audit_events", delete, out):
        oldest = await p.db.read(lambda tx: audit_store.audit_oldest(tx, ns))
        out.lag_s = max(0.0, (cutoff - oldest).total_seconds()) if oldest else 0.0
    return out


async def _result_bound(tx: Tx, ns: bytes) -> int:
    """The highest seq no subscription still needs: at most every cursor, and below every
    delivery still in flight (a row PENDING/LEASED, a hand-out with a slot leased)."""
    bound = NO_BOUND
    for sub_id, after_seq in await subscription_store.subscription_cursors(tx, ns):
        bound = min(bound, after_seq)
        for open_seq in (
            await delivery_store.delivery_min_open_seq(tx, ns, sub_id),
            await range_store.range_min_open_seq(tx, ns, sub_id),
        ):
            if open_seq is not None:
                bound = min(bound, open_seq - 1)
    return bound


async def purge_result_events(p: PurgePass) -> PartResult:
    """Result events past ``events_days`` that every subscription is done with, in sequence
    order, with the deliveries (rows and hand-outs) of those events, in the same
    transaction. The namespace's retention row is locked first: a subscription created
    meanwhile starts after what is purged (orbit.subscriptions)."""
    out = PartResult()
    days = p.settings.events_days
    if days is None:
        return out
    cutoff = p.events_cutoff(days)
    ns = p.namespace_id

    async def batch(tx: Tx) -> tuple[dict[str, int], bool]:
        row = await store.retention_get(tx, ns, for_update=True)
        if row is None:
            return {}, True
        mark = row.result_seq_purged
        bound = await _result_bound(tx, ns)
        scan = await event_store.result_event_purge_scan(tx, ns, mark, bound, p.batch)
        hi = mark
        for r in scan:
            if r["created_at"] >= cutoff:
                break
            hi = int(r["seq"])
        if hi == mark:
            return {}, True
        counts = {"orbit_deliveries": 0, "orbit_delivery_ranges": 0}
        subs = {*await delivery_store.delivery_subscription_ids(tx, ns),
                *await range_store.range_subscription_ids(tx, ns)}  # fmt: skip
        for sub_id in sorted(subs):
            counts["orbit_deliveries"] += await delivery_store.delivery_purge_upto(
                tx, ns, sub_id, hi
            )
            counts["orbit_delivery_ranges"] += await range_store.range_purge_upto(
                tx, ns, sub_id, hi
            )
        counts["orbit_result_events"] = await event_store.result_event_purge_range(
            tx, ns, mark, hi
        )
        await store.retention_add_progress(tx, ns, sum(counts.values()), hi)
        return counts, len(scan) < p.batch or hi < int(scan[-1]["seq"])

    for _ in range(p.max_batches):
        counts, done = await p.run(batch)
        for table, n in counts.items():
            out.add(table, n)
        if done:
            return out
    out.lag_s = 1.0  # behind by at least one more batch
    return out


PLATFORM_PARTS: tuple[Part, ...] = (purge_raw_events, purge_result_events, purge_audit)


class RetentionPurge:
    """The purge loop: claims due namespaces one at a time and runs every part on each."""

    def __init__(
        self,
        ctx: AppContext,
        *,
        parts: Sequence[Part] = (),
        holders: Sequence[Holder] = (),
    ) -> None:
        self.db = ctx.db
        s = ctx.settings
        self.batch = s.retention_purge_batch
        self.max_batches = s.retention_purge_max_batches
        self.interval_s = s.retention_purge_interval_s
        self.duty = min(1.0, max(0.05, s.retention_purge_duty))
        self.idempotency_s = s.idempotency_retention_s
        self.parts: list[Part] = [*PLATFORM_PARTS, *parts]
        self.holders = list(holders)
        m = ctx.metrics
        self.purged = m.counter(
            "orbit_retention_purged_rows_total", "Rows deleted by the retention purge", ["table"]
        )
        self.passes = m.counter(
            "orbit_retention_purge_passes_total", "Purge passes over a namespace"
        )
        self.lag = m.gauge(
            "orbit_retention_purge_lag_seconds",
            "How far behind its windows the purge is: the largest age past its cutoff of "
            "history still waiting, over the namespaces this node purged last",
        )
        self._lags: dict[bytes, float] = {}

    async def _claim(self) -> bytes | None:
        async def run(tx: Tx) -> bytes | None:
            ns = await store.retention_claim_due(tx, None)
            if ns is not None:
                await store.retention_set_next_run(tx, ns, CLAIM_MS, None)
            return ns

        return await self.db.transaction(run)

    async def _start(self, ns: bytes) -> PurgePass | None:
        async def run(tx: Tx) -> PurgePass | None:
            row = await store.retention_get(tx, ns)
            if row is None:
                return None
            now = await clock_now(tx)
            floors = [t for h in self.holders if (t := await h(tx, ns)) is not None]
            hours = row.idempotency_hours
            return PurgePass(
                db=self.db, settings=row, now=now, floor=min(floors) if floors else None,
                batch=self.batch, max_batches=self.max_batches,
                idempotency_s=self.idempotency_s if hours is None else hours * 3600,
                duty=self.duty,
            )  # fmt: skip

        return await self.db.read(run)

    async def purge_namespace(self, ns: bytes) -> PartResult:
        """One pass over namespace ``ns`` (tests call it directly); returns what it did."""
        total = PartResult()
        p = await self._start(ns)
        if p is None:
            return total
        for part in self.parts:
            res = await part(p)
            for table, n in res.deleted.items():
                total.add(table, n)
                self.purged.inc(n, table=table)
            total.lag_s = max(total.lag_s, res.lag_s)
        after_ms = 0 if total.lag_s > 0 else int(self.interval_s * 1000)

        async def finish(tx: Tx) -> None:
            await store.retention_finish_pass(tx, ns, after_ms, None)

        await self.db.transaction(finish)
        self.passes.inc()
        self._lags[ns] = total.lag_s
        self.lag.set(max(self._lags.values(), default=0.0))
        return total

    async def run_once(self, max_namespaces: int = 100) -> int:
        """Claim and purge due namespaces (at most ``max_namespaces``); return rows deleted."""
        deleted = 0
        for _ in range(max_namespaces):
            ns = await self._claim()
            if ns is None:
                break
            try:
                res = await self.purge_namespace(ns)
            except Exception:
                log.exception("retention purge of namespace %s failed", id_hex(ns))
                continue
            deleted += sum(res.deleted.values())
        return deleted

    async def run(self, stop: asyncio.Event) -> None:
        """Loop until ``stop`` is set; errors are logged and retried next interval."""
        while not stop.is_set():
            try:
                await self.run_once()
            except Exception:
                log.exception("retention purge failed")
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(stop.wait(), min(self.interval_s, 5.0))


__all__ = [
    "PLATFORM_PARTS", "Holder", "Part", "PartResult", "PurgePass", "RetentionPurge",
    "purge_audit", "purge_raw_events", "purge_result_events", "purge_transaction",
]  # fmt: skip
