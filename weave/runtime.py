"""Wiring of the Weave engine into a server process (called by the composition root).

    advancer = weave.runtime.install(ctx)         # also registers the Pulse terminal hook
    loops = weave.runtime.background_loops(ctx)   # [advancer.run, timers.run]
    for loop in loops: tasks.append(asyncio.create_task(loop(stop_event)))

``install`` keeps the :class:`~weave.advancer.Advancer` at ``ctx.extras["weave.advancer"]``
(routes wake it after committing a signal) and the :class:`~weave.timers.TimerLoop` at
``ctx.extras["weave.timers"]``. Both loops are safe on any number of nodes; each runs until
its stop event is set. Tunables from the environment: ``ORBIT_WEAVE_ADVANCER_POLL_MS``
(default 200) and ``ORBIT_WEAVE_TIMER_POLL_MS`` (default 250).
"""

from __future__ import annotations

import asyncio
import os
from collections.abc import Awaitable, Callable

from orbit.context import AppContext
from pulse import runtime as pulse_runtime
from weave.advancer import Advancer, AdvancerSettings
from weave.inbox import install_hook
from weave.timers import TimerLoop, TimerSettings

ADVANCER_KEY = "weave.advancer"
TIMERS_KEY = "weave.timers"

Loop = Callable[[asyncio.Event], Awaitable[None]]


def _ms(name: str, default: int) -> float:
    return int(os.environ.get(name, default)) / 1000


def install(ctx: AppContext) -> Advancer:
    """Create this node's advancer and timer loop once (stored in ``ctx.extras``)."""
    install_hook()
    advancer = ctx.extras.get(ADVANCER_KEY)
    if not isinstance(advancer, Advancer):
        # The Pulse hub pushes cancels to workers and wakes the dispatcher.
        hub = pulse_runtime.install(ctx)
        advancer = Advancer(
            ctx.db,
            hub=hub,
            metrics=getattr(ctx, "metrics", None),
            settings=AdvancerSettings(poll_s=_ms("ORBIT_WEAVE_ADVANCER_POLL_MS", 200)),
        )
        ctx.extras[ADVANCER_KEY] = advancer
        ctx.extras[TIMERS_KEY] = TimerLoop(
            ctx.db,
            settings=TimerSettings(poll_s=_ms("ORBIT_WEAVE_TIMER_POLL_MS", 250)),
            on_fired=advancer.wake,
        )
    return advancer


def background_loops(ctx: AppContext) -> list[Loop]:
    """The advancer and timer loops of this node (``async (stop) -> None``)."""
    advancer = install(ctx)
    timers: TimerLoop = ctx.extras[TIMERS_KEY]
    return [advancer.run, timers.run]


def wake(ctx: AppContext) -> None:
    """Wake this node's advancer, when it runs here (after committing an inbox event)."""
    advancer = ctx.extras.get(ADVANCER_KEY)
    if isinstance(advancer, Advancer):
        advancer.wake()
