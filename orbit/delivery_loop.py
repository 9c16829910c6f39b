"""The delivery loop: reclaims expired leases and wakes this node's consumers of
subscriptions that have new result events, on every node at once.

Safe on many nodes: the reclaim works on a subscription under its row lock taken with
``FOR UPDATE SKIP LOCKED``, so two nodes (or a node and a consumer's hand-out, which
reclaims too) never work on one subscription at the same time, and never wait for each
other. Consumers do not depend on the loop for correctness — every hand-out reclaims first
and reads new events itself — the loop keeps EXHAUSTED states and metrics current for
subscriptions nobody is consuming, and wakes this node's consumers (:class:`DeliveryHub`)
when their subscription's cursor is behind its stream: at once after this process commits
result events (:func:`orbit.events.on_streams_moved`, no read), within a round (1 s) for the
events other nodes commit (one read of the watched stream rows a round). Nothing is written ahead of a
hand-out: a subscription's storage grows with what is in flight, not with its backlog.

Start it from the composition root::

    loop = DeliveryLoop(ctx.db, hub=ctx.delivery_hub, metrics=ctx.metrics)
    task = asyncio.create_task(loop.run(stop_event))

Tests call :meth:`DeliveryLoop.run_once` directly (with ``now`` to pin the clock).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime

from orbit import deliveries, delivery_gauges, delivery_probes, delivery_pump, events
from orbit.deliveries import AckItem, AckResult
from orbit.metrics import Registry
from orbit.rounds import NodeRound
from orbit.storage import Database, Tx
from orbit.store import deliveries as delivery_store
from orbit.store import delivery_ranges as range_store
from orbit.store import subscriptions as sub_store

log = logging.getLogger("orbit.delivery_loop")

#: A delivery-loop round between full reads looks at the streams that moved this many
#: seconds back (by the database clock): far more than a round takes, so a move committed
#: late by a slow transaction is still within it.
MOVED_WINDOW_S = 5


class DeliveryHub:
    """Wakes this process's consumers of a subscription when something may be due for them
    (new result events after its cursor, a delivery was nacked, released or given budget).

    Only a hint: consumers also poll, so wake-ups from other nodes are not needed for
    correctness, only for latency.
    """

    def __init__(self) -> None:
        self._events: dict[tuple[bytes, bytes], set[asyncio.Event]] = {}
        self._probes: delivery_probes.LeaseProbes | None = None
        self._acks: NodeRound[AckItem, AckResult] | None = None
        self._acks_db: Database | None = None
        self._handouts: NodeRound[delivery_pump.LeaseAsk, delivery_pump.LeaseBatch] | None = None
        self._handouts_db: Database | None = None

    def hand_out_round(
        self, db: Database
    ) -> NodeRound[delivery_pump.LeaseAsk, delivery_pump.LeaseBatch]:
        """This process's node round of hand-outs on ``db`` (created on first use): the
        hand-outs of every stream and pull that ask while one round's transaction is in
        flight go together into the next (:func:`delivery_pump.lease_round`)."""
        if self._handouts is None or self._handouts_db is not db:
            self._handouts_db = db
            self._handouts = NodeRound(
                lambda asks: delivery_pump.lease_round(db, asks),
                max_items=256,
                name="delivery-hand-outs",
            )
        return self._handouts

    def ack_round(self, db: Database) -> NodeRound[AckItem, AckResult]:
        """This process's node round of acks on ``db`` (created on first use): the acks of
        every connection, pull consumer and namespace that arrive while one round's
        transaction is in flight go together into the next (:func:`deliveries.ack_round`)."""
        if self._acks is None or self._acks_db is not db:
            self._acks_db = db
            self._acks = NodeRound(
                lambda items: deliveries.ack_round(db, items),
                max_items=deliveries.ACK_BATCH,
                name="delivery-acks",
            )
        return self._acks

    def lease_probes(self, db: Database) -> delivery_probes.LeaseProbes:
        """This process's coalesced hand-out probes on ``db`` (created on first use)."""
        if self._probes is None or self._probes.db is not db:
            self._probes = delivery_probes.LeaseProbes(db)
        return self._probes

    def watch(self, namespace_id: bytes, subscription_id: bytes) -> asyncio.Event:
        ev = asyncio.Event()
        self._events.setdefault((namespace_id, subscription_id), set()).add(ev)
        return ev

    def unwatch(self, namespace_id: bytes, subscription_id: bytes, ev: asyncio.Event) -> None:
        key = (namespace_id, subscription_id)
        watchers = self._events.get(key)
        if watchers is not None:
            watchers.discard(ev)
            if not watchers:
                del self._events[key]

    def notify(self, namespace_id: bytes, subscription_id: bytes) -> None:
        for ev in self._events.get((namespace_id, subscription_id), ()):
            ev.set()

    def notify_namespace(self, namespace_id: bytes) -> None:
        for (ns, _), watchers in list(self._events.items()):
            if ns == namespace_id:
                for ev in watchers:
                    ev.set()

    def notify_namespaces(self, namespace_ids: Mapping[bytes, object]) -> None:
        """:meth:`notify_namespace` for several namespaces, in one pass over the watchers."""
        for (ns, _), watchers in list(self._events.items()):
            if ns in namespace_ids:
                for ev in watchers:
                    ev.set()

    def watching(self) -> Sequence[tuple[bytes, bytes]]:
        return list(self._events)


def install_metrics(registry: Registry, db: Database) -> None:
    """Register ``orbit_deliveries{state}`` (PENDING, LEASED, EXHAUSTED), refreshed in the
    background with bounded work, never at scrape time (orbit/delivery_gauges.py). Once per
    registry."""
    delivery_gauges.install(registry, db)


def _install_probe_metrics(registry: Registry, hub: DeliveryHub) -> None:
    """``orbit_delivery_probe_statements_total`` / ``orbit_delivery_probes_total``: the
    coalesced hand-out probes of this process's consumers (delivery_probes.LeaseProbes)."""
    statements = registry.counter(
        "orbit_delivery_probe_statements_total",
        "Hand-out probe statements sent (consumers' probes coalesced: one per poll tick)",
    )
    probed = registry.counter(
        "orbit_delivery_probes_total", "Hand-out probes (subscriptions) those statements carried"
    )

    created = registry.counter(
        "orbit_deliveries_created_total",
        "First-time deliveries handed out by this node (one per matching result event and "
        "subscription)",
    )
    redelivered = registry.counter(
        "orbit_deliveries_redelivered_total",
        "Deliveries handed out again by this node (after a nack, an expired lease or a release)",
    )

    async def collect() -> None:
        created.set_total(delivery_pump.STATS.created)
        redelivered.set_total(delivery_pump.STATS.redelivered)
        probes = hub._probes
        if probes is not None:
            statements.set_total(probes.statements)
            probed.set_total(probes.probed)

    registry.add_collector(collect)


@dataclass
class LoopRound:
    """What one :meth:`DeliveryLoop.run_once` did."""

    behind: int = 0  # namespaces with new result events whose consumers were woken
    redelivered: int = 0  # expired leases put back to PENDING
    exhausted: int = 0  # expired leases that spent their budget
    skipped: int = 0  # subscriptions locked elsewhere (another node or a consumer)
    errors: int = 0  # sweep transactions that failed (logged, retried next round)


class DeliveryLoop:
    """Pumps and sweeps; ``run_once`` is one bounded round, ``run`` repeats it."""

    def __init__(
        self,
        db: Database,
        *,
        hub: DeliveryHub | None = None,
        metrics: Registry | None = None,
        interval_s: float = 1.0,
        subscriptions_per_round: int = 200,
        batches_per_subscription: int = 10,
        sweep_per_round: int = 200,
        sweep_interval_s: float = 1.0,
        full_read_s: float = 2.0,
    ) -> None:
        self.db = db
        self.hub = hub
        self.interval_s = interval_s
        self.subscriptions_per_round = subscriptions_per_round
        self.batches_per_subscription = batches_per_subscription
        self.sweep_per_round = sweep_per_round
        self.sweep_interval_s = sweep_interval_s
        self._last_sweep = float("-inf")
        self._tops: dict[bytes, int] = {}  # last seen stream position per watched namespace
        #: Between full reads of every watched stream (at most every ``full_read_s``), a
        #: round reads only the streams that moved in the last MOVED_WINDOW_S seconds.
        self.full_read_s = full_read_s
        self._last_full = float("-inf")
        self._sweep_after: tuple[bytes, bytes] | None = None
        self._metrics = metrics
        if metrics is not None:
            self._redelivered = metrics.counter(
                "orbit_deliveries_lease_expired_total",
                "Expired delivery leases reclaimed, by outcome",
                ("outcome",),
            )
            self._errors = metrics.counter(
                "orbit_delivery_loop_errors_total", "Failed sweep transactions", ("stage",)
            )
            install_metrics(metrics, db)
            if hub is not None:
                _install_probe_metrics(metrics, hub)

    async def run_once(self, *, now: datetime | None = None) -> LoopRound:
        """One round: wake consumers of subscriptions that are behind (bounded), then — at most every
        ``sweep_interval_s`` — sweep a page of subscriptions for expired leases (continuing
        from the last page next time)."""
        rnd = LoopRound()
        await self._wake_round(rnd)
        await self._sweep_round(rnd, now)
        if self._metrics is not None:
            self._redelivered.inc(rnd.redelivered, outcome="redelivered")
            self._redelivered.inc(rnd.exhausted, outcome="exhausted")
        return rnd

    async def _wake_round(self, rnd: LoopRound) -> None:
        """Wake this node's consumers of the namespaces whose result stream moved since the
        last round (new events to hand out): ONE primary-key read of the watched
        namespaces' stream rows, nothing when no consumer is connected, nothing per stream.
        Nothing is written: the hand-out reads the events itself.

        The read returns only the streams that moved in the last :data:`MOVED_WINDOW_S`
        seconds (their ``updated_at``), so a quiet node decodes no rows; every
        ``full_read_s``, and whenever a namespace starts being watched, it reads every
        watched stream instead (a stream stamped with a clock older than the window — a
        pinned test clock, a round stalled for longer — is seen there). Wakes are hints:
        consumers also look on their own tick."""
        if self.hub is None:
            return
        namespaces = {ns for ns, _ in self.hub.watching()}
        if not namespaces:
            self._tops.clear()
            return
        clock = time.monotonic()
        full = clock - self._last_full >= self.full_read_s or not namespaces <= self._tops.keys()
        order = sorted(namespaces)

        async def tops(tx: Tx) -> dict[bytes, int]:
            if full:
                return await sub_store.subscription_stream_tops(tx, order)
            return await sub_store.subscription_streams_moved(tx, order, MOVED_WINDOW_S)

        seen = await self.db.read(tops)
        if full:
            self._last_full = clock
        tops_now: dict[bytes, int] = {}
        for ns in order:
            top = seen.get(ns, 0) if full else seen.get(ns, self._tops.get(ns, 0))
            if top != self._tops.get(ns):
                rnd.behind += 1
                self.hub.notify_namespace(ns)
            tops_now[ns] = top
        self._tops = tops_now

    async def _sweep_round(self, rnd: LoopRound, now: datetime | None) -> None:
        """Reclaim expired leases of a page of subscriptions (at most every
        ``sweep_interval_s``): a non-locking probe first, the locking reclaim only where a
        lease has really expired."""
        clock = time.monotonic()
        if clock - self._last_sweep < self.sweep_interval_s:
            return
        self._last_sweep = clock

        after = self._sweep_after
        Key = tuple[bytes, bytes]

        async def page(tx: Tx) -> tuple[Key | None, list[sub_store.SubscriptionKey]]:
            found = await sub_store.subscription_list_page(tx, after, self.sweep_per_round)
            keys = [(k.namespace_id, k.id) for k in found]
            if now is None:  # the whole page in ONE statement (the hand-out probe)
                seen = await delivery_store.delivery_lease_probe_many(tx, keys)
                expired = [k for k in found if (p := seen.get((k.namespace_id, k.id)))
                           and p[1].expired]  # fmt: skip
            else:  # a pinned clock (tests): the probe reads the database clock
                expired = [
                    k
                    for k in found
                    if await delivery_store.delivery_expired_exists(tx, k.namespace_id, k.id, now)
                    or await range_store.range_expired_exists(tx, k.namespace_id, k.id, now)
                ]
            full = len(found) == self.sweep_per_round
            return ((found[-1].namespace_id, found[-1].id) if full else None), expired

        self._sweep_after, keys = await self.db.read(page)
        for k in keys:
            try:
                res = await delivery_pump.reclaim_subscription(
                    self.db, k.namespace_id, k.id, now=now
                )
            except Exception:
                log.exception("lease sweep failed")
                self._count_error(rnd, "sweep")
                continue
            if res is None:
                rnd.skipped += 1
                continue
            rnd.redelivered += res[0]
            rnd.exhausted += res[1]
            if res[0] and self.hub is not None:
                self.hub.notify(k.namespace_id, k.id)

    def _count_error(self, rnd: LoopRound, stage: str) -> None:
        rnd.errors += 1
        if self._metrics is not None:
            self._errors.inc(stage=stage)

    async def run(self, stop: asyncio.Event | None = None) -> None:
        """Repeat :meth:`run_once` every ``interval_s`` until ``stop`` is set (or cancelled).

        A failing round (database down) is logged and retried with a growing pause.
        """
        stop = stop or asyncio.Event()
        failures = 0
        # Result events this process commits wake its consumers at once; the rounds' reads
        # find the events other nodes commit (within ``interval_s``).
        unlisten = events.on_streams_moved(self._moved_here)
        try:
            while not stop.is_set():
                try:
                    await self.run_once()
                    failures = 0
                except Exception:
                    failures += 1
                    log.exception("delivery loop round failed (%d in a row)", failures)
                delay = self.interval_s * min(2**failures, 50)
                with contextlib.suppress(TimeoutError):
                    async with asyncio.timeout(delay):
                        await stop.wait()
        finally:
            unlisten()

    def _moved_here(self, tops: dict[bytes, int]) -> None:
        """After this process committed result events: wake the consumers of those
        namespaces and remember the new tops (so the next read does not wake them again)."""
        if self.hub is None:
            return
        self.hub.notify_namespaces(tops)
        for ns, top in tops.items():
            if ns in self._tops:
                self._tops[ns] = max(self._tops[ns], top)
