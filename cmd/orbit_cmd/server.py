"""``orbit-server``: the composition root. Builds the context, mounts every package's routes,
starts every background loop, serves with uvicorn.

    orbit-server [--version] [--host 127.0.0.1] [--port 8080] [--dsn DSN] [--dev] [--pool-size N]
                 [--pool-timeout S] [--tenant-pool-share F] [--db-driver aiomysql|asyncmy]
                 [--max-body-bytes N]
                 [--header-timeout S] [--http h11|httptools|auto]
                 [--log-level info] [--plain-logs]

Before serving it checks the schema (``orbit.migrate.status``) and **refuses to start** —
one line per problem on stderr, non-zero exit — when migrations are pending, the schema is
dirty, an applied file changed, or a foreign key exists.

Exit codes (aligned with ``orbit-migrate``): 0 clean shutdown; 1 schema not current (or the
dev bootstrap failed); 2 bad arguments; 3 database unreachable.

``--dev``: when no server answers at the DSN, start a private MariaDB/MySQL
(``orbit_cmd.devdb``), then migrate, bootstrap application ``demo`` / namespace ``default`` with a
global admin key, and print the bootstrap JSON line on stdout before serving.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import logging
import os
import signal
import sys
from collections.abc import AsyncIterator, Callable, Coroutine, Sequence
from contextlib import AbstractAsyncContextManager
from dataclasses import dataclass
from typing import Any

import pymysql
import uvicorn
from starlette.applications import Starlette
from starlette.routing import BaseRoute

from orbit import logs, migrate
from orbit.context import AppContext
from orbit.delivery_loop import DeliveryLoop
from orbit.http import audit, retention, subscription_delete, subscriptions, ui
from orbit.http.app import build_app
from orbit.idempotency_cleanup import IdempotencyCleanup
from orbit.retention_purge import RetentionPurge
from orbit.settings import Settings
from orbit.storage import DSN, Database
from orbit.storage.drivers import load_driver
from orbit.version import __version__
from orbit_cmd.devdb import DevDatabase, ensure_dev_database
from orbit_cmd.http_protocols import HeadDeadlineH11, http_protocol
from orbit_cmd.ws_protocol import ClosingWebSocketProtocol
from pulse import http as pulse_http
from pulse.runtime import Loop, PulseRuntime
from pulse.sessions import WorkerSettings
from pulse.task_purge import TaskPurge, oldest_unfinished_task
from weave import http as weave_http
from weave import runtime as weave_runtime
from weave.retention import oldest_running_instance, running_instance_tasks
from weave.runtime import WeaveRuntime

log = logging.getLogger("orbit.server")

EXIT_OK = 0
EXIT_NOT_CURRENT = 1
EXIT_USAGE = 2
EXIT_UNAVAILABLE = 3

STOP_GRACE_S = 10.0


# =============================================================================================
# COMPOSITION POINT. Every package plugs in here and nowhere else: its runtime is built once
# (:func:`build_node`), its routes come from its explicit ``routes(...)`` (:func:`routes`),
# its loops from its runtime (:func:`background_loops`), its hooks are registered here.
# =============================================================================================


@dataclass(eq=False, slots=True)
class Node:
    """Everything one server process runs: the platform context and each package's runtime."""

    ctx: AppContext
    pulse: PulseRuntime
    weave: WeaveRuntime


def build_node(ctx: AppContext, *, workers: WorkerSettings | None = None) -> Node:
    """Register the packages' hooks and build each runtime once (before serving)."""
    weave_runtime.install_hooks()
    pulse = PulseRuntime.build(ctx, workers=workers)
    return Node(ctx=ctx, pulse=pulse, weave=WeaveRuntime.build(ctx, pulse))


def routes(node: Node) -> list[BaseRoute]:
    """The routes of every package, in mounting order (the platform's own ops, admin and
    result-event routes are added by ``build_app``)."""
    return [
        *subscriptions.routes(),  # subscriptions and deliveries (platform)
        *subscription_delete.routes(),  # subscription delete (platform)
        *audit.routes(),  # the audit list (platform)
        *retention.routes(),  # retention settings (platform)
        *pulse_http.routes(node.pulse),  # queues, tasks, workers, schedules
        *weave_http.routes(node.weave),  # workflows
        *ui.routes(),  # web console at /ui
    ]


def background_loops(node: Node) -> list[Loop]:
    """Every background loop of this node: the platform's, then Pulse's and Weave's."""
    ctx = node.ctx
    delivery = DeliveryLoop(ctx.db, hub=ctx.delivery_hub, metrics=ctx.metrics)
    return [
        IdempotencyCleanup(ctx).run,
        _metrics_refresh(ctx),
        retention_purge(ctx).run,
        delivery.run,
        *node.pulse.loops(),  # dispatcher, recovery, scheduler, watchdog
        *node.weave.loops(),  # workflow advancer and timers
    ]


def retention_purge(ctx: AppContext) -> RetentionPurge:
    """The retention purge: Pulse purges finished tasks (keeping those of running workflow
    instances) and holds events of unfinished ones; Weave keeps the events of running
    instances."""
    return RetentionPurge(
        ctx,
        parts=[TaskPurge(running_instance_tasks)],
        holders=[oldest_unfinished_task, oldest_running_instance],
    )


# =============================================================================================


def _metrics_refresh(ctx: AppContext) -> Loop:
    """The background refresh of /metrics' database-computed gauges (scrapes only read)."""

    async def refresh_metrics(stop: asyncio.Event) -> None:
        await ctx.metrics.run_refresh(stop, ctx.settings.metrics_refresh_s)

    return refresh_metrics


def lifespan(
    ctx: AppContext, loops: Sequence[Loop]
) -> Callable[[Starlette], AbstractAsyncContextManager[None]]:
    """Start the loops with the app; on shutdown set the stop event, wait, then cancel."""

    @contextlib.asynccontextmanager
    async def run(_app: Starlette) -> AsyncIterator[None]:
        stop = asyncio.Event()
        tasks = [
            asyncio.create_task(loop(stop), name=getattr(loop, "__qualname__", "loop"))
            for loop in loops
        ]
        try:
            yield
        finally:
            stop.set()
            if tasks:
                _done, pending = await asyncio.wait(tasks, timeout=STOP_GRACE_S)
                for t in pending:
                    t.cancel()
                await asyncio.gather(*tasks, return_exceptions=True)

    return run


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="orbit-server", description="Serve the Orbit HTTP/WSS API.")
    p.add_argument("--version", action="version", version=f"orbit-server {__version__}")
    p.add_argument("--host", default=os.environ.get("ORBIT_HOST", "127.0.0.1"),
                   help="bind address (default $ORBIT_HOST, else 127.0.0.1)")  # fmt: skip
    p.add_argument("--port", type=int, default=int(os.environ.get("ORBIT_PORT", "8080")),
                   help="TCP port (default $ORBIT_PORT, else 8080)")  # fmt: skip
    p.add_argument(
        "--dsn", default=None, help="mysql://USER[:PASS]@HOST[:PORT]/DB (default $ORBIT_DSN)"
    )
    p.add_argument(
        "--dev",
        action="store_true",
        help="start a private database if none answers, migrate, bootstrap",
    )
    p.add_argument(
        "--rotate-key", action="store_true",
        help="with --dev: replace the secret of the dev bootstrap key and print the new key "
        "(without it an existing key is kept working and printed as null)",
    )  # fmt: skip
    p.add_argument("--pool-size", type=int, default=int(os.environ.get("ORBIT_POOL_SIZE", "10")))
    p.add_argument(
        "--pool-timeout", type=float,
        default=float(os.environ.get("ORBIT_POOL_TIMEOUT_S", "5")),
        help="seconds a request waits for a pooled connection before 503 not_ready (default 5)",
    )  # fmt: skip
    p.add_argument(
        "--tenant-pool-share", type=float,
        default=float(os.environ.get("ORBIT_TENANT_POOL_SHARE", "0.8")),
        help="largest share of the pool one application may hold at once (default 0.8; pools "
        "under 4 connections are not capped)",
    )  # fmt: skip
    p.add_argument(
        "--db-driver", default=None,
        help="database driver: aiomysql (default) or asyncmy (optional, pip install asyncmy); "
        "default $ORBIT_DB_DRIVER",
    )  # fmt: skip
    p.add_argument(
        "--max-body-bytes", type=int, default=None, help="request body limit (default 1 MiB)"
    )
    p.add_argument(
        "--header-timeout", type=float,
        default=float(os.environ.get("ORBIT_HEADER_TIMEOUT_S", "10")),
        help="seconds a client may take to send a request head (slow-loris bound; default 10)",
    )  # fmt: skip
    p.add_argument(
        "--http", default=os.environ.get("ORBIT_HTTP_PARSER", "h11"),
        choices=("auto", "h11", "httptools"),
        help="HTTP parser: h11 (pure Python) or httptools (C; pip install httptools); auto "
        "takes httptools when installed (default $ORBIT_HTTP_PARSER, else h11: httptools "
        "measured no faster here, docs/performance.md)",
    )  # fmt: skip
    p.add_argument("--log-level", default=os.environ.get("ORBIT_LOG_LEVEL", "info"))
    p.add_argument(
        "--plain-logs", action="store_true", help="human-readable logs instead of JSON lines"
    )
    return p.parse_args(argv)


def _say(msg: str) -> None:
    print(f"orbit-server: {msg}", file=sys.stderr, flush=True)


async def _dev_setup(
    dsn: DSN, driver: str | None = None, *, rotate: bool = False
) -> tuple[DSN, DevDatabase | None]:
    """``--dev``: private database if needed, migrate, bootstrap; return (dsn, dev handle)."""
    dev = await ensure_dev_database(dsn)
    if dev is not None:
        dsn = dev.dsn
        _say(f"--dev: private database at {dsn} (data in {dev.data_dir})")
    result = await asyncio.to_thread(migrate.up, dsn)
    if result.applied:
        _say("--dev: applied " + ", ".join(result.applied))
    from orbit.bootstrap import bootstrap

    db = await Database.connect(dsn, maxsize=2, driver=driver)
    try:
        boot = await bootstrap(db, "demo", "default", global_admin=True, rotate=rotate)
    finally:
        await db.close()
    print(json.dumps(boot.to_json()), flush=True)
    if boot.hint is not None:
        _say(f"--dev: {boot.hint} (orbit-server --dev --rotate-key)")
    return dsn, dev


async def preflight(dsn: DSN) -> int:
    """EXIT_OK when the schema is current and clean, else print why and return the exit code."""
    try:
        st = await asyncio.to_thread(migrate.status, dsn)
    except pymysql.MySQLError as exc:
        _say(f"database unreachable at {dsn}: {exc}")
        return EXIT_UNAVAILABLE
    if not st.current:
        _say(f"refusing to start: the schema of {dsn.database!r} is not current")
        for problem in st.problems():
            _say(f"  - {problem}")
        _say("run `orbit-migrate status` for details, `orbit-migrate up` to migrate")
        return EXIT_NOT_CURRENT
    return EXIT_OK


async def serve(args: argparse.Namespace) -> int:
    try:
        dsn = DSN.from_env(args.dsn)
    except ValueError as exc:
        _say(f"bad DSN: {exc}")
        return EXIT_USAGE
    try:
        driver = load_driver(args.db_driver).name
    except (ValueError, RuntimeError) as exc:
        _say(f"bad --db-driver: {exc}")
        return EXIT_USAGE
    try:
        http = http_protocol(args.http, args.header_timeout)
    except ValueError as exc:
        _say(str(exc))
        return EXIT_USAGE
    dev = None
    try:
        if args.dev:
            try:
                dsn, dev = await _dev_setup(dsn, driver, rotate=args.rotate_key)
            except Exception as exc:
                _say(f"--dev setup failed: {exc}")
                return EXIT_NOT_CURRENT
        code = await preflight(dsn)
        if code != EXIT_OK:
            return code
        db = await Database.connect(
            dsn, maxsize=args.pool_size, acquire_timeout=args.pool_timeout or None, driver=driver,
            tenant_share=args.tenant_pool_share,
        )  # fmt: skip
        try:
            settings = Settings.from_env(max_body_bytes=args.max_body_bytes)
            ctx = AppContext(db=db, settings=settings)
            node = build_node(ctx)
            app = build_app(ctx, routes(node), lifespan=lifespan(ctx, background_loops(node)))
            config = uvicorn.Config(
                app, host=args.host, port=args.port, log_level=args.log_level.lower(),
                access_log=False, lifespan="on", log_config=None, http=http,
                ws=ClosingWebSocketProtocol,
            )  # fmt: skip
            server = uvicorn.Server(config)
            # uvicorn re-raises the signal that stopped it once it has shut down gracefully;
            # with this no-op handler restored underneath, SIGTERM ends with exit code 0.
            signal.signal(signal.SIGTERM, lambda *_: None)
            log.info(
                "serving on %s:%s (database %s, node %s, http %s, driver %s)",
                args.host,
                args.port,
                dsn.database,
                ctx.node_id,
                "h11" if issubclass(http, HeadDeadlineH11) else "httptools",
                driver,
            )
            await server.serve()
            return EXIT_OK if server.started else EXIT_UNAVAILABLE
        finally:
            await db.close()
    finally:
        if dev is not None:
            await dev.stop()


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    logs.configure(args.log_level, json=not args.plain_logs)
    try:
        return _run(serve(args))
    except KeyboardInterrupt:
        return EXIT_OK


def _run(main_coro: Coroutine[Any, Any, int]) -> int:
    """Run the server's event loop: uvloop when installed (``ORBIT_UVLOOP=0`` opts out),
    else asyncio's default loop."""
    if os.environ.get("ORBIT_UVLOOP", "1") != "0":
        try:
            import uvloop
        except ImportError:
            pass
        else:
            return int(uvloop.run(main_coro))
    return asyncio.run(main_coro)


if __name__ == "__main__":
    sys.exit(main())
