"""The short cluster run of CI (tests/cluster/cluster_chaos.py): a private 3-node Galera
cluster, three ``orbit-server`` each writing through its own node, SDK workers, the producer,
workflows, both subscribers and the schedule of the chaos run; the usual deck of faults plus
a Galera node killed (or stopped) and started again (IST) and a Galera node partitioned away
from the other two and healed; then the history checker — zero anomalies expected.

``ORBIT_CLUSTER_CHAOS_SECONDS`` lengthens the fault phase (default 20 s; the run goes on until
every kind of fault happened once). The 20-minute run of reports/cluster.md is
``python tests/cluster/cluster_chaos.py --minutes 20``. Skipped when the machine cannot run
Galera."""

from __future__ import annotations

import os
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "reliability"))
from cluster_chaos import cluster_run
from galera import probe
from reliability_support import record_figures

pytestmark = [pytest.mark.process, pytest.mark.timeout(900)]


def test_short_cluster_run_has_no_anomalies(tmp_path: Path) -> None:
    why = probe()
    if why is not None:
        pytest.skip(f"no Galera here: {why}")
    seconds = float(os.environ.get("ORBIT_CLUSTER_CHAOS_SECONDS", "20"))
    res, _ = cluster_run(seconds, seed=int(os.environ.get("ORBIT_CHAOS_SEED", "0")) or None, work=tmp_path,
                         settle_s=120)  # fmt: skip
    record_figures("cluster_chaos_short", **res.to_json())
    assert res.tasks >= 30 and res.submits >= 20
    assert res.faults["galera_restart_sigkill"] + res.faults["galera_restart_sigterm"] >= 1
    assert res.faults["galera_partition"] >= 1 and res.faults["sigkill_node"] >= 1
    assert all(e["transfer"] == "ist" for e in res.figures["galera_faults"] if e["kind"] == "restart")
    assert res.states["SUCCEEDED"] > 0 and res.workflow_starts > 0
    assert res.figures["inbox_rows"] == res.result_events > 0
    assert not res.anomalies, "\n".join(res.anomalies[:40])
