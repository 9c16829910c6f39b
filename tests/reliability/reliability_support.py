"""Helpers for the reliability suite: real ``orbit-server`` processes with captured logs,
tenants made through the real CLI, error-body and database-fingerprint checks, process RSS.

    from reliability_support import OrbitServer, cli_tenant, assert_error_body, Fingerprint

Everything here talks to real processes and the real database (never mocks).

Fixtures live here too (no conftest.py in this folder: a second ``conftest`` module would
shadow tests/conftest.py for tests that ``import conftest`` lazily). A test module takes
them with a redundant alias, e.g. ``from reliability_support import server as server``.
Figures measured by the tests (operations, faults injected, anomalies) are appended as JSON
lines to ``.orbit/reliability/figures.jsonl`` (:func:`record_figures`) so
reports/reliability.md can be refreshed from a run.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import secrets
import socket
import subprocess
import sys
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import pymysql
import pytest

from orbit.storage import DSN

ROOT = Path(__file__).resolve().parents[2]

#: Error codes the API may answer with (docs/api/conventions.md#errors + docs/api/*).
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
    #: Working directory of the process (``python -m`` puts it first on ``sys.path``).
    cwd: Path | None = None

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
            cmd, env=process_env(**self.env), stdout=out, stderr=subprocess.STDOUT, cwd=self.cwd
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


def cli_tenant(dsn: DSN, namespace: str = "default", env: dict[str, str] | None = None,
               cwd: Path | None = None) -> CliTenant:  # fmt: skip
    """A fresh application + namespace + all-actions key, through the real CLI (``env``,
    ``cwd``: of the CLI process, e.g. another source tree's ``PYTHONPATH`` and folder)."""
    app = unique("rel")
    r = subprocess.run(
        [sys.executable, "-m", "orbit_cmd.cli", "admin", "bootstrap", "--application", app,
         "--namespace", namespace, "--dsn", dsn.url(hide_password=False)],
        env=process_env(**(env or {})), capture_output=True, text=True, timeout=60, check=False, cwd=cwd,
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
    return {t: "revision" in cols for t, cols in orbit_table_columns(dsn).items()}


def orbit_table_columns(dsn: DSN) -> dict[str, set[str]]:
    """Every Orbit base table → its column names."""
    rows = query(
        dsn,
        "SELECT c.TABLE_NAME, c.COLUMN_NAME FROM information_schema.COLUMNS c"
        " JOIN information_schema.TABLES t ON t.TABLE_SCHEMA = c.TABLE_SCHEMA"
        " AND t.TABLE_NAME = c.TABLE_NAME WHERE c.TABLE_SCHEMA = %s AND t.TABLE_TYPE = 'BASE TABLE'"
        " AND (c.TABLE_NAME LIKE 'orbit\\_%%' OR c.TABLE_NAME LIKE 'pulse\\_%%'"
        " OR c.TABLE_NAME LIKE 'weave\\_%%')",
        (dsn.database,),
    )
    out: dict[str, set[str]] = {}
    for table, column in rows:
        out.setdefault(str(table), set()).add(str(column))
    return out


class Fingerprint:
    """Row count and revision sum of every Orbit table, in one round trip (one SELECT per
    table in a multi-statement query: no UNION temp table).

    ``application_id`` (hex) scopes it to one tenant: rows of tables with a
    ``namespace_id`` column count only in that application's namespaces, rows of tables
    with an ``application_id`` column only for it; other tables count whole. Background
    work of *other* tenants (recovery expiring their sessions, ...) then cannot look like a
    change. ``exclude`` drops tables that legitimately change on a rejected request (the
    audit log records denials and conflicts by design).
    """

    def __init__(self, dsn: DSN, exclude: Sequence[str] = (), application_id: str | None = None) -> None:
        from pymysql.constants import CLIENT

        self.dsn = dsn
        parts = []
        for t, cols in sorted(orbit_table_columns(dsn).items()):
            if t in exclude:
                continue
            rev = "COALESCE(SUM(revision), 0)" if "revision" in cols else "0"
            where = ""
            if application_id is not None and "namespace_id" in cols:
                where = (" WHERE namespace_id IN (SELECT id FROM orbit_namespaces"
                         f" WHERE application_id = UNHEX('{application_id}'))")  # fmt: skip
            elif application_id is not None and "application_id" in cols:
                where = f" WHERE application_id = UNHEX('{application_id}')"
            parts.append(f"SELECT '{t}', COUNT(*), {rev} FROM `{t}`{where}")
        self.sql = ";\n".join(parts)
        self.conn = pymysql.connect(autocommit=True, charset="utf8mb4",
                                    client_flag=CLIENT.MULTI_STATEMENTS, **dsn.connect_kwargs())  # fmt: skip

    def take_quiet(self, settle_s: float = 0.25, limit_s: float = 5.0) -> dict[str, tuple[int, int]]:
        """A reading taken once the tenant's background work (delivery pump, scheduler,
        dispatcher, recovery) has stopped changing rows: two readings ``settle_s`` apart
        agree. Used to re-judge a rejected request whose reading moved: background work
        caused by an earlier, accepted request must not look like the rejection's write."""
        deadline = time.monotonic() + limit_s
        last = self.take()
        while time.monotonic() < deadline:
            time.sleep(settle_s)
            now = self.take()
            if now == last:
                return now
            last = now
        return last

    def take(self) -> dict[str, tuple[int, int]]:
        out: dict[str, tuple[int, int]] = {}
        with self.conn.cursor() as cur:
            cur.execute(self.sql)
            while True:
                for t, n, r in cur.fetchall():
                    out[str(t)] = (int(n), int(r))
                if not cur.nextset():
                    break
        return out

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
        with contextlib.suppress(pymysql.MySQLError):
            query(dsn, f"KILL CONNECTION {int(pid)}")
    return len(rows)


# --- worker protocol (sync clients) -----------------------------------------------------------


@dataclass
class Session:
    """A worker session made over HTTP (``POST .../workers/sessions``)."""

    namespace: str
    session_id: str
    token: str

    def stream_path(self) -> str:
        return f"/v1/namespaces/{self.namespace}/workers/sessions/{self.session_id}/stream"


def open_session(base: str, t: CliTenant, queues: Sequence[str], max_concurrency: int = 4) -> Session:
    body = {"instance": {"host": "reliability", "pid": os.getpid(), "sdk": "tests"},
            "queues": list(queues), "max_concurrency": max_concurrency}  # fmt: skip
    r = httpx.post(f"{base}/v1/namespaces/{t.namespace}/workers/sessions", json=body,
                   headers=t.auth, timeout=30)  # fmt: skip
    assert r.status_code == 201, r.text
    j = r.json()
    return Session(t.namespace, j["session_id"], j["session_token"])


def ws_connect(server: OrbitServer, s: Session, **kw: Any) -> Any:
    """A sync ``websockets`` client on the session's stream."""
    from websockets.sync.client import connect as ws_sync_connect

    return ws_sync_connect(
        server.ws_url + s.stream_path(),
        additional_headers={"Authorization": f"Bearer {s.token}"},
        open_timeout=10, max_size=None, legacy=True, **kw,
    )  # fmt: skip


def recv_json(ws: Any, want: str | None = None, timeout: float = 10.0) -> dict[str, Any]:
    """The next JSON frame (of type ``want``, skipping others) within ``timeout`` seconds."""
    end = time.monotonic() + timeout
    while True:
        left = end - time.monotonic()
        if left <= 0:
            raise TimeoutError(f"no {want or 'frame'} within {timeout}s")
        frame = json.loads(ws.recv(timeout=left))
        if want is None or frame.get("type") == want:
            return frame  # type: ignore[no-any-return]


def submit(base: str, t: CliTenant, queue: str = "default", **fields: Any) -> dict[str, Any]:
    body = {"queue": queue, "kind": "k", "payload": {"n": 1}, **fields}
    r = httpx.post(f"{base}/v1/namespaces/{t.namespace}/tasks", json=body, headers=t.auth,
                   timeout=30)  # fmt: skip
    assert r.status_code in (200, 201), r.text
    return r.json()  # type: ignore[no-any-return]


def get_task(base: str, t: CliTenant, task_id: str) -> dict[str, Any]:
    r = httpx.get(f"{base}/v1/namespaces/{t.namespace}/tasks/{task_id}", headers=t.auth, timeout=30)
    assert r.status_code == 200, r.text
    return r.json()  # type: ignore[no-any-return]


def run_task_over_ws(server: OrbitServer, t: CliTenant, queue: str = "default",
                     result: Any = None, within: float = 15.0) -> dict[str, Any]:  # fmt: skip
    """Submit one task, take it on a fresh session's stream, start and complete it; return
    the final task (asserts the whole happy path)."""
    s = open_session(server.url, t, [queue])
    task = submit(server.url, t, queue)
    with ws_connect(server, s) as ws:
        offer = recv_json(ws, "offer", within)
        while offer["task"]["id"] != task["id"]:
            offer = recv_json(ws, "offer", within)
        ws.send(json.dumps({"type": "start", "msg_id": "s1", "attempt_id": offer["attempt_id"]}))
        started = recv_json(ws, "started", within)
        ws.send(json.dumps({"type": "complete", "msg_id": "c1", "attempt_id": offer["attempt_id"],
                            "execution_token": started["execution_token"],
                            "result": result if result is not None else {"ok": True}}))  # fmt: skip
        receipt = recv_json(ws, "receipt", within)
        assert receipt["outcome"] == "applied" and receipt["task_state"] == "SUCCEEDED"
    final = get_task(server.url, t, task["id"])
    assert final["state"] == "SUCCEEDED"
    return final


# --- fixtures and figures -----------------------------------------------------------------------

FIGURES = ROOT / ".orbit" / "reliability" / "figures.jsonl"


def record_figures(name: str, **figures: Any) -> None:
    """Append one JSON line of measured figures for reports/reliability.md."""
    FIGURES.parent.mkdir(parents=True, exist_ok=True)
    with FIGURES.open("a") as f:
        f.write(json.dumps({"scenario": name, "at": time.time(), **figures}) + "\n")


@pytest.fixture(scope="module")
def log_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("orbit-logs")


@pytest.fixture(scope="module")
def server(dsn: DSN, log_dir: Path) -> Iterator[OrbitServer]:
    """One real orbit-server for a test module. Worker sessions live 10 minutes without a
    heartbeat so nothing expires in the background while a test compares database states."""
    s = OrbitServer(dsn, log_dir, env={"ORBIT_PULSE_SESSION_LEASE_MS": "600000"})
    s.start()
    try:
        yield s
    finally:
        code = s.stop()
        assert code == 0, f"orbit-server exited {code}: {s.logs()[-3000:]}"


@pytest.fixture(scope="module")
def fuzz_tenant(server: OrbitServer, dsn: DSN) -> CliTenant:
    """A tenant with a ``default`` queue, made through the CLI and the HTTP API."""
    t = cli_tenant(dsn)
    put_queue(server.url, t, "default")
    return t
