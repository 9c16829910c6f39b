"""Support for the ``orbit`` CLI tests (tests/e2e/test_cli_*.py): a real ``orbit-server``
process, tenants bootstrapped with ``orbit admin bootstrap``, the CLI run as a subprocess,
and a minimal worker over the HTTP fallback (to finish tasks or lose their lease).

    server = module-scoped fixture from ``server_fixture()``
    t = CliTenant.bootstrap(server, dsn)          # fresh application + namespace + key
    r = t.orbit("tasks", "list", "--json")        # CompletedProcess; r.json() helpers below
"""

from __future__ import annotations

import json
import os
import pty
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import httpx
import pytest
from platform_fixtures import ROOT, ServerProcess, process_env, run_cli, unique

from orbit.storage import DSN


def server_fixture(**env: str) -> Any:
    """A module-scoped fixture running one ``orbit-server`` for the module's tests."""

    @pytest.fixture(scope="module")
    def server(dsn: DSN) -> Iterator[ServerProcess]:
        old = {k: os.environ.get(k) for k in env}
        os.environ.update(env)
        try:
            s = ServerProcess(dsn)
        finally:
            for k, v in old.items():
                if v is None:
                    os.environ.pop(k, None)
                else:
                    os.environ[k] = v
        try:
            s.wait_ready(timeout=60)
            yield s
        finally:
            assert s.stop() == 0, "orbit-server did not shut down cleanly"

    return server


def loads(r: subprocess.CompletedProcess[str]) -> Any:
    """The single JSON document a ``--json`` command printed (fails with its stderr)."""
    assert r.returncode == 0, f"exit {r.returncode}: {r.stderr}"
    lines = [line for line in r.stdout.splitlines() if line.strip()]
    assert len(lines) == 1, r.stdout
    return json.loads(lines[0])


@dataclass
class CliTenant:
    """An application with namespace ``default`` and its bootstrap key (every action)."""

    server: ServerProcess
    application_id: str
    namespace: str
    key: str

    @classmethod
    def bootstrap(cls, server: ServerProcess, dsn: DSN, namespace: str = "default") -> CliTenant:
        r = run_cli(
            "admin", "bootstrap", "--application", unique("cli"), "--namespace", namespace,
            "--dsn", dsn.url(hide_password=False),
        )  # fmt: skip
        assert r.returncode == 0, r.stderr
        out = json.loads(r.stdout)
        return cls(server, out["application_id"], out["namespace"], out["key"])

    @property
    def env(self) -> dict[str, str]:
        env = process_env(ORBIT_URL=self.server.url, ORBIT_KEY=self.key)
        env.pop("ORBIT_NAMESPACE", None)
        return env

    def orbit(
        self, *args: str, key: str | None = None, input: str | None = None, timeout: float = 60
    ) -> subprocess.CompletedProcess[str]:
        """Run ``orbit ARGS`` with this tenant's URL and key (or ``key``)."""
        env = self.env if key is None else {**self.env, "ORBIT_KEY": key}
        return subprocess.run(
            [sys.executable, "-m", "orbit_cmd.cli", *args],
            env=env, capture_output=True, text=True, timeout=timeout, check=False, input=input,
        )  # fmt: skip

    def popen(self, *args: str) -> subprocess.Popen[str]:
        # SIGINT back to its default in the child, as under a terminal: a test run started in
        # the background by a shell without job control ignores SIGINT, and a child inherits
        # that (Python then never raises KeyboardInterrupt: a tail would not stop on Ctrl-C).
        return subprocess.Popen(
            [sys.executable, "-m", "orbit_cmd.cli", *args],
            env=self.env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
            preexec_fn=_default_sigint,
        )  # fmt: skip

    def orbit_on_tty(self, *args: str, timeout: float = 60) -> tuple[int, str, str]:
        """Run ``orbit ARGS`` with stderr on a pseudo-terminal: (exit code, stdout, stderr)."""
        master, slave = pty.openpty()
        try:
            proc = subprocess.Popen(
                [sys.executable, "-m", "orbit_cmd.cli", *args],
                env=self.env, stdout=subprocess.PIPE, stderr=slave, text=True,
            )  # fmt: skip
            os.close(slave)
            chunks: list[bytes] = []
            deadline = time.monotonic() + timeout
            while time.monotonic() < deadline:
                try:
                    data = os.read(master, 4096)
                except OSError:  # EIO: the child closed the terminal
                    break
                if not data:
                    break
                chunks.append(data)
            out, _ = proc.communicate(timeout=max(1.0, deadline - time.monotonic()))
            return proc.returncode, out, b"".join(chunks).decode(errors="replace")
        finally:
            os.close(master)

    # -- direct HTTP (test setup and worker simulation) ---------------------------------------

    @property
    def auth(self) -> dict[str, str]:
        return {"Authorization": f"Bearer {self.key}"}

    def api(self, method: str, path: str, **kw: Any) -> httpx.Response:
        url = f"{self.server.url}/v1/namespaces/{self.namespace}{path}"
        return httpx.request(method, url, headers=self.auth, timeout=30, **kw)

    def add_queue(self, name: str, **config: Any) -> None:
        assert self.api("PUT", f"/queues/{name}", json=config).status_code in (200, 201)

    def submit(self, queue: str, kind: str = "k", **fields: Any) -> dict[str, Any]:
        r = self.api("POST", "/tasks", json={"queue": queue, "kind": kind, **fields})
        assert r.status_code == 201, r.text
        return dict(r.json())


class HttpWorker:
    """A worker over the HTTP fallback: a session, polls, starts, completes or walks away."""

    def __init__(self, t: CliTenant, queues: list[str]) -> None:
        self.t = t
        r = t.api(
            "POST", "/workers/sessions",
            json={"instance": {"host": "cli-test", "pid": os.getpid(), "sdk": "test"},
                  "queues": queues, "max_concurrency": 100},
        )  # fmt: skip
        assert r.status_code == 201, r.text
        body = r.json()
        self.sid = body["session_id"]
        self.headers = {"Authorization": f"Bearer {body['session_token']}"}

    def _post(self, path: str, **kw: Any) -> httpx.Response:
        url = f"{self.t.server.url}/v1/namespaces/{self.t.namespace}{path}"
        headers = {**self.headers, **kw.pop("headers", {})}
        return httpx.post(url, headers=headers, timeout=60, **kw)

    def start(self, count: int) -> list[dict[str, Any]]:
        """Poll until ``count`` offers were started; the started frames with task ids."""
        started: list[dict[str, Any]] = []
        deadline = time.monotonic() + 30
        while len(started) < count and time.monotonic() < deadline:
            offers = self._post(f"/workers/sessions/{self.sid}/poll?wait_ms=2000").json()["offers"]
            for offer in offers:
                r = self._post(f"/attempts/{offer['attempt_id']}/start")
                assert r.status_code == 200 and r.json()["type"] == "started", r.text
                started.append({**r.json(), "attempt_id": offer["attempt_id"],
                                "task_id": offer["task"]["id"]})  # fmt: skip
        assert len(started) == count
        return started

    def complete(self, started: dict[str, Any], result: str) -> None:
        """Report success with ``result``, a JSON text sent as it is."""
        token = json.dumps(started["execution_token"])
        r = self._post(
            f"/attempts/{started['attempt_id']}/complete",
            content=f'{{"execution_token": {token}, "result": {result}}}',
            headers={"Content-Type": "application/json"},
        )
        assert r.status_code == 200, r.text


__all__ = ["ROOT", "CliTenant", "HttpWorker", "loads", "server_fixture"]


def _default_sigint() -> None:
    signal.signal(signal.SIGINT, signal.SIG_DFL)
