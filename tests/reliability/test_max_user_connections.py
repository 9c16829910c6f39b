"""``max_user_connections`` exhaustion (as opposed to pool exhaustion, test_scenarios_processes.py).

The runtime account (``orbit-migrate grants --apply``) gets ``MAX_USER_CONNECTIONS 8``; an
``orbit-server`` runs with it. Then connections opened *from outside* as the same account take
every slot the account has, and the server's own connections are killed (``KILL CONNECTION``),
so the server must open new ones — which MariaDB refuses (1226 ``max_user_connections``, or
1203 for the global variable). Expected: requests that need the database answer fast
``503 not_ready`` with ``Retry-After`` (not a hang, not a 500); ``/healthz`` stays 200; once
the outside connections close, the same server answers 200 again without a restart.
"""

from __future__ import annotations

import contextlib
import secrets
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path
from typing import Any

import httpx
import pymysql
import pytest
from reliability_support import (
    OrbitServer,
    cli_tenant,
    process_env,
    put_queue,
    query,
    record_figures,
    submit,
)
from reliability_support import log_dir as log_dir

from orbit.storage import DSN

pytestmark = [pytest.mark.process, pytest.mark.timeout(120)]

LIMIT = 8
REFUSED = (1226, 1203, 1040)  # per-account limit, global max_user_connections, max_connections


@pytest.fixture
def limited_account(dsn: DSN, server_dsn: DSN) -> Iterator[DSN]:
    user = f"orbit_muc_{secrets.token_hex(4)}"
    password = secrets.token_urlsafe(16)
    r = subprocess.run(
        [sys.executable, "-m", "orbit_cmd.migrate", "--dsn", dsn.url(hide_password=False),
         "grants", "--user", user, "--host", "%", "--apply", f"--password={password}"],
        env=process_env(), capture_output=True, text=True, timeout=60, check=False,
    )  # fmt: skip
    assert r.returncode == 0, r.stderr
    query(
        server_dsn.with_database("mysql"),
        f"ALTER USER '{user}'@'%' WITH MAX_USER_CONNECTIONS {LIMIT}",
    )
    try:
        yield replace(dsn, user=user, password=password)
    finally:
        query(server_dsn.with_database("mysql"), f"DROP USER IF EXISTS '{user}'@'%'")


def _server_connection_ids(root: DSN, user: str, mine: set[int]) -> list[int]:
    rows = query(root, "SELECT ID FROM information_schema.PROCESSLIST WHERE USER = %s", (user,))
    return [int(r[0]) for r in rows if int(r[0]) not in mine]


def _exhaust(account: DSN, root: DSN) -> tuple[list[pymysql.connections.Connection], int]:
    """Open connections as ``account`` until refused, killing the server's own ones, until
    the outside holds every slot. Returns the connections and the refusal code seen."""
    held: list[pymysql.connections.Connection] = []
    code = 0
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        for victim in _server_connection_ids(root, account.user, {c.thread_id() for c in held}):
            with contextlib.suppress(pymysql.MySQLError):  # already gone
                query(root, f"KILL CONNECTION {victim}")
        while len(held) < LIMIT + 2:
            try:
                held.append(
                    pymysql.connect(autocommit=True, connect_timeout=5, **account.connect_kwargs())
                )
            except pymysql.MySQLError as exc:
                code = int(exc.args[0])
                assert code in REFUSED, exc
                break
        if len(held) >= LIMIT and not _server_connection_ids(
            root, account.user, {c.thread_id() for c in held}
        ):
            return held, code
        time.sleep(0.1)
    raise AssertionError(f"could not take every slot from outside (held {len(held)})")


def test_max_user_connections_exhausted_answers_503_fast_and_recovers(
    limited_account: DSN, dsn: DSN, log_dir: Path
) -> None:
    """See the module docstring."""
    server = OrbitServer(
        limited_account, log_dir, extra_args=["--pool-size", "4", "--pool-timeout", "2"]
    )
    server.start()
    try:
        t = cli_tenant(dsn)
        put_queue(server.url, t, "default")
        task = submit(server.url, t)
        path = f"{server.url}/v1/namespaces/{t.namespace}/tasks/{task['id']}"
        assert httpx.get(path, headers=t.auth, timeout=10).status_code == 200
        held, code = _exhaust(limited_account, dsn)
        shed: list[dict[str, Any]] = []
        try:
            for url in (path, f"{server.url}/v1/namespaces/{t.namespace}/queues", path):
                t0 = time.monotonic()
                r = httpx.get(url, headers=t.auth, timeout=30)
                shed.append({"status": r.status_code, "seconds": round(time.monotonic() - t0, 2),
                             "retry_after": r.headers.get("retry-after"),
                             "body": r.json() if r.headers.get("content-type", "").startswith("application/json") else r.text})  # fmt: skip
            health = httpx.get(server.url + "/healthz", timeout=10).status_code
        finally:
            for c in held:
                c.close()
        t0 = time.monotonic()
        after = 0
        while time.monotonic() - t0 < 20:
            after = httpx.get(path, headers=t.auth, timeout=10).status_code
            if after == 200:
                break
            time.sleep(0.2)
        recovered_s = round(time.monotonic() - t0, 2)
        record_figures("max_user_connections", limit=LIMIT, refusal_code=code, held=len(held),
                       shed=[{k: v for k, v in s.items() if k != "body"} for s in shed],
                       recovered_s=recovered_s)  # fmt: skip
        for s in shed:
            assert s["status"] == 503 and s["seconds"] < 5.0 and s["retry_after"], s
            assert s["body"]["error"]["code"] == "not_ready", s
        assert health == 200
        assert after == 200, f"not recovered after {recovered_s}s"
        assert server.alive()
    finally:
        server.stop()
