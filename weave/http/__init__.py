"""Weave's HTTP routes. The composition root mounts ``routes()`` at the application root.

Definition routes (versions) and instance routes (start, read, history, signals,
pause/resume/cancel).
"""

from __future__ import annotations

from starlette.routing import BaseRoute

from weave.http import definitions, instances


def routes() -> list[BaseRoute]:
    """Every Weave route."""
    return [*definitions.routes(), *instances.routes()]


__all__ = ["routes"]
