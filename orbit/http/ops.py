"""Open operational endpoints (no key): ``/healthz``, ``/readyz``, ``/metrics``, ``/openapi.json``.

``/readyz`` answers 200 only when the database is reachable, the migrations are current and
clean (``orbit.migrate.status``: nothing pending, not dirty, no changed file) and the schema
has zero foreign keys; otherwise 503 ``not_ready`` listing the problems. The migration check
runs in a thread (the migrate package is synchronous) and its result is cached for
``READINESS_TTL_S`` so a probe storm costs one check per second per node.
"""

from __future__ import annotations

import asyncio
import time

import msgspec
from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route

from orbit import migrate
from orbit.context import AppContext
from orbit.errors import NotReady
from orbit.http.openapi import api, openapi_document
from orbit.http.responses import json_response

READINESS_TTL_S = 1.0


class Health(msgspec.Struct, frozen=True):
    status: str
    node_id: str


class Readiness(msgspec.Struct, frozen=True):
    status: str
    database: bool
    migrations_current: bool
    foreign_keys: int
    problems: list[str]


async def check_readiness(ctx: AppContext) -> Readiness:
    """Database reachable, migrations current and clean, zero foreign keys."""
    if not await ctx.db.ping():
        return Readiness("not_ready", False, False, 0, ["database unreachable"])
    try:
        st = await asyncio.to_thread(migrate.status, ctx.db.dsn)
    except Exception as exc:
        return Readiness("not_ready", False, False, 0, [f"migration status failed: {exc}"])
    problems = st.problems()
    return Readiness(
        "ready" if st.current else "not_ready", True, st.current, st.foreign_keys, problems
    )


@api("Liveness: the process is up", responses={200: Health}, open=True, tags=["operations"])
async def healthz(request: Request) -> Response:
    ctx: AppContext = request.app.state.ctx
    return json_response(Health("ok", ctx.node_id))


@api(
    "Readiness: database reachable, migrations current, zero foreign keys",
    responses={200: Readiness}, errors=[503], open=True, tags=["operations"],
)  # fmt: skip
async def readyz(request: Request) -> Response:
    ctx: AppContext = request.app.state.ctx
    cache, now = ctx.ops, time.monotonic()
    if cache.readiness is not None and cache.readiness_until > now:
        result = cache.readiness
    else:
        result = await check_readiness(ctx)
        cache.readiness, cache.readiness_until = result, now + READINESS_TTL_S
    if result.status != "ready":
        raise NotReady(
            "not ready: " + "; ".join(result.problems), retry_after=1, problems=result.problems
        )
    return json_response(result)


@api("Prometheus metrics (text exposition)", open=True, tags=["operations"])
async def metrics(request: Request) -> Response:
    ctx: AppContext = request.app.state.ctx
    text = await ctx.metrics.scrape()
    return Response(text, media_type="text/plain; version=0.0.4; charset=utf-8")


@api("This OpenAPI document", open=True, tags=["operations"])
async def openapi(request: Request) -> Response:
    cache = request.app.state.ctx.ops
    if cache.openapi is None:
        cache.openapi = msgspec.json.encode(openapi_document(request.app.routes, title="Orbit"))
    return Response(cache.openapi, media_type="application/json")


def routes() -> list[Route]:
    return [
        Route("/healthz", healthz, methods=["GET"]),
        Route("/readyz", readyz, methods=["GET"]),
        Route("/metrics", metrics, methods=["GET"]),
        Route("/openapi.json", openapi, methods=["GET"]),
    ]


def register_platform_metrics(ctx: AppContext) -> None:
    """Collectors for transaction stats (``db.stats``) and pool usage."""
    reg = ctx.metrics
    commits = reg.counter("orbit_db_commits_total", "Committed transactions")
    rollbacks = reg.counter("orbit_db_rollbacks_total", "Rolled back transactions")
    retries = reg.counter(
        "orbit_db_transaction_retries_total", "Transactions retried, by MySQL error code", ("code",)
    )
    kinds = reg.counter(
        "orbit_db_transaction_retries_by_kind_total",
        "Transactions retried, by kind: deadlock, certification (1213 at COMMIT, a Galera "
        "certification failure), lock_wait_timeout, snapshot, connection",
        ("kind",),
    )
    exhausted = reg.counter(
        "orbit_db_retries_exhausted_total", "Transactions that ran out of retries"
    )
    unknown = reg.counter("orbit_db_outcome_unknown_total", "Connections lost during COMMIT")
    pool = reg.gauge("orbit_db_pool_connections", "Pool connections by state", ("state",))
    pool_max = reg.gauge("orbit_db_pool_max_connections", "Pool size limit")

    def collect() -> None:
        s = ctx.db.stats
        commits.set_total(s.commits)
        rollbacks.set_total(s.rollbacks)
        for code, n in s.retries.items():
            retries.set_total(n, code=str(code))
        for kind, n in s.retry_kinds.items():
            kinds.set_total(n, kind=kind)
        exhausted.set_total(s.exhausted)
        unknown.set_total(s.outcome_unknown)
        size, free, maxsize = ctx.db.pool_usage()
        pool.set(size - free, state="in_use")
        pool.set(free, state="idle")
        pool_max.set(maxsize)

    reg.add_collector(collect)
    # Make sure the conflict counter is always exposed, even before the first conflict.
    from orbit.metrics import conflicts

    conflicts(reg)
