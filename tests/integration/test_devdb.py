"""orbit_cmd.devdb: the private dev database of ``orbit-server --dev``, with real mariadbd processes.

Each test gets its own data folder under tmp_path and a DSN on a port where nothing listens,
so ensure_dev_database must start its own server. The fixture stops every server it started.
"""

from __future__ import annotations

import os
import signal
import socket
import time
from collections.abc import Iterator
from pathlib import Path

import pymysql
import pytest
from orbit_cmd.devdb import (
    DevDatabase,
    DevDatabaseError,
    ServerBinaries,
    ensure_dev_database,
    find_server_binaries,
    server_reachable,
    start_dev_database,
    stop_dev_database,
)

from orbit.storage import DSN

pytestmark = pytest.mark.timeout(60)


def _unused_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _connect(dev: DevDatabase) -> pymysql.connections.Connection:
    return pymysql.connect(autocommit=True, **dev.dsn.connect_kwargs())


def _query(dev: DevDatabase, sql: str) -> list[tuple[object, ...]]:
    conn = _connect(dev)
    try:
        with conn.cursor() as cur:
            cur.execute(sql)
            return list(cur.fetchall())
    finally:
        conn.close()


def _gone(dev: DevDatabase, within: float) -> bool:
    deadline = time.monotonic() + within
    while dev.running and time.monotonic() < deadline:
        time.sleep(0.05)
    return not dev.running


@pytest.fixture
def nowhere() -> DSN:
    """A DSN at which no server answers."""
    return DSN(host="127.0.0.1", port=_unused_port(), database="orbit")


@pytest.fixture
def data_dirs(tmp_path: Path) -> Iterator[list[Path]]:
    """Data folders used by a test; any server still running from them is stopped after."""
    dirs: list[Path] = []
    yield dirs
    for d in dirs:
        stop_dev_database(d, grace=10)


async def test_reachable_server_returns_none(server_dsn: DSN, tmp_path: Path) -> None:
    data_dir = tmp_path / "dev"
    assert await ensure_dev_database(server_dsn, data_dir=data_dir) is None
    assert not data_dir.exists()  # nothing was initialised or started


async def test_server_reachable_tells_a_server_from_a_free_port(
    server_dsn: DSN, nowhere: DSN
) -> None:
    assert await server_reachable(server_dsn)
    assert not await server_reachable(nowhere)
    # A server that refuses the login still answers: a private server would not fix that DSN.
    assert await server_reachable(DSN(user="no_such_user", password="x", port=server_dsn.port))


async def test_private_database_starts_keeps_data_and_restarts(
    nowhere: DSN, tmp_path: Path, data_dirs: list[Path]
) -> None:
    data_dir = tmp_path / "orbit-dev"
    data_dirs.append(data_dir)

    dev = await ensure_dev_database(nowhere, data_dir=data_dir)
    assert dev is not None and dev.running and not dev.adopted
    assert dev.dsn.host == "127.0.0.1" and dev.dsn.port != nowhere.port
    assert dev.dsn.database == "orbit" and dev.dsn.unix_socket is None
    # It is our private server, not the machine's: its datadir is in our folder.
    [(datadir, database)] = _query(dev, "SELECT @@datadir, DATABASE()")
    assert Path(str(datadir)) == data_dir / "data"
    assert database == "orbit"
    _query(dev, "CREATE TABLE kept (id INT PRIMARY KEY, note VARCHAR(20))")
    _query(dev, "INSERT INTO kept VALUES (1, 'survives')")
    assert dev.log_file.exists() and (data_dir / "initialised").exists()
    first_port = dev.dsn.port

    await dev.stop()
    assert not dev.running
    assert not await server_reachable(dev.dsn)
    assert not (data_dir / "mysqld.pid").exists()  # clean shutdown removes it
    await dev.stop()  # idempotent

    marker_mtime = (data_dir / "initialised").stat().st_mtime_ns
    t0 = time.monotonic()
    again = await ensure_dev_database(nowhere, data_dir=data_dir)
    restart_s = time.monotonic() - t0
    assert again is not None and again.pid != dev.pid
    try:
        assert again.dsn.port == first_port  # the port is reused while free
        assert _query(again, "SELECT id, note FROM kept") == [(1, "survives")]
        # Reused, not re-initialised.
        assert (data_dir / "initialised").stat().st_mtime_ns == marker_mtime
        assert restart_s < 20, restart_s
    finally:
        again.stop_sync()
    assert not again.running


async def test_recovers_after_the_server_was_killed(
    nowhere: DSN, tmp_path: Path, data_dirs: list[Path]
) -> None:
    data_dir = tmp_path / "crash"
    data_dirs.append(data_dir)
    dev = await start_dev_database(data_dir)
    _query(dev, "CREATE TABLE t (id INT PRIMARY KEY)")
    _query(dev, "INSERT INTO t VALUES (7)")

    os.kill(dev.pid, signal.SIGKILL)  # a crash: pid file and socket stay behind
    assert _gone(dev, within=10)
    assert (data_dir / "mysqld.pid").exists() and dev.socket.exists()

    again = await ensure_dev_database(nowhere, data_dir=data_dir)
    assert again is not None
    try:
        assert not again.adopted and again.pid != dev.pid
        assert _query(again, "SELECT id FROM t") == [(7,)]  # committed before the crash
    finally:
        await again.stop()


async def test_adopts_a_server_left_running_by_an_earlier_process(
    nowhere: DSN, tmp_path: Path, data_dirs: list[Path]
) -> None:
    data_dir = tmp_path / "left"
    data_dirs.append(data_dir)
    first = await ensure_dev_database(nowhere, data_dir=data_dir)
    assert first is not None
    # The process that started `first` "died" without stopping it; the next run adopts it.
    second = await ensure_dev_database(nowhere, data_dir=data_dir)
    assert second is not None and second.adopted
    assert second.pid == first.pid and second.dsn == first.dsn
    assert _query(second, "SELECT 1") == [(1,)]
    await second.stop()
    assert not first.running and not second.running


async def test_half_initialised_folder_is_initialised_again(
    tmp_path: Path, data_dirs: list[Path]
) -> None:
    data_dir = tmp_path / "half"
    data_dirs.append(data_dir)
    (data_dir / "data").mkdir(parents=True)
    (data_dir / "data" / "leftover").write_text("from an interrupted initialisation")
    dev = await start_dev_database(data_dir, database="other_name")
    try:
        assert not (data_dir / "data" / "leftover").exists()
        assert dev.dsn.database == "other_name"
        assert _query(dev, "SELECT DATABASE()") == [("other_name",)]
    finally:
        await dev.stop()


async def test_long_data_folder_path_puts_the_socket_elsewhere(
    tmp_path: Path, data_dirs: list[Path]
) -> None:
    data_dir = tmp_path / ("d" * 60) / ("e" * 60)
    data_dirs.append(data_dir)
    dev = await start_dev_database(data_dir)
    try:
        assert len(os.fsencode(dev.socket)) <= 100  # a unix socket path holds 108 bytes
        assert not dev.socket.is_relative_to(data_dir)
        conn = pymysql.connect(unix_socket=str(dev.socket), user="root", password="")
        conn.close()
    finally:
        await dev.stop()


def test_no_server_binary_says_how_to_install(tmp_path: Path) -> None:
    with pytest.raises(DevDatabaseError, match=r"apt-get install mariadb-server"):
        find_server_binaries(search_path=[tmp_path])


async def test_a_server_that_exits_at_start_reports_it(
    tmp_path: Path, data_dirs: list[Path]
) -> None:
    data_dir = tmp_path / "broken"
    data_dirs.append(data_dir)
    data_dir.mkdir()
    (data_dir / "initialised").write_text("pretend\n")  # skip initialisation
    false = ServerBinaries(server=Path("/bin/false"), flavor="mariadb", install_db=None, version="")
    with pytest.raises(DevDatabaseError, match=r"false exited with code 1 during start-up"):
        await start_dev_database(data_dir, binaries=false, start_timeout=20)
