"""The README's first command end to end: server (--dev), worker processes, tasks, results."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest
from conftest import create_database, drop_database

pytestmark = pytest.mark.process


def test_demo_runs_tasks_through_real_workers_and_delivers_results() -> None:
    dsn = create_database("orbit_test_demo")
    try:
        proc = subprocess.run(
            [sys.executable, "-m", "orbit_cmd.demo", "--tasks", "120", "--workers", "1",
             "--timeout", "90", "--dsn", dsn.url(hide_password=False)],
            capture_output=True, timeout=150, check=False,
        )
        out = proc.stdout.decode()
        assert proc.returncode == 0, proc.stderr.decode()[-3000:]
        summary = json.loads(out.strip().splitlines()[-1])
        # n % 97 == 13 fails permanently (n = 13, 110); n % 10 == 3 fails once, then succeeds.
        assert summary["finished"] == 120
        assert summary["failed"] == 2 and summary["succeeded"] == 118
        assert summary["retried"] >= 10
    finally:
        drop_database(dsn)
