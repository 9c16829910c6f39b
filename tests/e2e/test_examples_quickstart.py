"""docs/examples/quickstart runs against a real orbit-server: the worker (serving, then
``--until-idle``) and the producer (a new task, then the same one deduplicated)."""

from __future__ import annotations

import re
import signal
import subprocess
import sys

import httpx
import pytest
from cli_support import CliTenant, server_fixture
from platform_fixtures import ROOT

from orbit.storage import DSN

pytestmark = pytest.mark.process

EXAMPLE = ROOT / "docs" / "examples" / "quickstart"
server = server_fixture()


@pytest.fixture
def t(server, dsn: DSN) -> CliTenant:
    tenant = CliTenant.bootstrap(server, dsn)
    tenant.add_queue("hello")
    return tenant


def _env(t: CliTenant) -> dict[str, str]:
    return {**t.env, "ORBIT_NAMESPACE": t.namespace}


def _producer(t: CliTenant, name: str) -> tuple[list[str], str]:
    """Runs producer.py: (its first line's words, its second line)."""
    r = subprocess.run([sys.executable, str(EXAMPLE / "producer.py"), name], env=_env(t),
                       capture_output=True, text=True, timeout=90, check=False)  # fmt: skip
    assert r.returncode == 0, r.stderr[-3000:]
    first, second = r.stdout.splitlines()
    return first.split(), second


def test_the_worker_serves_and_the_producer_deduplicates(t: CliTenant) -> None:
    worker = subprocess.Popen([sys.executable, str(EXAMPLE / "worker.py")], env=_env(t),
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)  # fmt: skip
    try:
        (task_id, _, how), result = _producer(t, "Grace")
        assert how == "new"
        assert result == "SUCCEEDED {'greeting': 'Hello, Grace!'}"
        (again_id, state, how), result = _producer(t, "Grace")
        assert (again_id, state, how) == (task_id, "SUCCEEDED", "deduplicated")
        assert result == "SUCCEEDED {'greeting': 'Hello, Grace!'}"
    finally:
        worker.send_signal(signal.SIGTERM)  # drains, then stops
        _, log = worker.communicate(timeout=60)
    assert worker.returncode == 0, log[-3000:]
    # The worker says what it does (logging configured): its stream, the greeting, its stats.
    assert "worker stream open" in log
    assert "greeting Grace (attempt 1)" in log
    assert "worker stopped" in log


def test_the_worker_until_idle_runs_what_is_waiting(t: CliTenant) -> None:
    r = httpx.post(f"{t.server.url}/v1/namespaces/{t.namespace}/tasks",
                   headers={"Authorization": f"Bearer {t.key}", "Idempotency-Key": "first-task"},
                   json={"queue": "hello", "kind": "greet", "payload": {"name": "Ada"}}, timeout=10)  # fmt: skip
    assert r.status_code == 201, r.text
    task_id = r.json()["id"]
    worker = subprocess.run([sys.executable, str(EXAMPLE / "worker.py"), "--until-idle"],
                            env=_env(t), capture_output=True, text=True, timeout=90, check=False)  # fmt: skip
    assert worker.returncode == 0, worker.stderr[-3000:]
    assert "greeting Ada (attempt 1)" in worker.stderr
    done = httpx.get(f"{t.server.url}/v1/namespaces/{t.namespace}/tasks/{task_id}",
                     headers={"Authorization": f"Bearer {t.key}"}, timeout=10).json()  # fmt: skip
    assert done["state"] == "SUCCEEDED" and done["result"] == {"greeting": "Hello, Ada!"}


def test_the_quickstart_shows_the_files_as_they_are() -> None:
    page = (ROOT / "docs" / "quickstart.md").read_text()
    blocks = re.findall(r"```python\n(.*?)```", page, re.S)
    for name in ("worker.py", "producer.py"):
        source = (EXAMPLE / name).read_text()
        # Shown without the module docstring and the __future__ import.
        shown = re.sub(r'^""".*?"""\n\n', "", source, count=1, flags=re.S)
        shown = shown.replace("from __future__ import annotations\n\n", "")
        assert shown in blocks, f"docs/quickstart.md must show docs/examples/quickstart/{name} as it is"
