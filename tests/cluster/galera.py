"""A private MariaDB Galera cluster on one machine: three ``mariadbd`` with wsrep on their
own loopback addresses, private data folders, torn down afterwards.

    python tests/cluster/galera.py up [--nodes 3] [--root DIR]   # start, print the DSNs, wait for Ctrl-C
    python tests/cluster/galera.py probe                          # can this machine run one?

Used by the cluster tests (tests/cluster/), the cluster chaos run and the cluster bench.

* **Never the shared server.** Each node listens on its own loopback address
  (``127.0.<k>.1``, ``127.0.<k>.2``, … with ``k`` drawn per cluster so two clusters on the
  machine never meet) and free ports; its data folder, socket, pid file and log live under
  the cluster's root folder. Nothing here connects to 127.0.0.1:3306.
* **Provider.** ``galera-4`` (``/usr/lib/galera/libgalera_smm.so``) is installed with
  ``apt-get`` when missing and the process runs as root (:func:`ensure_galera`); otherwise
  :class:`GaleraUnavailable` says what is missing and the tests skip.
* **Bootstrap.** Node 0 is initialised (``mariadb-install-db``) and started with
  ``--wsrep-new-cluster``; the others start on empty folders and receive a state snapshot
  (SST, ``rsync``) from it. A node killed and started again recovers its position
  (``--wsrep-recover``) and catches up by incremental state transfer (IST) from the gcache.
* **Partitions.** :meth:`GaleraCluster.partition` cuts one node's group-communication and
  state-transfer traffic from the other nodes with ``iptables`` rules on the loopback
  interface that name only this cluster's addresses (installed when missing, as root);
  without iptables it falls back to Galera's own ``gmcast.isolate`` (the node closes its
  group connections and refuses new ones). Client connections to the node stay open either
  way, which is the case that matters: an Orbit node still reaches its database node, and
  that node has lost the primary component.
* **Settings** mirror what docs/deployment.md asks of a production cluster:
  ``binlog_format=ROW``, ``innodb_autoinc_lock_mode=2``, ``wsrep_sync_wait=1`` (reads see
  every commit the cluster acknowledged before them), durable InnoDB flushing.

Everything started is stopped by :meth:`GaleraCluster.stop` (by pid: SIGTERM, then SIGKILL),
and the iptables rules are removed; the root folder is removed unless ``keep``.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import random
import re
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pymysql

ROOT = Path(__file__).resolve().parents[2]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from orbit.storage.dsn import DSN  # noqa: E402

PROVIDER_PATHS = ("/usr/lib/galera/libgalera_smm.so", "/usr/lib/libgalera_smm.so",
                  "/usr/lib64/galera-4/libgalera_smm.so", "/usr/lib64/galera/libgalera_smm.so")  # fmt: skip
START_TIMEOUT = 180.0
STOP_GRACE = 30.0
RECOVER_TIMEOUT = 120.0
CLUSTER_NAME = "orbit-test"
#: wsrep error: the node is not part of the primary component (lost quorum, not synced).
WSREP_NOT_READY = 1047


class GaleraUnavailable(RuntimeError):
    """This machine cannot run a private Galera cluster (says what is missing)."""


# --------------------------------------------------------------------------------------------
# Binaries


def _which(name: str) -> str | None:
    return shutil.which(name) or next(
        (str(p) for d in ("/usr/sbin", "/usr/bin", "/usr/local/sbin") if (p := Path(d) / name).is_file()), None
    )


def _apt_install(*packages: str) -> bool:
    """``apt-get install`` as root (never prompts); False when not root or it failed."""
    if os.geteuid() != 0 or not _which("apt-get"):
        return False
    env = {**os.environ, "DEBIAN_FRONTEND": "noninteractive"}
    cmd = ["apt-get", "install", "-y", "-q", "--no-install-recommends", *packages]
    r = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=600, check=False)
    if r.returncode != 0:  # the package lists may be missing on a fresh machine
        subprocess.run(["apt-get", "update", "-q"], env=env, capture_output=True, timeout=600, check=False)
        r = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=600, check=False)
    return r.returncode == 0


def provider_path() -> Path | None:
    return next((Path(p) for p in PROVIDER_PATHS if Path(p).is_file()), None)


def ensure_galera() -> Path:
    """The Galera provider library, installing ``galera-4`` (and ``rsync`` for state
    transfers) when missing and allowed. Raises :class:`GaleraUnavailable`."""
    if _which("mariadbd") is None or _which("mariadb-install-db") is None:
        raise GaleraUnavailable("mariadbd / mariadb-install-db not installed (apt-get install mariadb-server)")
    if provider_path() is None or _which("rsync") is None:
        _apt_install("galera-4", "rsync")
    lib = provider_path()
    if lib is None:
        raise GaleraUnavailable("the Galera provider (galera-4) is not installed and could not be installed")
    if _which("rsync") is None or _which("wsrep_sst_rsync") is None:
        raise GaleraUnavailable("rsync / wsrep_sst_rsync are needed for state transfers (apt-get install rsync)")
    return lib


def ensure_iptables() -> str | None:
    """The iptables binary (installed when missing and allowed) if it can change rules here."""
    exe = _which("iptables")
    if exe is None and _apt_install("iptables"):
        exe = _which("iptables")
    if exe is None:
        return None
    r = subprocess.run([exe, "-w", "-S", "INPUT"], capture_output=True, timeout=30, check=False)
    return exe if r.returncode == 0 else None


# --------------------------------------------------------------------------------------------
# Addresses and ports


def _user_exists(name: str) -> bool:
    import pwd

    try:
        pwd.getpwnam(name)
    except KeyError:
        return False
    return True


def server_folder(root: Path, run_as: str | None) -> Path:
    """``root``, created, if the server account can reach it; else a fresh folder under the
    system temporary folder. (pytest's ``/tmp/pytest-of-root`` is 0700, and every new pytest
    session makes it so again: a server running as ``mysql`` under it loses its data folder
    in the middle of a run.)"""
    root.mkdir(parents=True, exist_ok=True)
    if not run_as or run_as == "root":
        return root
    if all(p.stat().st_mode & 0o001 for p in root.parents):
        root.chmod(root.stat().st_mode | 0o055)
        return root
    own = Path(tempfile.mkdtemp(prefix="orbit-db-", dir=tempfile.gettempdir()))
    own.chmod(0o755)
    with contextlib.suppress(OSError):
        (root / "servers").symlink_to(own)  # where to look, from the folder the caller gave
    return own


def _free_port(host: str) -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind((host, 0))
        return int(s.getsockname()[1])


def _address_block() -> int:
    """A ``k`` for ``127.0.<k>.x`` that no socket on the machine uses yet."""
    used = set()
    with contextlib.suppress(OSError):
        for line in Path("/proc/net/tcp").read_text().splitlines()[1:]:
            local = line.split()[1].split(":")[0]
            octets = bytes.fromhex(local)[::-1]  # little-endian hex
            if octets[0] == 127:
                used.add(octets[1])
    free = [k for k in range(100, 250) if k not in used]
    return random.choice(free)


# --------------------------------------------------------------------------------------------
# Nodes


def _alive(proc: subprocess.Popen[bytes] | None) -> bool:
    return proc is not None and proc.poll() is None


@dataclass(eq=False)
class GaleraNode:
    """One ``mariadbd`` of the cluster."""

    index: int
    host: str
    root: Path
    port: int
    gcomm_port: int
    ist_port: int
    sst_port: int
    cluster: GaleraCluster
    proc: subprocess.Popen[bytes] | None = None
    starts: int = 0
    #: Output of the server; a fresh file per start (``mysqld.<n>.log``).
    log_file: Path | None = None

    @property
    def datadir(self) -> Path:
        return self.root / "data"

    @property
    def socket(self) -> Path:
        return Path(self.cluster.sock_dir) / f"node{self.index}.sock"

    @property
    def pid(self) -> int | None:
        return self.proc.pid if self.proc is not None else None

    @property
    def gcomm(self) -> str:
        return f"{self.host}:{self.gcomm_port}"

    def dsn(self, database: str = "mysql") -> DSN:
        return DSN(user="root", password="", host=self.host, port=self.port, database=database)

    def alive(self) -> bool:
        return _alive(self.proc)

    def _command(self, *, bootstrap: bool, start_position: str | None) -> list[str]:
        c = self.cluster
        peers = ",".join(n.gcomm for n in c.nodes)
        options = ";".join([
            f"gmcast.listen_addr=tcp://{self.host}:{self.gcomm_port}",
            f"ist.recv_addr={self.host}:{self.ist_port}",
            "gcache.size=256M",
            # A lost node is declared dead within a few seconds (defaults: 5 s suspect, 15 s
            # inactive), so the others keep the primary component and its clients see a
            # short stall rather than a long one.
            "evs.suspect_timeout=PT3S",
            "evs.inactive_timeout=PT6S",
            "evs.install_timeout=PT6S",
            "pc.wait_prim_timeout=PT60S",
        ])  # fmt: skip
        cmd = [
            str(c.server),
            "--no-defaults",
            f"--datadir={self.datadir}",
            f"--socket={self.socket}",
            f"--port={self.port}",
            f"--bind-address={self.host}",
            f"--pid-file={self.root / 'mysqld.pid'}",
            f"--log-error={self.log_file}",
            "--character-set-server=utf8mb4",
            "--collation-server=utf8mb4_general_ci",
            "--skip-name-resolve",
            "--binlog-format=ROW",
            "--default-storage-engine=InnoDB",
            "--innodb-autoinc-lock-mode=2",
            "--innodb-flush-log-at-trx-commit=1",
            "--innodb-buffer-pool-size=128M",
            "--max-connections=400",
            "--wsrep-on=ON",
            f"--wsrep-provider={c.provider}",
            f"--wsrep-cluster-name={c.name}",
            f"--wsrep-cluster-address=gcomm://{peers}",
            f"--wsrep-node-name=node{self.index}",
            f"--wsrep-node-address={self.host}:{self.gcomm_port}",
            f"--wsrep-node-incoming-address={self.host}:{self.port}",
            f"--wsrep-sst-receive-address={self.host}:{self.sst_port}",
            "--wsrep-sst-method=rsync",
            f"--wsrep-provider-options={options}",
            f"--wsrep-slave-threads={c.slave_threads}",
            f"--wsrep-sync-wait={c.sync_wait}",
            *c.extra_args,
        ]
        if c.run_as:
            cmd.append(f"--user={c.run_as}")
        if bootstrap:
            cmd.append("--wsrep-new-cluster")
        if start_position:
            cmd.append(f"--wsrep-start-position={start_position}")
        return cmd

    def _recover_position(self) -> str | None:
        """After an unclean stop: ``uuid:seqno`` from InnoDB (``mariadbd --wsrep-recover``),
        so the node asks for IST from that point instead of a full SST."""
        if not (self.datadir / "ibdata1").exists():
            return None
        out = self.root / "recover.log"
        cmd = [a for a in self._command(bootstrap=False, start_position=None) if not a.startswith("--log-error")]
        cmd += ["--wsrep-recover", f"--log-error={out}"]
        proc = subprocess.Popen(cmd, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                                stderr=subprocess.DEVNULL, start_new_session=True)  # fmt: skip
        self.cluster.started_pids.add(proc.pid)
        try:
            proc.wait(RECOVER_TIMEOUT)
        except subprocess.TimeoutExpired:
            # A recovery that cannot finish (the machine is starved, or a leftover of the
            # killed server still holds a file): give up on IST and let the node ask for a
            # full state transfer, as a node with no recovered position does.
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, signal.SIGKILL)
            proc.wait(30)
            return None
        m = re.findall(r"Recovered position:\s*([0-9a-f-]{36}:-?\d+)", out.read_text(errors="replace")
                       if out.exists() else "")  # fmt: skip
        return m[-1] if m else None

    def _clean_stop_state(self) -> bool:
        """grastate.dat says the last stop was clean (a real seqno, not -1)."""
        g = self.datadir / "grastate.dat"
        if not g.exists():
            return False
        m = re.search(r"^seqno:\s*(-?\d+)", g.read_text(errors="replace"), re.M)
        return bool(m and int(m.group(1)) >= 0)

    def start(self, *, bootstrap: bool = False, wait: bool = True, timeout: float = START_TIMEOUT) -> None:
        """Start the server (joining the cluster; ``bootstrap``: as a new cluster of one)."""
        if self.alive():
            return
        self.root.mkdir(parents=True, exist_ok=True)
        self.datadir.mkdir(exist_ok=True)
        self.cluster.own(self.root)
        for stale in (self.root / "mysqld.pid", self.socket):
            with contextlib.suppress(FileNotFoundError):
                stale.unlink()
        position = None
        if self.starts and not self._clean_stop_state():
            position = self._recover_position()
        self.starts += 1
        self.log_file = self.root / f"mysqld.{self.starts}.log"
        self.proc = subprocess.Popen(
            self._command(bootstrap=bootstrap, start_position=position),
            stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
            start_new_session=True,
        )  # fmt: skip
        self.cluster.started_pids.add(self.proc.pid)
        if wait:
            self.wait_synced(timeout)

    def wait_synced(self, timeout: float = START_TIMEOUT) -> None:
        """Until the node answers, is Synced and in the primary component."""
        deadline = time.monotonic() + timeout
        last: Any = None
        while time.monotonic() < deadline:
            if not self.alive():
                donors = "\n".join(f"--- node{n.index}:\n{n.log_tail(12)}" for n in self.cluster.nodes
                                   if n is not self and n.alive())  # fmt: skip
                raise RuntimeError(f"node{self.index} exited during start-up:\n{self.log_tail()}\n{donors}")
            try:
                st = self.status()
                last = st
                if st.get("wsrep_local_state_comment") == "Synced" and st.get("wsrep_cluster_status") == "Primary":
                    return
            except pymysql.MySQLError as exc:
                last = exc
            time.sleep(0.3)
        raise RuntimeError(f"node{self.index} not synced after {timeout:.0f} s ({last}):\n{self.log_tail()}")

    def status(self) -> dict[str, str]:
        """The node's wsrep status variables (a direct connection; works while non-primary)."""
        conn = pymysql.connect(connect_timeout=3, read_timeout=10, **self.dsn().connect_kwargs(with_database=False))
        try:
            with conn.cursor() as cur:
                cur.execute("SHOW GLOBAL STATUS LIKE 'wsrep%%'")
                return {k: str(v) for k, v in cur.fetchall()}
        finally:
            conn.close()

    def set_global(self, assignment: str) -> None:
        """``SET GLOBAL`` on this private node (never on the shared server)."""
        conn = pymysql.connect(connect_timeout=3, read_timeout=30, **self.dsn().connect_kwargs(with_database=False))
        try:
            with conn.cursor() as cur:
                cur.execute(f"SET GLOBAL {assignment}")
        finally:
            conn.close()

    def kill(self, sig: int = signal.SIGKILL) -> None:
        """Signal the server (SIGKILL: a crash) and reap it."""
        if not self.alive():
            return
        assert self.proc is not None
        with contextlib.suppress(ProcessLookupError):
            os.kill(self.proc.pid, sig)
        try:
            self.proc.wait(STOP_GRACE if sig != signal.SIGKILL else 30)
        except subprocess.TimeoutExpired:
            os.kill(self.proc.pid, signal.SIGKILL)
            self.proc.wait(30)
        # The server runs in a process group of its own: what it started (a state-transfer
        # script and its rsync or mariabackup) dies with it, as on a machine that crashed,
        # instead of holding the data directory while the node restarts.
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(self.proc.pid, signal.SIGKILL)

    def stop(self) -> None:
        """A clean shutdown (SIGTERM, SIGKILL after a grace period)."""
        self.kill(signal.SIGTERM)

    def log_tail(self, lines: int = 25) -> str:
        if self.log_file is None or not self.log_file.exists():
            return ""
        return "\n".join(self.log_file.read_text(errors="replace").splitlines()[-lines:])


# --------------------------------------------------------------------------------------------
# The cluster


@dataclass(eq=False)
class GaleraCluster:
    """``size`` Galera nodes under ``root``; a context manager that stops them at exit."""

    root: Path
    size: int = 3
    name: str = CLUSTER_NAME
    sync_wait: int = 1
    slave_threads: int = 2
    extra_args: Sequence[str] = ()
    keep: bool = field(default_factory=lambda: os.environ.get("ORBIT_CLUSTER_KEEP") == "1")
    nodes: list[GaleraNode] = field(default_factory=list)
    started_pids: set[int] = field(default_factory=set)
    partitioned: dict[int, str] = field(default_factory=dict)  # node -> "iptables" | "isolate"
    server: str = ""
    provider: Path = Path()
    #: The account the servers run as: ``mysql`` when we are root (the rsync daemon of a
    #: state transfer drops root privileges to ``nobody`` otherwise and cannot write the
    #: data folder), else the current user.
    run_as: str | None = None
    sock_dir: str = ""
    _rules: list[list[str]] = field(default_factory=list)
    _iptables: str | None = None

    def __post_init__(self) -> None:
        self.root = Path(self.root).resolve()
        self.provider = ensure_galera()
        self.server = _which("mariadbd") or "mariadbd"
        self.root.mkdir(parents=True, exist_ok=True)
        if os.geteuid() == 0:
            self.run_as = "mysql" if _user_exists("mysql") else "root"
        # Unix socket paths are short (108 bytes): keep them in a short folder.
        self.sock_dir = tempfile.mkdtemp(prefix="orbit-galera-")
        self.own(Path(self.sock_dir))
        self.root = server_folder(self.root, self.run_as)
        k = _address_block()
        for i in range(self.size):
            host = f"127.0.{k}.{i + 1}"
            ports = [_free_port(host) for _ in range(4)]
            self.nodes.append(GaleraNode(i, host, self.root / f"node{i}", *ports, cluster=self))

    def own(self, path: Path) -> None:
        """Give ``path`` (recursively) to the server account."""
        if self.run_as and self.run_as != "root":
            shutil.chown(path, self.run_as, self.run_as)
            for p in path.rglob("*"):
                with contextlib.suppress(FileNotFoundError):
                    shutil.chown(p, self.run_as, self.run_as)

    # -- life cycle ---------------------------------------------------------------------

    def start(self, timeout: float = START_TIMEOUT) -> GaleraCluster:
        """Initialise node 0, bootstrap the cluster on it, join the others (SST)."""
        first = self.nodes[0]
        first.root.mkdir(parents=True, exist_ok=True)
        self.own(first.root)
        install = [str(_which("mariadb-install-db")), "--no-defaults", f"--datadir={first.datadir}",
                   "--auth-root-authentication-method=normal", "--skip-test-db"]  # fmt: skip
        if self.run_as:
            install.append(f"--user={self.run_as}")
        r = subprocess.run(install, capture_output=True, text=True, timeout=300, check=False)
        if r.returncode != 0:
            raise RuntimeError(f"mariadb-install-db failed: {r.stdout}{r.stderr}")
        first.start(bootstrap=True, timeout=timeout)
        # The root account answers on every node address (install-db made root@localhost,
        # root@127.0.0.1 and root@::1 only); the grant replicates to the joiners with SST.
        self.execute(0, "CREATE USER IF NOT EXISTS 'root'@'%' IDENTIFIED BY ''")
        self.execute(0, "GRANT ALL PRIVILEGES ON *.* TO 'root'@'%' WITH GRANT OPTION")
        for n in self.nodes[1:]:
            n.start(timeout=timeout)  # one joiner at a time: the donor serves one SST
        self.wait_size(self.size, timeout)
        return self

    def stop(self) -> None:
        """Heal every partition, stop every node (cleanly, then by SIGKILL), remove the
        folder unless ``keep``."""
        self.heal_all()
        for n in reversed(self.nodes):
            with contextlib.suppress(Exception):
                n.stop()
        for n in self.nodes:
            if n.alive():
                n.kill()
        for pid in self.started_pids:  # a recovery run or a node whose Popen was replaced
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.kill(pid, 0)
                os.kill(pid, signal.SIGKILL)
        shutil.rmtree(self.sock_dir, ignore_errors=True)
        if not self.keep:
            shutil.rmtree(self.root, ignore_errors=True)

    def __enter__(self) -> GaleraCluster:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    # -- queries -------------------------------------------------------------------------

    def execute(self, node: int, sql: str, args: Any = None, database: str | None = None) -> list[tuple[Any, ...]]:
        kw = self.nodes[node].dsn(database or "mysql").connect_kwargs(with_database=database is not None)
        conn = pymysql.connect(autocommit=True, connect_timeout=5, read_timeout=60, **kw)
        try:
            with conn.cursor() as cur:
                cur.execute(sql, args)
                return list(cur.fetchall())
        finally:
            conn.close()

    def create_database(self, name: str, node: int = 0) -> None:
        self.execute(node, f"CREATE DATABASE IF NOT EXISTS `{name}` CHARACTER SET utf8mb4 COLLATE utf8mb4_bin")

    def dsns(self, database: str) -> list[DSN]:
        return [n.dsn(database) for n in self.nodes]

    def wait_size(self, size: int, timeout: float = START_TIMEOUT, nodes: Sequence[int] | None = None) -> None:
        """Until every node of ``nodes`` (default: the live ones) is Synced in a primary
        component of ``size`` members."""
        deadline = time.monotonic() + timeout
        want = [self.nodes[i] for i in nodes] if nodes is not None else [n for n in self.nodes if n.alive()]
        last: Any = None
        while time.monotonic() < deadline:
            try:
                sts = [n.status() for n in want]
                last = [(s.get("wsrep_cluster_size"), s.get("wsrep_local_state_comment"),
                         s.get("wsrep_cluster_status")) for s in sts]  # fmt: skip
                if all(s == (str(size), "Synced", "Primary") for s in last):
                    return
            except pymysql.MySQLError as exc:
                last = exc
            time.sleep(0.3)
        raise RuntimeError(f"cluster not at size {size} after {timeout:.0f} s: {last}")

    def status(self) -> list[dict[str, str] | None]:
        out: list[dict[str, str] | None] = []
        for n in self.nodes:
            try:
                out.append(n.status() if n.alive() else None)
            except pymysql.MySQLError:
                out.append(None)
        return out

    def counters(self) -> dict[str, int]:
        """Cluster-wide totals of the conflict counters (certification failures, brute-force
        aborts) over the live nodes — since each node's last start."""
        tot: dict[str, int] = {"wsrep_local_cert_failures": 0, "wsrep_local_bf_aborts": 0}
        for st in self.status():
            for k in tot:
                if st is not None:
                    tot[k] += int(st.get(k, "0") or 0)
        return tot

    # -- faults --------------------------------------------------------------------------

    def restart(self, node: int, *, sig: int = signal.SIGKILL, down_s: float = 2.0,
                timeout: float = START_TIMEOUT) -> dict[str, Any]:  # fmt: skip
        """Kill (or stop) a node, wait ``down_s``, start it again; it rejoins by IST when
        the others' gcache still holds what it missed. Returns how it rejoined."""
        n = self.nodes[node]
        n.kill(sig)
        time.sleep(down_s)
        t0 = time.monotonic()
        n.start(timeout=timeout)
        text = n.log_file.read_text(errors="replace") if n.log_file else ""
        how = "ist" if re.search(r"IST received|Receiving IST|async IST", text) else (
            "sst" if "SST" in text and "Requesting state transfer" in text else "unknown")  # fmt: skip
        return {"node": node, "signal": int(sig), "rejoin_s": round(time.monotonic() - t0, 2), "transfer": how}

    def partition(self, node: int) -> str:
        """Cut ``node`` off from the other nodes (group communication, IST, SST); its
        clients still reach it. Returns the method used ("iptables" or "isolate")."""
        if node in self.partitioned:
            return self.partitioned[node]
        if self._iptables is None:
            self._iptables = ensure_iptables() or ""
        n = self.nodes[node]
        if self._iptables:
            # Each node's group, IST and SST sockets use its own address at both ends (its
            # outgoing connections too), so two rules per peer cut exactly the links
            # between the nodes; client connections (from 127.0.0.1) are untouched.
            rules: list[list[str]] = []
            for other in self.nodes:
                if other is not n:
                    rules.append(["-s", other.host, "-d", n.host])
                    rules.append(["-s", n.host, "-d", other.host])
            for r in rules:
                self._ipt("-I", ["INPUT", "-i", "lo", *r, "-j", "DROP"])
                self._rules.append(["INPUT", "-i", "lo", *r, "-j", "DROP"])
            method = "iptables"
        else:
            n.set_global("wsrep_provider_options = 'gmcast.isolate=1'")
            method = "isolate"
        self.partitioned[node] = method
        return method

    def heal(self, node: int) -> None:
        """Undo :meth:`partition` of ``node`` (it rejoins and catches up by IST)."""
        method = self.partitioned.pop(node, None)
        if method == "iptables":
            n = self.nodes[node]
            keep = []
            for r in self._rules:
                if n.host in r:
                    self._ipt("-D", r, check=False)
                else:
                    keep.append(r)
            self._rules = keep
        elif method == "isolate" and self.nodes[node].alive():
            with contextlib.suppress(pymysql.MySQLError):
                self.nodes[node].set_global("wsrep_provider_options = 'gmcast.isolate=0'")

    def heal_all(self) -> None:
        for node in list(self.partitioned):
            self.heal(node)
        for r in self._rules:  # anything left (a failed heal)
            self._ipt("-D", r, check=False)
        self._rules = []

    def _ipt(self, op: str, rule: list[str], check: bool = True) -> None:
        assert self._iptables
        # Every rule names this cluster's own 127.0.<k>.x addresses: nothing else is touched.
        assert all(not a.startswith("127.0.0.") for a in rule if a.count(".") == 3)
        r = subprocess.run([self._iptables, "-w", op, *rule], capture_output=True, text=True, timeout=30, check=False)
        if check and r.returncode != 0:
            raise RuntimeError(f"iptables {op} {' '.join(rule)}: {r.stderr}")


@contextlib.contextmanager
def galera_cluster(root: Path | None = None, size: int = 3, **kw: Any) -> Iterator[GaleraCluster]:
    """A started cluster under ``root`` (a temporary folder by default), stopped at exit."""
    tmp = root or Path(tempfile.mkdtemp(prefix="orbit-galera-cluster-"))
    c = GaleraCluster(tmp, size=size, **kw)
    try:
        c.start()
        yield c
    finally:
        c.stop()
        if root is None and not c.keep:
            shutil.rmtree(tmp, ignore_errors=True)


def require_galera() -> None:
    """Skip the calling test when this machine cannot run a cluster (pytest only)."""
    import pytest

    why = probe()
    if why is not None:
        pytest.skip(f"no Galera here: {why}")


def probe() -> str | None:
    """None when a cluster can run here, else why not."""
    try:
        ensure_galera()
    except GaleraUnavailable as exc:
        return str(exc)
    return None


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    sub = p.add_subparsers(dest="cmd", required=True)
    up = sub.add_parser("up", help="start a cluster, print its DSNs, stop it on Ctrl-C / SIGTERM")
    up.add_argument("--nodes", type=int, default=3)
    up.add_argument("--root", type=Path, default=None)
    up.add_argument("--database", default="orbit")
    up.add_argument("--migrate", action="store_true", help="run orbit-migrate up through node 0")
    sub.add_parser("probe", help="exit 0 when a cluster can run on this machine")
    args = p.parse_args(argv)
    if args.cmd == "probe":
        why = probe()
        print(why or f"ok: {provider_path()}")
        return 0 if why is None else 1
    stop = False

    def _term(*_: object) -> None:
        nonlocal stop
        stop = True

    signal.signal(signal.SIGTERM, _term)
    with galera_cluster(args.root, args.nodes) as c:
        c.create_database(args.database)
        if args.migrate:
            from orbit import migrate

            migrate.up(c.nodes[0].dsn(args.database))
        for n in c.nodes:
            print(f"node{n.index}: {n.dsn(args.database).url()}  (pid {n.pid}, data {n.datadir})", flush=True)
        try:
            while not stop:
                time.sleep(0.5)
        except KeyboardInterrupt:
            pass
    return 0


if __name__ == "__main__":
    sys.exit(main())
