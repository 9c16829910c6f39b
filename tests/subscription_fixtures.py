"""Helpers shared by the subscription and delivery tests.

* :func:`make_tenant` — a fresh application + namespace + all-actions key (via bootstrap).
* :func:`append_results` — write result events straight through ``orbit.events`` (the same
  function Pulse calls when a task finishes), so these tests do not depend on Pulse.
* :class:`LiveServer` — the subscription routes served by a real uvicorn on a free port in
  the test's event loop (same loop as the Database pool), with the delivery loop running.
"""

from __future__ import annotations

import asyncio
import contextlib
import secrets
import socket
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import uvicorn
from starlette.applications import Starlette

from orbit.audit import CLI_ACTOR
from orbit.bootstrap import bootstrap
from orbit.context import AppContext
from orbit.credentials import insert_credential
from orbit.delivery_loop import DeliveryLoop
from orbit.events import ResultSnapshot, append_result_events
from orbit.http import subscriptions as sub_routes
from orbit.http.app import build_app
from orbit.http.subscription_stream import StreamOptions
from orbit.ids import id_hex, new_id
from orbit.storage import Database, Tx


@dataclass
class SubTenant:
    application_id: bytes
    namespace: str
    namespace_id: bytes
    key: str

    @property
    def auth(self) -> dict[str, str]:
        return {"Authorization": f"Bearer {self.key}"}

    @property
    def owner_hex(self) -> str:
        return id_hex(self.application_id)


async def make_tenant(db: Database) -> SubTenant:
    res = await bootstrap(db, f"subs-{secrets.token_hex(5)}", "ns")
    return SubTenant(res.application_id, res.namespace, res.namespace_id, res.key)


async def make_key(db: Database, t: SubTenant, actions: Sequence[str]) -> str:
    """Another key of ``t``'s application, holding only ``actions`` on its namespace."""

    async def run(tx: Tx) -> str:
        _, key = await insert_credential(
            tx,
            CLI_ACTOR,
            t.application_id,
            name="limited",
            namespaces=[id_hex(t.namespace_id)],
            actions=list(actions),
        )
        return key

    return await db.transaction(run)


async def append_results(
    db: Database,
    namespace_id: bytes,
    n: int = 1,
    *,
    queue: str = "q",
    kind: str | None = "k",
    state: str = "SUCCEEDED",
    owner_id: bytes | None = None,
    task_ids: Sequence[bytes] | None = None,
    result: Any = None,
) -> list[int]:
    """Append ``n`` result events in one transaction; return their sequence numbers."""
    owner = owner_id or bytes(16)

    async def run(tx: Tx) -> list[int]:
        snaps = [
            ResultSnapshot(
                task_id=task_ids[i] if task_ids else new_id(),
                queue=queue,
                kind=kind,
                owner_id=owner,
                state=state,
                result=result if result is not None else {"i": i},
                attempts=1,
            )
            for i in range(n)
        ]
        return await append_result_events(tx, namespace_id, snaps)

    return await db.transaction(run)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def build_test_app(ctx: AppContext) -> Starlette:
    """The platform app (middleware, error handlers, /metrics ...) plus these routes."""
    return build_app(ctx, sub_routes.routes())


@dataclass
class LiveServer:
    """uvicorn + the delivery loop, in this event loop."""

    db: Database
    options: StreamOptions | None = None
    loop_interval_s: float = 0.05
    port: int = field(default_factory=free_port)
    ctx: AppContext = field(init=False)
    _server: uvicorn.Server | None = None
    _tasks: list[asyncio.Task[None]] = field(default_factory=list)
    _stop: asyncio.Event = field(default_factory=asyncio.Event)

    @property
    def base_url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    @property
    def ws_base(self) -> str:
        return f"ws://127.0.0.1:{self.port}"

    @property
    def streams(self) -> set[Any]:
        return self.ctx.streams.live  # type: ignore[return-value]

    async def start(self) -> LiveServer:
        self.ctx = AppContext(db=self.db)
        if self.options is not None:
            self.ctx.streams.options = self.options
        config = uvicorn.Config(
            build_test_app(self.ctx),
            host="127.0.0.1",
            port=self.port,
            log_level="warning",
            lifespan="off",
            ws_ping_interval=None,
        )
        self._server = uvicorn.Server(config)
        self._server.install_signal_handlers = lambda: None  # type: ignore[method-assign]
        self._tasks.append(asyncio.create_task(self._server.serve()))
        loop = DeliveryLoop(
            self.db,
            hub=self.ctx.delivery_hub,
            metrics=self.ctx.metrics,
            interval_s=self.loop_interval_s,
        )
        self._tasks.append(asyncio.create_task(loop.run(self._stop)))
        for _ in range(200):
            if self._server.started:
                return self
            await asyncio.sleep(0.01)
        raise RuntimeError("uvicorn did not start")

    async def stop(self) -> None:
        self._stop.set()
        if self._server is not None:
            self._server.should_exit = True
        for t in self._tasks:
            with contextlib.suppress(asyncio.TimeoutError, asyncio.CancelledError):
                await asyncio.wait_for(t, 10)
