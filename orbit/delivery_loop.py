"""The delivery loop: pumps subscriptions that are behind their namespace's result stream and
reclaims expired leases, on every node at once.

Safe on many nodes: each subscription is worked on under its row lock taken with
``FOR UPDATE SKIP LOCKED``, so two nodes (or a node and a consumer's hand-out, which pumps
and reclaims too) never work on one subscription at the same time, and never wait for each
other; the unique key (namespace, subscription, seq) backs this up. Consumers do not depend
on the loop for correctness — every hand-out pumps and reclaims first — the loop keeps
backlog counts, EXHAUSTED states and metrics current for subscriptions nobody is consuming,
and wakes this node's consumers (:class:`DeliveryHub`) when it created
deliveries for them.

Start it from the composition root::

    loop = DeliveryLoop(ctx.db, hub=deliveries_hub(ctx), metrics=ctx.metrics)
    task = asyncio.create_task(loop.run(stop_event))

Tests call :meth:`DeliveryLoop.run_once` directly (with ``now`` to pin the clock).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime

from orbit import deliveries, delivery_gauges, delivery_pump
from orbit.deliveries import AckItem, AckResult
from orbit.delivery_pump import PUMP_BATCH
from orbit.errors import Conflict
from orbit.metrics import Registry
from orbit.rounds import NodeRound
from orbit.storage import Database, DuplicateKey, Tx
from orbit.store import deliveries as delivery_store
from orbit.store import subscriptions as sub_store

log = logging.getLogger("orbit.delivery_loop")

HUB_KEY = "orbit.deliveries.hub"

class DeliveryHub:
    """Wakes this process's consumers of a subscription when something may be due for them
    (the local pump created deliveries, a delivery was nacked, released or given budget).

    Only a hint: consumers also poll, so wake-ups from other nodes are not needed for
    correctness, only for latency.
    """

    def __init__(self) -> None:
        self._events: dict[tuple[bytes, bytes], set[asyncio.Event]] = {}
        self._probes: delivery_pump.LeaseProbes | None = None
        self._acks: NodeRound[AckItem, AckResult] | None = None
        self._acks_db: Database | None = None

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

    def lease_probes(self, db: Database) -> delivery_pump.LeaseProbes:
        """This process's coalesced hand-out probes on ``db`` (created on first use)."""
        if self._probes is None or self._probes.db is not db:
            self._probes = delivery_pump.LeaseProbes(db)
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

    def watching(self) -> Sequence[tuple[bytes, bytes]]:
        return list(self._events)


def deliveries_hub(ctx: object) -> DeliveryHub:
    """The process's DeliveryHub, kept in ``ctx.extras`` (created on first use)."""
    extras: dict[str, object] = ctx.extras  # type: ignore[attr-defined]
    hub = extras.get(HUB_KEY)
    if not isinstance(hub, DeliveryHub):
        hub = DeliveryHub()
        extras[HUB_KEY] = hub
    return hub


def install_metrics(registry: Registry, db: Database) -> None:
    """Register ``orbit_deliveries{state}`` (PENDING, LEASED, EXHAUSTED), refreshed in the
    background with bounded work, never at scrape time (orbit/delivery_gauges.py). Once per
    registry."""
    delivery_gauges.install(registry, db)


def _install_probe_metrics(registry: Registry, hub: DeliveryHub) -> None:
    """``orbit_delivery_probe_statements_total`` / ``orbit_delivery_probes_total``: the
    coalesced hand-out probes of this process's consumers (delivery_pump.LeaseProbes)."""
    statements = registry.counter(
        "orbit_delivery_probe_statements_total",
        "Hand-out probe statements sent (consumers' probes coalesced: one per poll tick)",
    )
    probed = registry.counter(
        "orbit_delivery_probes_total", "Hand-out probes (subscriptions) those statements carried"
    )

    async def collect() -> None:
        probes = hub._probes
        if probes is not None:
            statements.set_total(probes.statements)
            probed.set_total(probes.probed)

    registry.add_collector(collect)


@dataclass
class LoopRound:
    """What one :meth:`DeliveryLoop.run_once` did."""

    pumped: int = 0  # pump transactions that scanned events
    scanned: int = 0  # events scanned
    created: int = 0  # deliveries created
    redelivered: int = 0  # expired leases put back to PENDING
    exhausted: int = 0  # expired leases that spent their budget
    skipped: int = 0  # subscriptions locked elsewhere (another node or a consumer)
    errors: int = 0  # pump or sweep transactions that failed (logged, retried next round)


class DeliveryLoop:
    """Pumps and sweeps; ``run_once`` is one bounded round, ``run`` repeats it."""

    def __init__(
        self,
        db: Database,
        *,
        hub: DeliveryHub | None = None,
        metrics: Registry | None = None,
        interval_s: float = 0.2,
        subscriptions_per_round: int = 200,
        batches_per_subscription: int = 10,
        sweep_per_round: int = 200,
        sweep_interval_s: float = 1.0,
    ) -> None:
        self.db = db
        self.hub = hub
        self.interval_s = interval_s
        self.subscriptions_per_round = subscriptions_per_round
        self.batches_per_subscription = batches_per_subscription
        self.sweep_per_round = sweep_per_round
        self.sweep_interval_s = sweep_interval_s
        self._last_sweep = float("-inf")
        self._sweep_after: tuple[bytes, bytes] | None = None
        self._metrics = metrics
        if metrics is not None:
            self._created = metrics.counter(
                "orbit_deliveries_created_total", "Deliveries created by the pump"
            )
            self._redelivered = metrics.counter(
                "orbit_deliveries_lease_expired_total",
                "Expired delivery leases reclaimed, by outcome",
                ("outcome",),
            )
            self._errors = metrics.counter(
                "orbit_delivery_loop_errors_total", "Failed pump or sweep transactions", ("stage",)
            )
            install_metrics(metrics, db)
            if hub is not None:
                _install_probe_metrics(metrics, hub)

    async def run_once(self, *, now: datetime | None = None) -> LoopRound:
        """One round: pump every subscription that is behind (bounded), then — at most every
        ``sweep_interval_s`` — sweep a page of subscriptions for expired leases (continuing
        from the last page next time)."""
        rnd = LoopRound()
        await self._pump_round(rnd, now)
        await self._sweep_round(rnd, now)
        if self._metrics is not None:
            self._created.inc(rnd.created)
            self._redelivered.inc(rnd.redelivered, outcome="redelivered")
            self._redelivered.inc(rnd.exhausted, outcome="exhausted")
        return rnd

    async def _pump_round(self, rnd: LoopRound, now: datetime | None) -> None:
        async def behind(tx: Tx) -> list[sub_store.BehindRow]:
            return await sub_store.subscription_list_behind(tx, self.subscriptions_per_round)

        for b in await self.db.read(behind):
            created = 0
            for _ in range(self.batches_per_subscription):
                try:
                    res = await delivery_pump.pump_subscription(
                        self.db, b.namespace_id, b.id, now=now, skip_locked=True
                    )
                except (DuplicateKey, Conflict) as exc:
                    # Another pump raced past the lock (should not happen): nothing was
                    # written, the next round starts from the committed position.
                    log.error("pump conflict on a subscription: %s", exc)
                    self._count_error(rnd, "pump")
                    break
                except Exception:
                    log.exception("pump failed")
                    self._count_error(rnd, "pump")
                    break
                if res is None:
                    rnd.skipped += 1
                    break
                if res.scanned:
                    rnd.pumped += 1
                rnd.scanned += res.scanned
                rnd.created += res.created
                created += res.created
                if res.scanned < PUMP_BATCH:
                    break
            if created and self.hub is not None:
                self.hub.notify(b.namespace_id, b.id)

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
            expired = [
                k
                for k in found
                if await delivery_store.delivery_expired_exists(tx, k.namespace_id, k.id, now)
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
