"""Pulse's HTTP/WebSocket routes, mounted by the composition root (``cmd/orbit_cmd/server.py``
calls :func:`routes` with the node's :class:`~pulse.runtime.PulseRuntime`).

Each area module has its own ``routes(...)``; the list below is the whole of Pulse's API, in
mounting order. A new route module is added here.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from starlette.routing import BaseRoute

from pulse.http import (
    queue_delete,
    queues,
    rerun,
    schedule_controls,
    schedules,
    task_history,
    tasks,
    workers,
    workers_view,
)

if TYPE_CHECKING:
    from pulse.runtime import PulseRuntime


def routes(rt: PulseRuntime) -> list[BaseRoute]:
    """Every Pulse route; handlers that push to workers or use the node's batches and
    admission are bound to ``rt``."""
    return [
        *queues.routes(),  # queues and gates (producer/operator side)
        *tasks.routes(rt),  # tasks (producer/operator side)
        *workers.routes(rt),  # worker sessions, stream, HTTP fallback (worker side)
        *schedules.routes(),  # schedules, pause/resume, occurrences
        *schedule_controls.routes(rt),  # schedule trigger, backfill, delete
        *queue_delete.routes(),  # queue delete
        *workers_view.routes(rt),  # connected workers, operator close
        *rerun.routes(rt),  # re-run finished tasks
        *task_history.routes(),  # a task's raw state events
    ]


__all__ = ["routes"]
