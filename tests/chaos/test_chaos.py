"""The bounded chaos run of CI (tests/chaos/chaos.py): 3 server nodes, 3 SDK worker
processes, a producer, ~40 s of faults (SIGKILL of workers and nodes, KILL CONNECTION),
then the history checks of the module docstring there — zero anomalies expected.
``ORBIT_CHAOS_SECONDS`` lengthens the fault phase; by hand: ``python tests/chaos/chaos.py
--minutes 20``."""

from __future__ import annotations

import os
import sys
from pathlib import Path

import pytest
from conftest import create_database, drop_database

from orbit import migrate

sys.path.insert(0, str(Path(__file__).resolve().parent))
from chaos import run_chaos

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "reliability"))
from reliability_support import record_figures

pytestmark = [pytest.mark.process, pytest.mark.timeout(300)]


def test_bounded_chaos_run_has_no_anomalies(tmp_path: Path) -> None:
    dsn = create_database("orbit_chaos")
    try:
        migrate.up(dsn)
        res = run_chaos(dsn, tmp_path, seconds=float(os.environ.get("ORBIT_CHAOS_SECONDS", "40")),
                        seed=int(os.environ.get("ORBIT_CHAOS_SEED", "0")) or None)  # fmt: skip
    finally:
        drop_database(dsn)
    record_figures("chaos_bounded", **res.to_json())
    assert res.tasks >= 50 and res.submits >= 50
    assert res.faults["sigkill_worker"] + res.faults["sigkill_node"] + res.faults["kill_db_connection"] >= 5
    assert res.states["SUCCEEDED"] > 0
    assert not res.anomalies, "\n".join(res.anomalies[:40])
