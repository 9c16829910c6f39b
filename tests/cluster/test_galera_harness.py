"""The Galera harness itself (tests/cluster/galera.py) and the engine facts Orbit's design
rests on, measured on a private 3-node cluster: DDL applied through one node reaches every
node, a commit on one node is read on another (``wsrep_sync_wait``), two nodes writing the
same row conflict at COMMIT (certification, reported as 1213), ``GET_LOCK`` is node-local, a
node cut off from the others refuses queries (1047) while the other two go on, and a node
killed and started again catches up by IST.

Skipped when the machine cannot run Galera (no ``mariadbd`` or ``galera-4`` and no way to
install it)."""

from __future__ import annotations

import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pymysql
import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent))
from galera import WSREP_NOT_READY, GaleraCluster, galera_cluster, require_galera

from orbit import migrate

pytestmark = [pytest.mark.process, pytest.mark.timeout(600)]


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[GaleraCluster]:
    require_galera()
    with galera_cluster(tmp_path_factory.mktemp("galera")) as c:
        c.create_database("orbit")
        yield c


def _conn(c: GaleraCluster, node: int) -> pymysql.connections.Connection:
    return pymysql.connect(autocommit=False, **c.nodes[node].dsn("orbit").connect_kwargs())


def test_migrations_through_one_node_reach_every_node(cluster: GaleraCluster) -> None:
    res = migrate.up(cluster.nodes[0].dsn("orbit"))
    assert res.applied
    for i in range(1, len(cluster.nodes)):
        st = migrate.status(cluster.nodes[i].dsn("orbit"))
        assert st.pending == [] and st.dirty is None and st.foreign_keys == 0, (i, st)
        triggers = cluster.execute(i, "SELECT COUNT(*) FROM information_schema.TRIGGERS WHERE TRIGGER_SCHEMA = 'orbit'")
        assert triggers[0][0] > 0


def test_a_commit_on_one_node_is_read_on_the_others(cluster: GaleraCluster) -> None:
    cluster.execute(0, "CREATE TABLE IF NOT EXISTS h_kv (k INT PRIMARY KEY, v INT NOT NULL) ENGINE=InnoDB",
                    database="orbit")  # fmt: skip
    for n in range(30):
        writer = n % 3
        cluster.execute(writer, "REPLACE INTO h_kv VALUES (1, %s)", (n,), database="orbit")
        for reader in range(3):  # wsrep_sync_wait=1: no stale read, at once
            assert cluster.execute(reader, "SELECT v FROM h_kv WHERE k = 1", database="orbit") == [(n,)]


def test_two_nodes_writing_one_row_conflict_at_commit(cluster: GaleraCluster) -> None:
    """Row locks are node-local: both nodes lock the row (neither waits); the second COMMIT
    fails certification with 1213, exactly like a deadlock."""
    cluster.execute(0, "CREATE TABLE IF NOT EXISTS h_ctr (k INT PRIMARY KEY, n INT NOT NULL) ENGINE=InnoDB",
                    database="orbit")  # fmt: skip
    cluster.execute(0, "REPLACE INTO h_ctr VALUES (1, 0)", database="orbit")
    a, b = _conn(cluster, 0), _conn(cluster, 1)
    try:
        with a.cursor() as ca, b.cursor() as cb:
            ca.execute("SELECT n FROM h_ctr WHERE k = 1 FOR UPDATE")
            cb.execute("SELECT n FROM h_ctr WHERE k = 1 FOR UPDATE")  # does not wait: another node
            ca.execute("UPDATE h_ctr SET n = n + 1 WHERE k = 1")
            cb.execute("UPDATE h_ctr SET n = n + 10 WHERE k = 1")
            a.commit()
            with pytest.raises(pymysql.err.OperationalError) as err:
                b.commit()
            assert err.value.args[0] == 1213
    finally:
        a.close()
        b.close()
    assert cluster.execute(2, "SELECT n FROM h_ctr WHERE k = 1", database="orbit") == [(1,)]


def test_get_lock_is_node_local(cluster: GaleraCluster) -> None:
    """Why orbit-migrate cannot use GET_LOCK alone on Galera: two nodes grant the same name."""
    a, b = _conn(cluster, 0), _conn(cluster, 1)
    try:
        with a.cursor() as ca, b.cursor() as cb:
            ca.execute("SELECT GET_LOCK('h-lock', 0)")
            cb.execute("SELECT GET_LOCK('h-lock', 0)")
            assert ca.fetchone() == (1,) and cb.fetchone() == (1,)
    finally:
        a.close()
        b.close()


def test_a_partitioned_node_refuses_and_the_others_go_on(cluster: GaleraCluster) -> None:
    cluster.partition(2)
    try:
        deadline = time.monotonic() + 60
        while cluster.nodes[2].status()["wsrep_cluster_status"] == "Primary":
            assert time.monotonic() < deadline
            time.sleep(0.2)
        with pytest.raises(pymysql.MySQLError) as err:
            cluster.execute(2, "SELECT COUNT(*) FROM orbit_applications", database="orbit")
        assert err.value.args[0] == WSREP_NOT_READY
        cluster.wait_size(2, 60, nodes=[0, 1])
        cluster.execute(0, "REPLACE INTO h_kv VALUES (2, 7)", database="orbit")
        assert cluster.execute(1, "SELECT v FROM h_kv WHERE k = 2", database="orbit") == [(7,)]
    finally:
        cluster.heal(2)
    cluster.wait_size(3, 120)
    assert cluster.execute(2, "SELECT v FROM h_kv WHERE k = 2", database="orbit") == [(7,)]


def test_a_killed_node_rejoins_by_ist_with_what_it_missed(cluster: GaleraCluster) -> None:
    stop = threading.Event()
    written: list[int] = []

    def write() -> None:
        n = 100
        while not stop.is_set():
            n += 1
            try:
                cluster.execute(0, "INSERT INTO h_kv VALUES (%s, %s)", (n, n), database="orbit")
                written.append(n)
            except pymysql.MySQLError:
                time.sleep(0.1)

    t = threading.Thread(target=write)
    t.start()
    try:
        how = cluster.restart(1, down_s=2.0)
    finally:
        stop.set()
        t.join(30)
    assert how["transfer"] == "ist", how
    cluster.wait_size(3, 120)
    got = cluster.execute(1, "SELECT COUNT(*) FROM h_kv WHERE k > 100", database="orbit")[0][0]
    assert got == len(written) > 0
