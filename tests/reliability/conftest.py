"""Fixtures of the reliability suite (real ``orbit-server`` processes on the session database).

Figures measured by the tests (operations, faults injected, anomalies) are appended as JSON
lines to ``.orbit/reliability/figures.jsonl`` (``record_figures``) so reports/reliability.md
can be refreshed from a run.
"""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from reliability_support import ROOT, CliTenant, OrbitServer, cli_tenant, put_queue

from orbit.storage import DSN

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
