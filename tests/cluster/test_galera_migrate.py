"""``orbit-migrate`` on a Galera cluster: the node-local ``GET_LOCK`` is backed by the
cluster-wide lease (orbit/migrate/lease.py), so two runs started through two different nodes
serialise, and a run that died through one node is seen as live from another until its lease
expires, then as ``interrupted`` — never as a dead run while it still works.

Without the lease both runs got their (node-local) GET_LOCK and applied the same file at
once: the second died on "table exists" with a dirty mark, or applied the INSERT twice."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent))
from galera import GaleraCluster, galera_cluster, require_galera

from orbit import migrate
from orbit.migrate.types import DirtyState
from orbit.storage import DSN

pytestmark = [pytest.mark.process, pytest.mark.timeout(600)]

ROOT = Path(__file__).resolve().parents[2]
SLOW = """CREATE TABLE mig_counter (id INT NOT NULL PRIMARY KEY, n INT NOT NULL) ENGINE=InnoDB;
INSERT INTO mig_counter VALUES (1, 1);
SELECT SLEEP({sleep});
UPDATE mig_counter SET n = n + 1 WHERE id = 1;
"""


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[GaleraCluster]:
    require_galera()
    with galera_cluster(tmp_path_factory.mktemp("galera-migrate")) as c:
        yield c


def _dir(tmp_path: Path, sleep: float) -> Path:
    d = tmp_path / "migrations"
    d.mkdir()
    (d / "0001_slow.sql").write_text(SLOW.format(sleep=sleep))
    return d


def _up(dsn: DSN, migrations: Path, **env: str) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [sys.executable, "-m", "orbit_cmd.migrate", "--dsn", dsn.url(hide_password=False),
         "--migrations-dir", str(migrations), "up"],
        env={**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT), str(ROOT / "cmd")]), **env},
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
    )  # fmt: skip


def test_two_runs_through_two_nodes_serialise(cluster: GaleraCluster, tmp_path: Path) -> None:
    db = "mig_two"
    cluster.create_database(db)
    d = _dir(tmp_path, 4)
    a = _up(cluster.nodes[0].dsn(db), d)
    time.sleep(1.0)  # a is inside the file (SLEEP) when b starts through another node
    b = _up(cluster.nodes[1].dsn(db), d)
    out_a, out_b = a.communicate(120)[0], b.communicate(120)[0]
    assert a.returncode == 0, out_a
    assert b.returncode == 0, out_b
    assert "applied 0001_slow.sql" in out_a
    assert "applied 0001_slow.sql" not in out_b and "cluster lock" in out_b, out_b
    assert cluster.execute(2, "SELECT n FROM mig_counter", database=db) == [(2,)]
    st = migrate.status(cluster.nodes[2].dsn(db), d)
    assert st.applied == ["0001_slow.sql"] and st.dirty is None


def test_a_dead_run_is_live_until_its_lease_expires_then_interrupted(cluster: GaleraCluster, tmp_path: Path) -> None:
    db = "mig_dead"
    cluster.create_database(db)
    d = _dir(tmp_path, 1)
    ttl = "6"
    a = _up(cluster.nodes[0].dsn(db), d, ORBIT_MIGRATE_LEASE_TTL_S=ttl)
    other = cluster.nodes[1].dsn(db)
    deadline = time.monotonic() + 60
    while migrate.status(other, d).running is None:  # a is applying the file
        assert time.monotonic() < deadline and a.poll() is None
        time.sleep(0.05)
    os.kill(a.pid, signal.SIGKILL)
    a.wait(30)
    killed = time.monotonic()
    st = migrate.status(other, d)  # from another node: its GET_LOCK is invisible here
    assert st.dirty is None and st.running == "0001_slow.sql", st
    while (st := migrate.status(other, d)).dirty is None:
        assert time.monotonic() - killed < 60, st
        time.sleep(0.2)
    assert time.monotonic() - killed >= 2.0  # not before the lease could expire
    assert st.dirty.state is DirtyState.INTERRUPTED and st.dirty.file == "0001_slow.sql"
    b = _up(cluster.nodes[2].dsn(db), d)
    out = b.communicate(120)[0]
    assert b.returncode == 1 and "repair" in out, out  # refuses until an operator repairs
