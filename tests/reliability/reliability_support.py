"""Helpers for the reliability suite: real ``orbit-server`` processes with captured logs,
tenants made through the real CLI, error-body and database-fingerprint checks, process RSS.

    from reliability_support import OrbitServer, cli_tenant, assert_error_body, fingerprint

Everything here talks to real processes and the real database (never mocks).
"""

from __future__ import annotations

import json
import os
import re
import secrets
import socket
import subprocess
import sys
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import pymysql

from orbit.storage import DSN

ROOT = Path(__file__).resolve().parents[2]

#: Error codes the API may answer with (API.md "Conventions" + docs/api/*).
ERROR_BODY_KEYS = {"code", "message", "details"}
_SNAKE = re.compile(r"[a-z][a-z0-9_]*")


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def process_env(**extra: str) -> dict[str, str]:
    """The environment of a child process that imports the source tree (server, SDK, cmd)."""
    env = dict(os.environ)
    paths = [str(ROOT), str(ROOT / "cmd"), str(ROOT / "sdk" / "python"), env.get("PYTHONPATH", "")]
    env["PYTHONPATH"] = os.pathsep.join(p for p in paths if p)
    env.update(extra)
    return env


def unique(prefix: str = "r") -> str:
    return f"{prefix}-{secrets.token_hex(5)}"


@dataclass
class OrbitServer:
    """A real ``orbit-server`` (``python -m orbit_cmd.server``) on a free port.

    stdout and stderr go to files (``log_path``) so a test can grep every line the server
    wrote; ``prefix`` runs it under a wrapper (e.g. ``["faketime", "-f", "+1h"]``).
    """

    dsn: DSN
    log_dir: Path
    extra_args: Sequence[str] = ()
    env: dict[str, str] = field(default_factory=dict)
    prefix: Sequence[str] = ()
    log_level: str = "info"
    port: int = 0
    proc: subprocess.Popen[bytes] | None = None

    def __post_init__(self) -> None:
        self.port = self.port or free_port()
        self.log_path = self.log_dir / f"orbit-server-{self.port}.log"

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    @property
    def ws_url(self) -> str:
        return f"ws://127.0.0.1:{self.port}"

    @property
    def pid(self) -> int:
        assert self.proc is not None
        return self.proc.pid

    def start(self, timeout: float = 30.0) -> OrbitServer:
        self.log_dir.mkdir(parents=True, exist_ok=True)
        out = open(self.log_path, "ab")  # noqa: SIM115 - owned by the child process
        cmd = [
            *self.prefix, sys.executable, "-m", "orbit_cmd.server",
            "--dsn", self.dsn.url(hide_password=False), "--port", str(self.port),
            "--log-level", self.log_level, *self.extra_args,
        ]  # fmt: skip
        self.proc = subprocess.Popen(
            cmd, env=process_env(**self.env), stdout=out, stderr=subprocess.STDOUT
        )
        out.close()
        self.wait_ready(timeout)
        return self

    def wait_ready(self, timeout: float = 30.0) -> None:
        assert self.proc is not None
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"orbit-server exited {self.proc.returncode}: {self.logs()}")
            try:
                if httpx.get(self.url + "/readyz", timeout=1.0).status_code == 200:
                    return
            except httpx.HTTPError:
                pass
            time.sleep(0.1)
        raise TimeoutError(f"orbit-server did not become ready: {self.logs()[-2000:]}")

    def alive(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def logs(self) -> str:
        try:
            return self.log_path.read_text(errors="replace")
        except FileNotFoundError:
            return ""

    def rss_kib(self) -> int:
        """Resident set size of the server process (from /proc), in KiB."""
        for line in Path(f"/proc/{self.pid}/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                return int(line.split()[1])
        raise RuntimeError("no VmRSS")

    def stop(self, sig_kill: bool = False) -> int | None:
        if self.proc is None:
            return None
        if self.proc.poll() is None:
            if sig_kill:
                self.proc.kill()
            else:
                self.proc.terminate()
            try:
                self.proc.wait(15)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(5)
        return self.proc.returncode


@dataclass
class CliTenant:
    """A tenant bootstrapped by ``orbit admin bootstrap`` (key with every action + admin)."""

    application_id: str
    application: str
    namespace: str
    credential_id: str
    key: str

    @property
    def auth(self) -> dict[str, str]:
        return {"Authorization": f"Bearer {self.key}"}


def cli_tenant(dsn: DSN, namespace: str = "default") -> CliTenant:
    """A fresh application + namespace + all-actions key, through the real CLI."""
    app = unique("rel")
    r = subprocess.run(
        [sys.executable, "-m", "orbit_cmd.cli", "admin", "bootstrap", "--application", app,
         "--namespace", namespace, "--dsn", dsn.url(hide_password=False)],
        env=process_env(), capture_output=True, text=True, timeout=60, check=False,
    )  # fmt: skip
    assert r.returncode == 0, r.stderr
    out = json.loads(r.stdout.splitlines()[-1])
    return CliTenant(out["application_id"], app, out["namespace"], out["credential_id"], out["key"])


def put_queue(base: str, t: CliTenant, queue: str, **config: Any) -> dict[str, Any]:
    r = httpx.put(f"{base}/v1/namespaces/{t.namespace}/queues/{queue}", json=config,
                  headers=t.auth, timeout=30)  # fmt: skip
    assert r.status_code in (200, 201), r.text
    return r.json()  # type: ignore[no-any-return]


# --- response checks --------------------------------------------------------------------------


def error_body_problem(status: int, body: bytes, content_type: str | None) -> str | None:
    """Why an error response is not ``{"error": {"code", "message", "details"}}``, or None."""
    if status < 400:
        return None
    if not content_type or "application/json" not in content_type:
        return f"content-type {content_type!r}"
    try:
        doc = json.loads(body)
    except ValueError:
        return "body is not JSON"
    if not isinstance(doc, dict) or set(doc) != {"error"}:
        return f"top-level keys {sorted(doc) if isinstance(doc, dict) else type(doc)}"
    err = doc["error"]
    if not isinstance(err, dict) or set(err) != ERROR_BODY_KEYS:
        return f"error keys {sorted(err) if isinstance(err, dict) else type(err)}"
    if not isinstance(err["code"], str) or not _SNAKE.fullmatch(err["code"]):
        return f"code {err['code']!r}"
    if not isinstance(err["message"], str) or not isinstance(err["details"], dict):
        return "message/details types"
    return None


def assert_error_body(r: httpx.Response) -> dict[str, Any]:
    problem = error_body_problem(r.status_code, r.content, r.headers.get("content-type"))
    assert problem is None, f"{r.request.method} {r.request.url} -> {r.status_code}: {problem}: {r.text[:300]}"
    return r.json()["error"]  # type: ignore[no-any-return]


# --- database --------------------------------------------------------------------------------


def connect(dsn: DSN) -> pymysql.connections.Connection:
    return pymysql.connect(autocommit=True, charset="utf8mb4", **dsn.connect_kwargs())


def query(dsn: DSN, sql: str, args: Any = None) -> list[tuple[Any, ...]]:
    conn = connect(dsn)
    try:
        with conn.cursor() as cur:
            cur.execute(sql, args)
            return list(cur.fetchall())
    finally:
        conn.close()


def orbit_tables(dsn: DSN) -> dict[str, bool]:
    """Every Orbit base table → whether it has a ``revision`` column."""
    rows = query(
        dsn,
        "SELECT t.TABLE_NAME, SUM(c.COLUMN_NAME = 'revision') FROM information_schema.TABLES t"
        " JOIN information_schema.COLUMNS c ON c.TABLE_SCHEMA = t.TABLE_SCHEMA"
        " AND c.TABLE_NAME = t.TABLE_NAME WHERE t.TABLE_SCHEMA = %s AND t.TABLE_TYPE = 'BASE TABLE'"
        " AND (t.TABLE_NAME LIKE 'orbit\\_%%' OR t.TABLE_NAME LIKE 'pulse\\_%%'"
        " OR t.TABLE_NAME LIKE 'weave\\_%%') GROUP BY t.TABLE_NAME",
        (dsn.database,),
    )
    return {str(name): bool(has_rev) for name, has_rev in rows}


class Fingerprint:
    """Row count and revision sum of every Orbit table, in one round trip.

    ``exclude`` drops tables that legitimately change on a rejected request (the audit log
    records denials and conflicts by design).
    """

    def __init__(self, dsn: DSN, exclude: Sequence[str] = ()) -> None:
        self.dsn = dsn
        tables = {t: rev for t, rev in orbit_tables(dsn).items() if t not in exclude}
        parts = [
            f"SELECT '{t}', COUNT(*), {'COALESCE(SUM(revision), 0)' if rev else '0'} FROM `{t}`"
            for t, rev in sorted(tables.items())
        ]
        self.sql = " UNION ALL ".join(parts)
        self.conn = connect(dsn)

    def take(self) -> dict[str, tuple[int, int]]:
        with self.conn.cursor() as cur:
            cur.execute(self.sql)
            return {str(t): (int(n), int(r)) for t, n, r in cur.fetchall()}

    def close(self) -> None:
        self.conn.close()


def diff(a: dict[str, tuple[int, int]], b: dict[str, tuple[int, int]]) -> dict[str, Any]:
    return {t: (a.get(t), b.get(t)) for t in set(a) | set(b) if a.get(t) != b.get(t)}


def kill_connections_of(dsn: DSN, user_like: str = "%", info_like: str = "%") -> int:
    """KILL CONNECTION every session of ``dsn.database`` whose running statement matches."""
    rows = query(
        dsn,
        "SELECT ID FROM information_schema.PROCESSLIST WHERE DB = %s AND USER LIKE %s"
        " AND COALESCE(INFO, '') LIKE %s AND ID <> CONNECTION_ID()",
        (dsn.database, user_like, info_like),
    )
    for (pid,) in rows:
        try:
            query(dsn, f"KILL CONNECTION {int(pid)}")
        except pymysql.MySQLError:
            pass
    return len(rows)
