"""The bounded chaos run of CI (tests/chaos/chaos.py): 3 server nodes on a **private**
MariaDB (orbit_cmd.devdb, its own folder/port/socket — never the shared server), 3 SDK worker
processes, a producer, a workflow driver, an inbox subscriber and a never-acking one, an
``every_ms`` schedule; 30 s of faults, longer until each kind happened once (SIGKILL of workers,
nodes and the subscriber, KILL CONNECTION, SIGSTOP/SIGCONT of a worker past its lease, a
database restart); then the history checker (tests/chaos/history.py) — zero anomalies
expected. ``ORBIT_CHAOS_SECONDS`` lengthens the fault phase; by hand:
``python tests/chaos/chaos.py --minutes 20``. Without a MariaDB server binary to start a
private instance the run falls back to the shared server, without the database restart."""

from __future__ import annotations

import os
import sys
from pathlib import Path

import pytest
from conftest import create_database, drop_database

from orbit import migrate

sys.path.insert(0, str(Path(__file__).resolve().parent))
from chaos import ChaosResult, private_run, run_chaos

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "reliability"))
from reliability_support import record_figures

pytestmark = [pytest.mark.process, pytest.mark.timeout(600)]

KINDS = ("sigkill_worker", "sigkill_node", "kill_db_connection", "sigstop_worker", "sigkill_subscriber")


def _run(tmp_path: Path, seconds: float, seed: int | None) -> ChaosResult:
    from orbit_cmd.devdb import DevDatabaseError, find_server_binaries

    try:
        find_server_binaries()
    except DevDatabaseError:
        dsn, inbox = create_database("orbit_chaos"), create_database("chaos_inbox")
        try:
            migrate.up(dsn)
            return run_chaos(dsn, tmp_path, seconds=seconds, seed=seed, inbox_dsn=inbox, settle_s=90)
        finally:
            drop_database(dsn)
            drop_database(inbox)
    res, _ = private_run(seconds, seed=seed, settle_s=90, work=tmp_path)
    return res


def test_bounded_chaos_run_has_no_anomalies(tmp_path: Path) -> None:
    res = _run(tmp_path, float(os.environ.get("ORBIT_CHAOS_SECONDS", "30")),
               int(os.environ.get("ORBIT_CHAOS_SEED", "0")) or None)  # fmt: skip
    record_figures("chaos_bounded", **res.to_json())
    assert res.tasks >= 50 and res.submits >= 30
    for kind in KINDS:
        assert res.faults[kind] >= 1, (kind, dict(res.faults))
    if res.private_db:
        assert res.faults["db_restart_sigkill"] + res.faults["db_restart_sigterm"] >= 1
    assert res.states["SUCCEEDED"] > 0
    assert res.workflow_starts > 0 and res.signals > 0
    assert res.figures["occurrences_tick"]["created"] > 0
    assert res.figures["inbox_rows"] == res.result_events > 0
    assert not res.anomalies, "\n".join(res.anomalies[:40])
