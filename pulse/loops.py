"""Pulse's background loops for the composition root (``cmd/orbit_cmd/server.py``).

``background_loops(ctx)`` installs this node's hub (``pulse.runtime.install``) and returns
the dispatcher, recovery, scheduler and stuck-work watchdog (``pulse.watchdog``) loops; each
is ``async loop(stop)`` and is safe to run on every node at once.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable

from orbit.context import AppContext
from pulse import runtime
from pulse.scheduler import Scheduler


def background_loops(ctx: AppContext) -> list[Callable[..., Awaitable[None]]]:
    """Dispatcher, recovery, scheduler and watchdog loops of this node."""
    loops = runtime.background_loops(ctx)
    scheduler = Scheduler(ctx.db, hub=runtime.hub_of(ctx), metrics=getattr(ctx, "metrics", None))
    ctx.extras["pulse.scheduler"] = scheduler
    loops.append(scheduler.run)
    loops.append(runtime.watchdog_loop(ctx))
    return loops
