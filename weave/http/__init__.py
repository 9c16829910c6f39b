"""Weave's HTTP routes. The composition root mounts ``routes(runtime)`` at the application
root (instance routes are bound to the node's :class:`~weave.runtime.WeaveRuntime`).

Definition routes (versions) and instance routes (start, read, history, signals,
pause/resume/cancel).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from starlette.routing import BaseRoute

from weave.http import definitions, instances

if TYPE_CHECKING:
    from weave.runtime import WeaveRuntime


def routes(rt: WeaveRuntime) -> list[BaseRoute]:
    """Every Weave route."""
    return [*definitions.routes(), *instances.routes(rt)]


__all__ = ["routes"]
