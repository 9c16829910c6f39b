"""Pulse's long-lived objects on one node, built once by the composition root.

    runtime = PulseRuntime.build(ctx)        # cmd/orbit_cmd/server.py, before serving
    routes = pulse.http.routes(runtime)      # every handler gets the runtime it needs
    loops = runtime.loops()                  # dispatcher, recovery, scheduler, watchdog

:class:`PulseRuntime` holds the node's :class:`~pulse.hub.Hub`, the dispatcher, recovery,
scheduler and stuck-work watchdog (each with ``run_once()`` for tests and tools), the group
commits of worker messages and of submits, and the worker stream admission. Nothing in Pulse
builds these lazily or finds them by name: a handler or loop is handed the runtime. Each loop
is ``async def run(stop)``: it runs until the ``stop`` event is set (the server's lifespan
contract, ``cmd/orbit_cmd/server.py``) or the task is cancelled.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Coroutine
from dataclasses import dataclass
from typing import Any

from orbit.context import AppContext
from orbit.metrics import Registry
from orbit.settings import Settings
from orbit.storage import Database
from pulse import queue_gauges
from pulse.batcher import SubmitBatches, WorkerBatches
from pulse.dispatch import Dispatcher
from pulse.http.admission import Admission, AdmissionSettings
from pulse.hub import Hub, Notifier
from pulse.recovery import Recovery
from pulse.scheduler import Scheduler
from pulse.sessions import WorkerSettings
from pulse.watchdog import Watchdog, WatchdogSettings

__all__ = ["Loop", "Notifier", "PulseRuntime"]

#: A background loop: runs until the event is set (then returns promptly).
Loop = Callable[[asyncio.Event], Coroutine[Any, Any, None]]


@dataclass(eq=False, slots=True)
class PulseRuntime:
    """Pulse on this node: what its routes and loops share. Build it with :meth:`build`."""

    ctx: AppContext
    hub: Hub
    dispatcher: Dispatcher
    recovery: Recovery
    scheduler: Scheduler
    watchdog: Watchdog
    #: Group commit of worker starts, reports and heartbeats (pulse/batcher.py).
    batches: WorkerBatches
    #: Rounds of single submits without an Idempotency-Key (pulse/batcher.py).
    submit_batches: SubmitBatches
    #: Worker stream budgets and the tenants' share of frame handling.
    admission: Admission

    @property
    def db(self) -> Database:
        return self.ctx.db

    @property
    def metrics(self) -> Registry:
        return self.ctx.metrics

    @property
    def settings(self) -> Settings:
        return self.ctx.settings

    @classmethod
    def build(
        cls,
        ctx: AppContext,
        *,
        workers: WorkerSettings | None = None,
        admission: AdmissionSettings | None = None,
        watchdog: WatchdogSettings | None = None,
        hub: Hub | None = None,
    ) -> PulseRuntime:
        """Every Pulse object of this node, and their gauges in ``ctx.metrics``. Settings
        left out come from the environment; ``hub`` replaces the node's hub (``workers`` then
        does not apply)."""
        db, metrics = ctx.db, ctx.metrics
        if hub is None:
            hub = Hub(ctx.node_id, workers or WorkerSettings.from_env())
        runtime = cls(
            ctx=ctx,
            hub=hub,
            dispatcher=Dispatcher(db, hub, metrics=metrics),
            recovery=Recovery(db, hub, metrics=metrics),
            scheduler=Scheduler(db, hub=hub, metrics=metrics),
            watchdog=Watchdog(db, settings=watchdog, metrics=metrics),
            batches=WorkerBatches(db),
            submit_batches=SubmitBatches(db, hub=hub),
            admission=Admission(admission, metrics=metrics),
        )
        runtime._register_gauges()
        return runtime

    def loops(self) -> list[Loop]:
        """The dispatcher, recovery, scheduler and watchdog loops of this node; each is safe
        to run on every node at once."""
        return [self.dispatcher.run, self.recovery.run, self.scheduler.run, self.watchdog.run]

    def _register_gauges(self) -> None:
        metrics, hub, batches = self.metrics, self.hub, self.batches
        connections = metrics.gauge(
            "pulse_worker_connections", "Worker sessions connected to this node", ("kind",)
        )

        async def count_connections() -> None:  # O(connections): not on the scrape
            for kind, n in hub.counts().items():
                connections.set(n, kind=kind)

        metrics.add_refresher("pulse_worker_connections", count_connections)
        queue_gauges.install(metrics, self.db)
        rounds = metrics.gauge(
            "pulse_group_commit_batches", "Transactions run by the group commit", ("kind",)
        )
        items = metrics.gauge(
            "pulse_group_commit_items", "Worker messages applied by group commit", ("kind",)
        )
        largest = metrics.gauge("pulse_group_commit_largest", "Largest batch so far", ("kind",))

        def collect() -> None:
            for kind, gc in (("start", batches.starts), ("report", batches.reports),
                             ("heartbeat", batches.heartbeats)):  # fmt: skip
                rounds.set(gc.stats.batches, kind=kind)
                items.set(gc.stats.items, kind=kind)
                largest.set(gc.stats.largest, kind=kind)

        metrics.add_collector(collect)
