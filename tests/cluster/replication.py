"""A private MariaDB primary with one replica, a TCP endpoint in front (what a VIP or a proxy
is in production), and the failover procedure: the primary dies, the replica applies what it
received, is promoted, and the endpoint moves to it.

    python tests/cluster/replication.py up --mode semisync    # start, print the endpoint, wait for Ctrl-C

``mode``:

* ``async``: classic asynchronous replication. A commit is acknowledged to the client before
  the replica has it: a failover loses the primary's last commits.
* ``semisync``: semi-synchronous replication with ``rpl_semi_sync_master_wait_point =
  AFTER_SYNC``: a commit is written to the primary's binary log, then waits until the replica
  has written it to its relay log, and only then is committed in InnoDB (visible to other
  sessions) and acknowledged. ``rpl_semi_sync_master_timeout`` is set far above any run
  (``SEMISYNC_TIMEOUT_MS``): MariaDB silently falls back to asynchronous replication when
  the replica does not answer in time, and then a failover can lose commits again.

Both servers run with ``sync_binlog = 1`` and ``innodb_flush_log_at_trx_commit = 1``, GTIDs
(``gtid_strict_mode``), ROW binlog. Each listens on its own loopback address (as in
galera.py); the endpoint (:class:`Endpoint`) listens on 127.0.0.1 and forwards each client
connection to the current primary; :meth:`Endpoint.switch` points it elsewhere and closes
every open connection, as a moved VIP does. Everything stops at the end (by pid).
"""

from __future__ import annotations

import argparse
import contextlib
import os
import selectors
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pymysql

HERE = Path(__file__).resolve().parent
ROOT = HERE.parents[1]
for extra in (ROOT, HERE):
    if str(extra) not in sys.path:
        sys.path.insert(0, str(extra))

from galera import _address_block, _free_port, _user_exists, _which, server_folder  # noqa: E402

from orbit.storage.dsn import DSN  # noqa: E402

SEMISYNC_TIMEOUT_MS = 3_600_000
START_TIMEOUT = 120.0


@dataclass(eq=False)
class Server:
    """One ``mariadbd`` with a binary log (primary or replica)."""

    name: str
    host: str
    port: int
    root: Path
    server_id: int
    mode: str
    run_as: str | None
    proc: subprocess.Popen[bytes] | None = None
    starts: int = 0

    @property
    def datadir(self) -> Path:
        return self.root / "data"

    def dsn(self, database: str = "mysql") -> DSN:
        return DSN(user="root", password="", host=self.host, port=self.port, database=database)

    def alive(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def initialise(self) -> None:
        self.root.mkdir(parents=True, exist_ok=True)
        cmd = [str(_which("mariadb-install-db")), "--no-defaults", f"--datadir={self.datadir}",
               "--auth-root-authentication-method=normal", "--skip-test-db"]  # fmt: skip
        if self.run_as:
            cmd.append(f"--user={self.run_as}")
            shutil.chown(self.root, self.run_as, self.run_as)
        r = subprocess.run(cmd, capture_output=True, text=True, timeout=300, check=False)
        if r.returncode != 0:
            raise RuntimeError(f"mariadb-install-db failed: {r.stdout}{r.stderr}")

    def start(self, sock_dir: str) -> None:
        self.starts += 1
        semisync = self.mode == "semisync"
        cmd = [
            str(_which("mariadbd")), "--no-defaults", f"--datadir={self.datadir}",
            f"--socket={sock_dir}/{self.name}.sock", f"--port={self.port}", f"--bind-address={self.host}",
            f"--pid-file={self.root / 'mysqld.pid'}", f"--log-error={self.root / f'mysqld.{self.starts}.log'}",
            "--character-set-server=utf8mb4", "--collation-server=utf8mb4_general_ci", "--skip-name-resolve",
            f"--server-id={self.server_id}", f"--log-bin={self.datadir / 'binlog'}", "--binlog-format=ROW",
            "--log-slave-updates=ON", "--gtid-strict-mode=ON", "--sync-binlog=1",
            "--innodb-flush-log-at-trx-commit=1", "--innodb-buffer-pool-size=128M", "--max-connections=400",
            # Triggers created by the migration account with the binary log on (see
            # docs/deployment.md: log_bin_trust_function_creators or SUPER).
            "--log-bin-trust-function-creators=ON",
            # The primary turns it on once its replica is connected (start()): with no replica
            # yet, every commit would wait for one.
            "--rpl-semi-sync-master-enabled=OFF",
            f"--rpl-semi-sync-slave-enabled={'ON' if semisync else 'OFF'}",
            "--rpl-semi-sync-master-wait-point=AFTER_SYNC",
            f"--rpl-semi-sync-master-timeout={SEMISYNC_TIMEOUT_MS}",
            "--rpl-semi-sync-master-wait-no-slave=ON",
        ]  # fmt: skip
        if self.run_as:
            cmd.append(f"--user={self.run_as}")
        self.proc = subprocess.Popen(cmd, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                                     stderr=subprocess.DEVNULL, start_new_session=True)  # fmt: skip
        deadline = time.monotonic() + START_TIMEOUT
        while time.monotonic() < deadline:
            if not self.alive():
                raise RuntimeError(f"{self.name} exited during start-up (log in {self.root})")
            with contextlib.suppress(pymysql.MySQLError):
                self.execute("SELECT 1")
                return
            time.sleep(0.2)
        raise RuntimeError(f"{self.name} did not answer in {START_TIMEOUT:.0f} s")

    def execute(self, sql: str, args: Any = None) -> list[tuple[Any, ...]]:
        conn = pymysql.connect(autocommit=True, connect_timeout=3, read_timeout=60,
                               **self.dsn().connect_kwargs(with_database=False))  # fmt: skip
        try:
            with conn.cursor() as cur:
                cur.execute(sql, args)
                return list(cur.fetchall()) if cur.description else []
        finally:
            conn.close()

    def replica_status(self) -> dict[str, Any]:
        conn = pymysql.connect(autocommit=True, connect_timeout=3, cursorclass=pymysql.cursors.DictCursor,
                               **self.dsn().connect_kwargs(with_database=False))  # fmt: skip
        try:
            with conn.cursor() as cur:
                cur.execute("SHOW SLAVE STATUS")
                return dict(cur.fetchone() or {})
        finally:
            conn.close()

    def kill(self, sig: int = signal.SIGKILL) -> None:
        if self.alive():
            assert self.proc is not None
            with contextlib.suppress(ProcessLookupError):
                os.kill(self.proc.pid, sig)
            try:
                self.proc.wait(30)
            except subprocess.TimeoutExpired:
                os.kill(self.proc.pid, signal.SIGKILL)
                self.proc.wait(30)


def _seq(gtid: str | None) -> int:
    """The sequence number of domain 0 in a GTID position ("0-1-1399" → 1399)."""
    for part in (gtid or "").split(","):
        bits = part.strip().split("-")
        if len(bits) == 3 and bits[0] == "0":
            return int(bits[2])
    return 0


class Endpoint:
    """A TCP forwarder on 127.0.0.1: every client connection goes to the current backend."""

    def __init__(self, backend: tuple[str, int]) -> None:
        self.backend = backend
        self.listener = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        self.listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        self.listener.bind(("127.0.0.1", 0))
        self.listener.listen(256)
        self.port = int(self.listener.getsockname()[1])
        self._sel = selectors.DefaultSelector()
        self._pairs: dict[socket.socket, socket.socket] = {}
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._switch = threading.Event()
        self.refused = 0
        self._thread = threading.Thread(target=self._run, name="endpoint", daemon=True)
        self._thread.start()

    def switch(self, backend: tuple[str, int] | None) -> None:
        """Point new connections at ``backend`` (None: refuse them) and cut the open ones."""
        with self._lock:
            self.backend = backend  # type: ignore[assignment]
        self._switch.set()

    def close(self) -> None:
        self._stop.set()
        self._thread.join(10)
        self.listener.close()

    def _drop(self, s: socket.socket) -> None:
        peer = self._pairs.pop(s, None)
        for x in (s, peer):
            if x is None:
                continue
            self._pairs.pop(x, None)
            with contextlib.suppress(Exception):
                self._sel.unregister(x)
            with contextlib.suppress(OSError):
                x.close()

    def _run(self) -> None:
        self.listener.setblocking(False)
        self._sel.register(self.listener, selectors.EVENT_READ)
        while not self._stop.is_set():
            if self._switch.is_set():
                self._switch.clear()
                for s in list(self._pairs):
                    self._drop(s)
            for key, _ in self._sel.select(0.2):
                s = key.fileobj
                assert isinstance(s, socket.socket)
                if s is self.listener:
                    with contextlib.suppress(BlockingIOError):
                        client, _ = self.listener.accept()
                        with self._lock:
                            backend = self.backend
                        try:
                            if backend is None:
                                raise OSError("no backend")
                            upstream = socket.create_connection(backend, timeout=2)
                        except OSError:
                            self.refused += 1
                            client.close()
                            continue
                        for a, b in ((client, upstream), (upstream, client)):
                            a.setblocking(False)
                            self._pairs[a] = b
                            self._sel.register(a, selectors.EVENT_READ)
                    continue
                try:
                    data = s.recv(65536)
                except (BlockingIOError, InterruptedError):
                    continue
                except OSError:
                    data = b""
                peer = self._pairs.get(s)
                if not data or peer is None:
                    self._drop(s)
                    continue
                try:
                    peer.setblocking(True)
                    peer.sendall(data)
                    peer.setblocking(False)
                except OSError:
                    self._drop(s)
        for s in list(self._pairs):
            self._drop(s)


@dataclass(eq=False)
class ReplicatedPair:
    """A primary, a replica of it, and the endpoint clients use."""

    root: Path
    mode: str = "semisync"
    keep: bool = False
    primary: Server = field(init=False)
    replica: Server = field(init=False)
    endpoint: Endpoint | None = None
    sock_dir: str = ""
    promoted: dict[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if self.mode not in ("async", "semisync"):
            raise ValueError(f"mode {self.mode!r}: async or semisync")
        run_as = ("mysql" if _user_exists("mysql") else "root") if os.geteuid() == 0 else None
        self.root = server_folder(Path(self.root).resolve(), run_as)
        k = _address_block()
        hosts = [f"127.0.{k}.1", f"127.0.{k}.2"]
        self.primary = Server("primary", hosts[0], _free_port(hosts[0]), self.root / "primary", 1, self.mode, run_as)
        self.replica = Server("replica", hosts[1], _free_port(hosts[1]), self.root / "replica", 2, self.mode, run_as)
        self.sock_dir = tempfile.mkdtemp(prefix="orbit-repl-")
        if run_as and run_as != "root":
            shutil.chown(self.sock_dir, run_as, run_as)

    def start(self) -> ReplicatedPair:
        for s in (self.primary, self.replica):
            s.initialise()
            s.start(self.sock_dir)
        self.primary.execute("CREATE USER IF NOT EXISTS 'root'@'%' IDENTIFIED BY ''")
        self.primary.execute("GRANT ALL PRIVILEGES ON *.* TO 'root'@'%' WITH GRANT OPTION")
        self.replica.execute("CREATE USER IF NOT EXISTS 'root'@'%' IDENTIFIED BY ''")
        self.replica.execute("GRANT ALL PRIVILEGES ON *.* TO 'root'@'%' WITH GRANT OPTION")
        # Both started empty with the same system tables: replicate from the primary's start.
        self.replica.execute("RESET MASTER")
        self.replica.execute("SET GLOBAL gtid_slave_pos = ''")
        self.replica.execute(
            "CHANGE MASTER TO MASTER_HOST = %s, MASTER_PORT = %s, MASTER_USER = 'root', MASTER_PASSWORD = '',"
            " MASTER_USE_GTID = slave_pos, MASTER_CONNECT_RETRY = 1",
            (self.primary.host, self.primary.port),
        )
        self.replica.execute("START SLAVE")
        if self.mode == "semisync":
            self.primary.execute("SET GLOBAL rpl_semi_sync_master_enabled = ON")
        self._wait_replica_running()
        self.endpoint = Endpoint((self.primary.host, self.primary.port))
        return self

    def _wait_replica_running(self, timeout: float = 60) -> None:
        deadline = time.monotonic() + timeout
        st: dict[str, Any] = {}
        while time.monotonic() < deadline:
            st = self.replica.replica_status()
            running = st.get("Slave_IO_Running") == "Yes" and st.get("Slave_SQL_Running") == "Yes"
            if running and (self.mode != "semisync" or self._semisync_clients() >= 1):
                return
            time.sleep(0.2)
        raise RuntimeError(f"replication did not start: {st.get('Last_IO_Error')} {st.get('Last_SQL_Error')}")

    def _semisync_clients(self) -> int:
        rows = self.primary.execute("SHOW STATUS LIKE 'Rpl_semi_sync_master_clients'")
        return int(rows[0][1]) if rows else 0

    def dsn(self, database: str) -> DSN:
        """What clients use: the endpoint (it moves to the new primary on failover)."""
        assert self.endpoint is not None
        return DSN(user="root", password="", host="127.0.0.1", port=self.endpoint.port, database=database)

    def create_database(self, name: str) -> None:
        self.primary.execute(f"CREATE DATABASE IF NOT EXISTS `{name}` CHARACTER SET utf8mb4 COLLATE utf8mb4_bin")

    def semisync_status(self) -> dict[str, str]:
        rows = self.primary.execute("SHOW STATUS LIKE 'Rpl_semi_sync_master_%%'")
        return {k: str(v) for k, v in rows}

    def failover(self, timeout: float = 120.0, *, lag_s: float = 0.0) -> dict[str, Any]:
        """Kill the primary (SIGKILL), let the replica apply everything it received, promote
        it, move the endpoint. Returns the timings and what the replica had.

        ``lag_s``: first cut the replication link (the replica's IO thread stopped) for that
        long, as a network fault between the two would, so the replica is behind when the
        primary dies: asynchronous replication then loses the primary's last commits;
        semi-synchronous replication holds every commit back instead (none is acknowledged
        without the replica)."""
        assert self.endpoint is not None
        t0 = time.monotonic()
        if lag_s > 0:
            self.replica.execute("STOP SLAVE IO_THREAD")
            time.sleep(lag_s)
        before = {}
        primary_gtid = None
        with contextlib.suppress(pymysql.MySQLError):
            before = self.semisync_status()
            primary_gtid = str(self.primary.execute("SELECT @@gtid_binlog_pos")[0][0])
        self.endpoint.switch(None)  # the VIP leaves the dead primary
        self.primary.kill(signal.SIGKILL)
        killed = time.monotonic()
        deadline = killed + timeout
        st: dict[str, Any] = {}
        while time.monotonic() < deadline:  # the relay log applied up to what was received
            st = self.replica.replica_status()
            if (st.get("Relay_Master_Log_File") == st.get("Master_Log_File")
                    and st.get("Exec_Master_Log_Pos") == st.get("Read_Master_Log_Pos")
                    and st.get("Slave_SQL_Running") == "Yes"):  # fmt: skip
                break
            time.sleep(0.1)
        applied = time.monotonic()
        self.replica.execute("STOP SLAVE")
        self.replica.execute("RESET SLAVE ALL")
        self.replica.execute("SET GLOBAL read_only = OFF")
        # It has no replica of its own yet: semi-synchronous commits would wait for one (up to
        # the timeout). Production attaches a new replica; this harness runs on without one.
        self.replica.execute("SET GLOBAL rpl_semi_sync_master_enabled = OFF")
        self.endpoint.switch((self.replica.host, self.replica.port))
        done = time.monotonic()
        self.promoted = {
            "mode": self.mode,
            "primary_semisync_before": {k: before.get(k) for k in (
                "Rpl_semi_sync_master_status", "Rpl_semi_sync_master_yes_tx", "Rpl_semi_sync_master_no_tx")},
            "lag_s": lag_s,
            "primary_gtid": primary_gtid,
            "replica_gtid": st.get("Gtid_IO_Pos"),
            "transactions_lost": _seq(primary_gtid) - _seq(st.get("Gtid_IO_Pos")),
            "relay_applied_s": round(applied - killed, 3),
            "endpoint_moved_s": round(done - t0, 3),
            "t_kill": killed,
            "t_done": done,
        }  # fmt: skip
        return self.promoted

    def stop(self) -> None:
        if self.endpoint is not None:
            self.endpoint.close()
        for s in (self.replica, self.primary):
            s.kill(signal.SIGTERM)
        shutil.rmtree(self.sock_dir, ignore_errors=True)
        if not self.keep:
            shutil.rmtree(self.root, ignore_errors=True)

    def __enter__(self) -> ReplicatedPair:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    sub = p.add_subparsers(dest="cmd", required=True)
    up = sub.add_parser("up")
    up.add_argument("--mode", default="semisync", choices=("async", "semisync"))
    up.add_argument("--database", default="orbit")
    args = p.parse_args(argv)
    root = Path(tempfile.mkdtemp(prefix="orbit-repl-pair-"))
    with ReplicatedPair(root, mode=args.mode) as pair:
        pair.create_database(args.database)
        print(f"endpoint: {pair.dsn(args.database).url()}  primary {pair.primary.host}:{pair.primary.port}"
              f"  replica {pair.replica.host}:{pair.replica.port}", flush=True)  # fmt: skip
        with contextlib.suppress(KeyboardInterrupt):
            while True:
                time.sleep(1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
