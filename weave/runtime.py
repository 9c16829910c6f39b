"""Weave on one node, built once by the composition root (``cmd/orbit_cmd/server.py``).

    weave.runtime.install_hooks()                     # Pulse's terminal-task hook
    runtime = WeaveRuntime.build(ctx, pulse_runtime)  # advancer and timer loop
    routes = weave.http.routes(runtime)
    loops = runtime.loops()                           # [advancer.run, timers.run]

:class:`WeaveRuntime` holds the :class:`~weave.advancer.Advancer` (routes wake it after
committing a signal) and the :class:`~weave.timers.TimerLoop`, with the node's Pulse runtime
whose hub pushes cancels to workers and wakes the dispatcher. Both loops are safe on any
number of nodes; each runs until its stop event is set. Tunables from the environment:
``ORBIT_WEAVE_ADVANCER_POLL_MS`` (default 200) and ``ORBIT_WEAVE_TIMER_POLL_MS`` (default 250).
"""

from __future__ import annotations

import os
from dataclasses import dataclass

from orbit.context import AppContext
from orbit.storage import Database
from pulse.runtime import Loop, PulseRuntime
from weave.advancer import Advancer, AdvancerSettings
from weave.inbox import install_hook
from weave.timers import TimerLoop, TimerSettings

__all__ = ["WeaveRuntime", "install_hooks"]


def _ms(name: str, default: int) -> float:
    return int(os.environ.get(name, default)) / 1000


def install_hooks() -> None:
    """Register Weave's hook in Pulse: a finished task of a workflow step becomes an inbox
    event in the same transaction (:func:`weave.inbox.on_task_result`). Idempotent."""
    install_hook()


@dataclass(eq=False, slots=True)
class WeaveRuntime:
    """Weave on this node: what its routes and loops share. Build it with :meth:`build`."""

    ctx: AppContext
    pulse: PulseRuntime
    advancer: Advancer
    timers: TimerLoop

    @property
    def db(self) -> Database:
        return self.ctx.db

    @classmethod
    def build(
        cls,
        ctx: AppContext,
        pulse: PulseRuntime,
        *,
        advancer: AdvancerSettings | None = None,
        timers: TimerSettings | None = None,
    ) -> WeaveRuntime:
        """The advancer and timer loop of this node (settings left out come from the
        environment)."""
        adv = Advancer(
            ctx.db,
            hub=pulse.hub,
            metrics=ctx.metrics,
            settings=advancer or AdvancerSettings(poll_s=_ms("ORBIT_WEAVE_ADVANCER_POLL_MS", 200)),
        )
        timer_loop = TimerLoop(
            ctx.db,
            settings=timers or TimerSettings(poll_s=_ms("ORBIT_WEAVE_TIMER_POLL_MS", 250)),
            on_fired=adv.wake,
        )
        return cls(ctx=ctx, pulse=pulse, advancer=adv, timers=timer_loop)

    def loops(self) -> list[Loop]:
        """The advancer and timer loops of this node (``async (stop) -> None``)."""
        return [self.advancer.run, self.timers.run]
