"""Pulse's HTTP/WebSocket routes, mounted by the composition root (``cmd/orbit_cmd/server.py``
lists ``pulse.http`` in ROUTE_MODULES and calls :func:`routes`).

Each module named in :data:`ROUTE_MODULES` exposes ``routes()`` or ``routes(ctx)``. A module
that does not exist yet is skipped (only when the missing module is that very module; an
import error inside an existing module is raised).
"""

from __future__ import annotations

import importlib
import inspect
from typing import Any

from starlette.routing import BaseRoute

#: Route modules, in mounting order.
ROUTE_MODULES: tuple[str, ...] = (
    "pulse.http.queues",  # queues and gates (producer/operator side)
    "pulse.http.tasks",  # tasks (producer/operator side)
    "pulse.http.workers",  # worker sessions, stream, HTTP fallback (worker side)
    "pulse.http.schedules",  # schedules, pause/resume, occurrences
    "pulse.http.schedule_controls",  # schedule trigger, backfill, delete
    "pulse.http.queue_delete",  # queue delete
    "pulse.http.workers_view",  # connected workers, operator close
    "pulse.http.rerun",  # re-run finished tasks
    "pulse.http.task_history",  # a task's raw state events
)


def _load(name: str) -> Any:
    try:
        return importlib.import_module(name)
    except ModuleNotFoundError as exc:
        if exc.name == name:
            return None
        raise


def routes(ctx: Any = None) -> list[BaseRoute]:
    """Every Pulse route (``ctx`` is passed to modules whose ``routes`` takes it)."""
    out: list[BaseRoute] = []
    for name in ROUTE_MODULES:
        mod = _load(name)
        if mod is None or not hasattr(mod, "routes"):
            continue
        fn = mod.routes
        out.extend(fn(ctx) if inspect.signature(fn).parameters else fn())
    return out
