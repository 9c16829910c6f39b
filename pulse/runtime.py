"""Wiring of Pulse's worker side into a server process (called by the composition root).

    hub = pulse.runtime.install(ctx)            # before the app serves requests
    loops = pulse.runtime.background_loops(ctx)  # [dispatcher.run, recovery.run]
    for loop in loops: tasks.append(asyncio.create_task(loop(stop)))

``install`` puts the :class:`~pulse.hub.Hub` at ``ctx.extras["pulse.hub"]`` (the tasks side
and the HTTP routes read it with :func:`installed_hub`, the loops with :func:`hub_of`), and the dispatcher and recovery objects at
``ctx.extras["pulse.dispatcher"]`` / ``ctx.extras["pulse.recovery"]`` (each has
``run_once()`` for tests and tools). Each loop is ``async def run(stop=None)``: it runs until
the ``stop`` event is set (the server's lifespan contract, ``cmd/orbit_cmd/server.py``) or the
task is cancelled.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable

from orbit.context import AppContext
from pulse import queue_gauges
from pulse.dispatch import Dispatcher
from pulse.hub import Hub, Notifier
from pulse.recovery import Recovery
from pulse.sessions import WorkerSettings
from pulse.watchdog import Watchdog

#: ``ctx.extras`` key of the node's hub: read it only through :func:`installed_hub` /
#: :func:`hub_of`.
HUB_KEY = "pulse.hub"
DISPATCHER_KEY = "pulse.dispatcher"
RECOVERY_KEY = "pulse.recovery"
#: ``ctx.extras`` key of the node's stuck-work watchdog (pulse.watchdog.Watchdog).
WATCHDOG_KEY = "pulse.watchdog"


def install(ctx: AppContext, settings: WorkerSettings | None = None) -> Hub:
    """Create this node's hub (once) and store it at ``ctx.extras["pulse.hub"]``."""
    hub = ctx.extras.get(HUB_KEY)
    if not isinstance(hub, Hub):
        hub = Hub(ctx.node_id, settings or WorkerSettings.from_env())
        ctx.extras[HUB_KEY] = hub
        metrics = getattr(ctx, "metrics", None)
        if metrics is not None:
            gauge = metrics.gauge(
                "pulse_worker_connections", "Worker sessions connected to this node", ("kind",)
            )

            async def count_connections() -> None:  # O(connections): not on the scrape
                for kind, n in hub.counts().items():
                    gauge.set(n, kind=kind)

            metrics.add_refresher("pulse_worker_connections", count_connections)
            queue_gauges.install(metrics, ctx.db)
    return hub


def hub_of(ctx: AppContext) -> Hub:
    """The node's hub (installed on first use)."""
    return install(ctx)


def installed_hub(ctx: AppContext) -> Notifier | None:
    """The node's hub when the worker side is installed (:func:`install`; a test may put its
    own :class:`~pulse.hub.Notifier` there), else None: an app that serves only the producer
    routes has no worker streams to push to or wake."""
    hub: Notifier | None = ctx.extras.get(HUB_KEY)
    return hub


def background_loops(ctx: AppContext) -> list[Callable[..., Awaitable[None]]]:
    """The dispatcher and recovery loops of this node: ``loop(stop)`` runs until ``stop`` is
    set (or until cancelled; ``stop`` may be omitted)."""
    hub = install(ctx)
    metrics = getattr(ctx, "metrics", None)
    dispatcher = Dispatcher(ctx.db, hub, metrics=metrics)
    recovery = Recovery(ctx.db, hub, metrics=metrics)
    ctx.extras[DISPATCHER_KEY] = dispatcher
    ctx.extras[RECOVERY_KEY] = recovery
    return [dispatcher.run, recovery.run]


def watchdog_loop(ctx: AppContext) -> Callable[..., Awaitable[None]]:
    """The stuck-work watchdog loop of this node (``pulse.watchdog``); the watchdog object is
    kept at ``ctx.extras["pulse.watchdog"]`` (``run_once()`` for tests and tools)."""
    watchdog = ctx.extras.get(WATCHDOG_KEY)
    if not isinstance(watchdog, Watchdog):
        watchdog = Watchdog(ctx.db, metrics=getattr(ctx, "metrics", None))
        ctx.extras[WATCHDOG_KEY] = watchdog
    return watchdog.run
