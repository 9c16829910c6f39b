"""Helpers for platform tests: tenants, extra keys, an in-process HTTP client, a server process.

    from platform_fixtures import new_tenant, add_key, asgi_client, unique

Every call makes fresh, uniquely named rows, so tests never depend on each other.
"""

from __future__ import annotations

import os
import secrets
import socket
import subprocess
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path

import httpx
from starlette.applications import Starlette
from starlette.routing import BaseRoute

from orbit.audit import CLI_ACTOR
from orbit.bootstrap import bootstrap
from orbit.context import AppContext
from orbit.credentials import insert_credential
from orbit.http.app import build_app
from orbit.ids import id_hex
from orbit.settings import Settings
from orbit.storage import DSN, Database, Tx

ROOT = Path(__file__).resolve().parent.parent


def unique(prefix: str = "t") -> str:
    """A fresh valid name."""
    return f"{prefix}-{secrets.token_hex(5)}"


@dataclass
class PTenant:
    """An application with one namespace and a bootstrap key (every action + admin)."""

    application_id: bytes
    application: str
    namespace_id: bytes
    namespace: str
    credential_id: bytes
    key: str

    @property
    def app_hex(self) -> str:
        return id_hex(self.application_id)

    @property
    def auth(self) -> dict[str, str]:
        return {"Authorization": f"Bearer {self.key}"}


async def new_tenant(
    db: Database, *, global_admin: bool = False, namespace: str = "default"
) -> PTenant:
    name = unique("app")
    r = await bootstrap(db, name, namespace, global_admin=global_admin)
    return PTenant(r.application_id, name, r.namespace_id, r.namespace, r.credential_id, r.key)


async def add_key(
    db: Database,
    tenant: PTenant,
    actions: Sequence[str],
    *,
    namespaces: Sequence[str] | None = None,
    queues: Sequence[str] | None = None,
    expires_at: datetime | None = None,
    global_admin: bool = False,
) -> tuple[bytes, str]:
    """A new credential of ``tenant`` (namespace *ids* hex or ``"*"``); (id, key)."""
    ns = list(namespaces) if namespaces is not None else [id_hex(tenant.namespace_id)]

    async def run(tx: Tx) -> tuple[bytes, str]:
        row, key = await insert_credential(
            tx, CLI_ACTOR, tenant.application_id, name=unique("key"), namespaces=ns,
            actions=list(actions), queues=queues, expires_at=expires_at, global_admin=global_admin,
        )  # fmt: skip
        return row.id, key

    return await db.transaction(run)


def bearer(key: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {key}"}


#: Routes, or what builds them from the app's context (a package's runtime needs it).
Routes = Sequence[BaseRoute] | Callable[[AppContext], Sequence[BaseRoute]]


def make_app(db: Database, extra_routes: Routes = (), **settings: object) -> Starlette:
    ctx = AppContext(db=db, settings=Settings(**settings))  # type: ignore[arg-type]
    routes = extra_routes(ctx) if callable(extra_routes) else extra_routes
    return build_app(ctx, routes)


def pulse_routes(ctx: AppContext) -> list[BaseRoute]:
    """Pulse's routes with a runtime built for ``ctx`` (as the composition root does)."""
    from pulse.http import routes
    from pulse.runtime import PulseRuntime

    return routes(PulseRuntime.build(ctx))


def pulse_weave_routes(ctx: AppContext) -> list[BaseRoute]:
    """Pulse's and Weave's routes with their runtimes built for ``ctx``."""
    import weave.http
    from pulse.http import routes
    from pulse.runtime import PulseRuntime
    from weave.runtime import WeaveRuntime

    rt = PulseRuntime.build(ctx)
    return [*routes(rt), *weave.http.routes(WeaveRuntime.build(ctx, rt))]


def asgi_client(app: Starlette) -> httpx.AsyncClient:
    return httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://orbit.test")


# --- real processes ---------------------------------------------------------------------------


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def process_env(**extra: str) -> dict[str, str]:
    env = dict(os.environ)
    paths = [str(ROOT), str(ROOT / "cmd"), env.get("PYTHONPATH", "")]
    env["PYTHONPATH"] = os.pathsep.join(p for p in paths if p)
    env.update(extra)
    return env


def run_cli(
    *args: str, env: dict[str, str] | None = None, timeout: float = 60
) -> subprocess.CompletedProcess[str]:
    """Run ``orbit ...`` (``python -m orbit_cmd.cli``) and capture its output."""
    return subprocess.run(
        [sys.executable, "-m", "orbit_cmd.cli", *args],
        env=env or process_env(), capture_output=True, text=True, timeout=timeout, check=False,
    )  # fmt: skip


class ServerProcess:
    """A real ``orbit-server`` process on a free port (``python -m orbit_cmd.server``)."""

    def __init__(
        self, dsn: DSN, *extra: str, port: int | None = None, env: dict[str, str] | None = None
    ) -> None:
        self.port = port or free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "orbit_cmd.server", "--dsn", dsn.url(hide_password=False),
             "--port", str(self.port), "--plain-logs", "--log-level", "warning", *extra],
            env=process_env(**(env or {})), stdout=subprocess.PIPE, stderr=subprocess.PIPE,
            text=True,
        )  # fmt: skip

    def wait_ready(self, timeout: float = 30.0) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                out, err = self.proc.communicate()
                raise RuntimeError(f"orbit-server exited {self.proc.returncode}: {err}{out}")
            try:
                if httpx.get(self.url + "/readyz", timeout=1.0).status_code == 200:
                    return
            except httpx.HTTPError:
                pass
            time.sleep(0.1)
        raise TimeoutError("orbit-server did not become ready")

    def stop(self) -> int:
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(15)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(5)
        if self.proc.stdout:
            self.proc.stdout.close()
        if self.proc.stderr:
            self.proc.stderr.close()
        return self.proc.returncode


def raw_query(dsn: DSN, sql: str, args: object = None) -> list[tuple[object, ...]]:
    """Run SQL on a separate autocommit connection (test assertions; not in the SQL guard)."""
    import pymysql

    conn = pymysql.connect(autocommit=True, charset="utf8mb4", **dsn.connect_kwargs())
    try:
        with conn.cursor() as cur:
            cur.execute(sql, args)
            return list(cur.fetchall())
    finally:
        conn.close()
