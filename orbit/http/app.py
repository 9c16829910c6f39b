"""``build_app``: the Starlette application with the platform's middleware, error handlers,
open operational routes, admin routes and the result events route, plus whatever routes the
composition root passes in (Pulse, Weave)."""

from __future__ import annotations

from collections.abc import Sequence

from starlette.applications import Starlette
from starlette.middleware import Middleware
from starlette.routing import BaseRoute
from starlette.types import Lifespan

from orbit.context import AppContext
from orbit.http import admin, events, ops
from orbit.http.errors import exception_handlers
from orbit.http.middleware import RequestContextMiddleware


def platform_routes() -> list[BaseRoute]:
    """The platform's own routes (open ops routes, admin, result events)."""
    return [*ops.routes(), *admin.routes(), *events.routes()]


def build_app(
    ctx: AppContext,
    extra_routes: Sequence[BaseRoute] = (),
    *,
    lifespan: Lifespan[Starlette] | None = None,
) -> Starlette:
    """The HTTP/WSS application. ``ctx`` is stored on ``app.state.ctx``.

    ``extra_routes`` are appended after the platform routes (other packages' routes);
    ``lifespan`` is passed to Starlette (the server uses it to start background loops).
    """
    ops.register_platform_metrics(ctx)
    app = Starlette(
        routes=[*platform_routes(), *extra_routes],
        middleware=[Middleware(RequestContextMiddleware, ctx=ctx)],
        exception_handlers=exception_handlers(),
        lifespan=lifespan,
    )
    app.state.ctx = ctx
    return app
