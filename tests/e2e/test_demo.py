"""The README's first command end to end: server (--dev), worker processes, tasks, results."""

from __future__ import annotations

import json
import os
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
            # Not a terminal (as in CI): the demo exits after the summary instead of serving.
            stdin=subprocess.DEVNULL, capture_output=True, timeout=150, check=False,
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


def test_demo_serves_by_default_only_on_a_terminal(monkeypatch: pytest.MonkeyPatch) -> None:
    from orbit_cmd.demo import _wants_serve, parse_args

    leader, follower = os.openpty()
    with os.fdopen(follower, "r") as tty, open(os.devnull) as devnull:
        monkeypatch.setattr(sys, "stdin", tty)
        assert _wants_serve(parse_args([])) is True  # scripts/demo from a terminal
        assert _wants_serve(parse_args(["--exit"])) is False
        monkeypatch.setattr(sys, "stdin", devnull)
        assert _wants_serve(parse_args([])) is False  # CI, tests, pipes
        assert _wants_serve(parse_args(["--serve"])) is True
    os.close(leader)
    with pytest.raises(SystemExit):
        parse_args(["--serve", "--exit"])
