"""A real Orbit server for SDK tests, and helpers shared by the SDK client test modules.

``server`` is the composition root of ``orbit-server`` (``orbit_cmd.server``: every route
module and every background loop — dispatcher, recovery, scheduler, delivery pump, workflow
advancer and timers) served by uvicorn on a free port in the test's event loop, on the
session's migrated database, with short poll intervals. ``env`` gives each test a fresh
tenant and an :class:`~orbit_sdk.OrbitClient` for it. Import both fixtures into a test
module: ``from sdk_server import env_fixture, server_fixture  # noqa: F401``.
"""

from __future__ import annotations

import asyncio
import contextlib
import secrets
import socket
from collections.abc import AsyncIterator
from dataclasses import dataclass
from typing import Any

import httpx
import msgspec
import orbit_cmd.server as composition
import pytest
import uvicorn
from orbit_sdk import OrbitClient, TaskContext, Worker
from orbit_sdk.workflow import T, Workflow, input, output
from platform_fixtures import PTenant, new_tenant

from orbit.context import AppContext
from orbit.http.app import build_app
from orbit.storage import Database
from pulse.sessions import WorkerSettings
from weave.advancer import AdvancerSettings
from weave.timers import TimerSettings

#: A payload whose digits a float round trip would change.
RAW_PAYLOAD = b'{"n": 1.10, "big": 123456789012345678901}'


# ----------------------------------------------------------------------------- the server


@dataclass
class Server:
    url: str
    ctx: AppContext
    node: composition.Node


class _Uvicorn(uvicorn.Server):
    @contextlib.contextmanager
    def capture_signals(self) -> Any:  # the test process owns the signals
        yield


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@pytest.fixture(scope="module", name="server")
async def server_fixture(db: Database) -> AsyncIterator[Server]:
    """``orbit-server``'s app and loops (faster poll intervals) on a free port."""
    port = _free_port()
    ctx = AppContext(db=db, node_id=f"sdk-groups-{port}")
    node = composition.build_node(
        ctx, workers=WorkerSettings(dispatch_poll_ms=50, recovery_interval_ms=200)
    )
    node.weave.advancer.settings = AdvancerSettings(poll_s=0.05)
    node.weave.timers.settings = TimerSettings(poll_s=0.05)
    node.pulse.scheduler.interval_s = 0.2
    loops = composition.background_loops(node)
    app = build_app(ctx, composition.routes(node), lifespan=composition.lifespan(ctx, loops))
    config = uvicorn.Config(app, host="127.0.0.1", port=port, log_level="warning", lifespan="on")
    uv = _Uvicorn(config)
    serving = asyncio.create_task(uv.serve())
    try:
        async with asyncio.timeout(10):
            while not uv.started:  # noqa: ASYNC110 - uvicorn exposes only a flag
                await asyncio.sleep(0.01)
        yield Server(f"http://127.0.0.1:{port}", ctx, node)
    finally:
        uv.should_exit = True
        with contextlib.suppress(asyncio.CancelledError, TimeoutError):
            await asyncio.wait_for(serving, 20)


@dataclass
class Env:
    server: Server
    tenant: PTenant
    orbit: OrbitClient

    @property
    def ns(self) -> str:
        return self.tenant.namespace

    def http(self) -> httpx.AsyncClient:
        return httpx.AsyncClient(base_url=self.server.url, headers=self.tenant.auth, timeout=30)


@pytest.fixture(name="env")
async def env_fixture(server: Server, db: Database) -> AsyncIterator[Env]:
    tenant = await new_tenant(db)
    async with OrbitClient(server.url, tenant.key, namespace=tenant.namespace) as orbit:
        yield Env(server, tenant, orbit)


def unique(prefix: str) -> str:
    return f"{prefix}-{secrets.token_hex(4)}"


async def eventually(fn: Any, within: float = 15.0, interval: float = 0.05) -> Any:
    """Call ``fn()`` until it returns something truthy; return that."""
    async with asyncio.timeout(within):
        while True:
            got = await fn()
            if got:
                return got
            await asyncio.sleep(interval)


async def collect(agen: AsyncIterator[Any]) -> list[Any]:
    return [item async for item in agen]


def signal_workflow() -> Workflow:
    """input {order} → wait for ``shipped`` (correlated by order) → succeed with its payload."""
    wf = Workflow(input_schema=T.object(order=T.string, amount=T.number))
    wf.wait_signal("ship", signal="shipped", correlation_key=input("order"))
    wf.succeed("done", output={"shipment": output("ship")})
    return wf


async def finished_task_events(env: Env, queue: str) -> tuple[str, list[str]]:
    """One SUCCEEDED task (result ``RAW_PAYLOAD``, via a real SDK worker) and two
    CANCELLED ones on ``queue``; returns (succeeded id, cancelled ids)."""
    done = await env.orbit.tasks.submit(queue, "echo", msgspec.Raw(RAW_PAYLOAD))
    worker = Worker(env.server.url, env.tenant.key, namespace=env.ns)

    @worker.task(queue, "echo")
    async def echo(ctx: TaskContext, payload: Any) -> Any:
        return msgspec.Raw(bytes(ctx.payload_raw))

    await asyncio.wait_for(worker.run(max_tasks=1, install_signal_handlers=False), 30)
    assert (await env.orbit.tasks.wait(done.id, timeout=30)).state == "SUCCEEDED"
    cancelled = []
    for _ in range(2):
        t = await env.orbit.tasks.submit(queue, "later", {"x": 1}, delay_ms=3_600_000)
        cancelled.append((await env.orbit.tasks.cancel(t.id)).id)
    return done.id, cancelled
