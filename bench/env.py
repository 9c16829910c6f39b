"""The bench's environment: a scratch database, the real server process, worker processes,
and what the machine is (cores, memory, versions, load)."""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import platform
import secrets
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import pymysql

from orbit.storage import DSN

ROOT = Path(__file__).resolve().parents[1]
#: The database server ``--dsn shared`` means (the box's MariaDB).
DEFAULT_SERVER_DSN = os.environ.get("ORBIT_BENCH_DSN") or os.environ.get(
    "ORBIT_TEST_DSN", "mysql://root@127.0.0.1:3306/mysql"
)
#: Where unpublished runs write (ignored by git); ``--publish`` writes to reports/.
RUNS_DIR = ROOT / ".orbit" / "bench"


@dataclass
class DbServer:
    """The MariaDB server this run uses: its URL, its process (for CPU), whether only the
    bench uses it (its status counters are then the bench's alone) and whether it writes a
    ROW binary log (the ledger's index entries)."""

    url: str
    pid: int | None = None
    exclusive: bool = False
    binlog: bool = False
    kind: str = "shared"

    @property
    def dsn(self) -> DSN:
        return DSN.parse(self.url)

    def use(self, url: str, *, pid: int | None, exclusive: bool, binlog: bool, kind: str) -> None:
        """Point the run at another server (in place: modules hold this object)."""
        self.url, self.pid, self.exclusive, self.binlog, self.kind = (
            url, pid, exclusive, binlog, kind)  # fmt: skip


def server_pid(url: str) -> int | None:
    """The pid of the server at ``url`` (its pid file, else ``pidof``), when it runs here."""
    with contextlib.suppress(Exception):
        conn = pymysql.connect(**DSN.parse(url).connect_kwargs(with_database=False))
        try:
            with conn.cursor() as cur:
                cur.execute("SELECT @@pid_file")
                return int(Path(str(cur.fetchone()[0])).read_text().strip())
        finally:
            conn.close()
    out = subprocess.run(["pidof", "mariadbd", "mysqld"], capture_output=True, text=True)
    pids = [int(p) for p in out.stdout.split()]
    return pids[0] if len(pids) == 1 else None


#: Set by ``python -m bench`` before anything runs (bench/run.py).
DB = DbServer(DEFAULT_SERVER_DSN)


def tree_command(tree: Path | None, script: str, module: str) -> list[str]:
    """How to run the console script ``script`` (``module:main``) of ``tree`` (None: this
    tree's installed script)."""
    if tree is None:
        return [_tool(script)]
    paths = [str(tree), str(tree / "cmd"), str(tree / "sdk" / "python")]
    boot = f"import sys; sys.path[:0] = {paths!r}; from {module} import main; sys.exit(main())"
    return [sys.executable, "-c", boot]
#: Where ``bench/install-peers`` puts PgQueuer, Procrastinate, py-spy (never the main env).
PEERS_DIR = Path(os.environ.get("ORBIT_BENCH_PEERS", "/root/.cache/orbit-bench-peers"))


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _tool(name: str) -> str:
    """A console script: beside this interpreter (a virtualenv's bin/), else on PATH."""
    here = Path(sys.executable).parent / name
    if here.exists():
        return str(here)
    found = shutil.which(name)
    return found or name


class ScratchDatabase:
    """``orbit_bench_<hex>`` on the server of ``server_dsn``, dropped by :meth:`drop`."""

    def __init__(self, server_dsn: str | None = None, prefix: str = "orbit_bench",
                 tree: Path | None = None) -> None:  # fmt: skip
        self.server = DSN.parse(server_dsn or DB.url)
        self.name = f"{prefix}_{secrets.token_hex(4)}"
        self.dsn = self.server.with_database(self.name)
        #: Migrate and bootstrap with this checkout's code (None: this tree).
        self.tree = tree
        self._queue_index: str | None = None

    def url(self) -> str:
        return self.dsn.url(hide_password=False)

    def create(self) -> None:
        conn = pymysql.connect(autocommit=True, **self.server.connect_kwargs(with_database=False))
        try:
            with conn.cursor() as cur:
                cur.execute(
                    f"CREATE DATABASE `{self.name}` CHARACTER SET utf8mb4 COLLATE utf8mb4_bin"
                )
        finally:
            conn.close()

    def migrate(self) -> None:
        """``orbit-migrate up`` as an operator would run it."""
        subprocess.run(
            [*tree_command(self.tree, "orbit-migrate", "orbit_cmd.migrate"), "--dsn", self.url(),
             "up"],
            check=True,
            capture_output=True,
            cwd=ROOT,
        )

    def bootstrap(
        self, application: str, namespace: str, global_admin: bool = False
    ) -> dict[str, Any]:
        """``orbit admin bootstrap``: the JSON line it prints (``global_admin``: the key may
        also create applications — S5 creates its owners with it)."""
        out = subprocess.run(
            [
                *tree_command(self.tree, "orbit", "orbit_cmd.cli"),
                "admin",
                "bootstrap",
                "--application",
                application,
                "--namespace",
                namespace,
                *(["--global-admin"] if global_admin else []),
                "--dsn",
                self.url(),
            ],
            check=True,
            capture_output=True,
            cwd=ROOT,
            text=True,
        ).stdout
        return json.loads(out.strip().splitlines()[-1])  # type: ignore[no-any-return]

    def drop(self) -> None:
        with contextlib.suppress(Exception):
            conn = pymysql.connect(
                autocommit=True, **self.server.connect_kwargs(with_database=False)
            )
            try:
                with conn.cursor() as cur:
                    cur.execute(f"DROP DATABASE IF EXISTS `{self.name}`")
            finally:
                conn.close()

    def connect(self, *, unlogged: bool = False) -> pymysql.connections.Connection:
        """An autocommit connection; ``unlogged``: its writes stay out of the binary log (the
        bench's own bulk inserts, which the ledger must not read)."""
        conn = pymysql.connect(autocommit=True, **self.dsn.connect_kwargs())
        if unlogged and DB.binlog:
            with conn.cursor() as cur:
                cur.execute("SET SESSION sql_log_bin = 0")
        return conn

    async def queue_state_index(self) -> str:
        """The index of ``pulse_tasks`` that leads with (namespace_id, queue_id, state) in
        this database's schema, for the bench's counts: ``ix_pulse_tasks_fair``, or
        ``ix_pulse_tasks_dispatch`` in a tree from before migration 0018 (a
        ``--baseline-tree`` checkout)."""
        if self._queue_index is None:
            rows = await self.query(
                "SELECT DISTINCT index_name FROM information_schema.statistics"
                " WHERE table_schema = DATABASE() AND table_name = 'pulse_tasks'"
                " AND index_name IN ('ix_pulse_tasks_fair', 'ix_pulse_tasks_dispatch')"
            )
            names = {str(r[0]) for r in rows}
            fair = "ix_pulse_tasks_fair" in names
            self._queue_index = "ix_pulse_tasks_fair" if fair else "ix_pulse_tasks_dispatch"
        return self._queue_index

    async def query(self, sql: str, args: Any = None) -> list[tuple[Any, ...]]:
        """The rows of one statement on a fresh autocommit connection, run in a thread (the
        bench's own bookkeeping: never the server's pool)."""

        def run() -> list[tuple[Any, ...]]:
            conn = self.connect()
            try:
                with conn.cursor() as cur:
                    cur.execute(sql, args)
                    return list(cur.fetchall())
            finally:
                conn.close()

        return await asyncio.to_thread(run)


@dataclass
class ProcSample:
    rss_kb: int
    cpu_s: float
    at: float


def proc_sample(pid: int) -> ProcSample:
    """RSS and user+system CPU seconds of ``pid`` from /proc (Linux)."""
    rss = 0
    with contextlib.suppress(OSError):
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                rss = int(line.split()[1])
    cpu = 0.0
    with contextlib.suppress(OSError, IndexError, ValueError):
        stat = Path(f"/proc/{pid}/stat").read_text()
        fields = stat[stat.rindex(")") + 2 :].split()
        ticks = os.sysconf("SC_CLK_TCK")
        cpu = (int(fields[11]) + int(fields[12])) / ticks
    return ProcSample(rss, cpu, time.monotonic())


@dataclass
class Server:
    """The real ``orbit-server`` on a free port."""

    dsn_url: str
    port: int = field(default_factory=free_port)
    env: dict[str, str] = field(default_factory=dict)
    proc: subprocess.Popen[bytes] | None = None
    log_path: Path | None = None
    #: Serve the code of another checkout (``--server-tree``: e.g. a copy of the tree before a
    #: change, for a side-by-side run); None = this tree's installed ``orbit-server``.
    tree: Path | None = None

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    async def start(self, limit_s: float = 60.0) -> None:
        env = {**os.environ, **self.env}
        log = open(self.log_path or os.devnull, "ab")  # noqa: SIM115, ASYNC230 - for the child
        cmd = tree_command(self.tree, "orbit-server", "orbit_cmd.server")
        self.proc = subprocess.Popen(  # noqa: ASYNC220 - a long-lived child, not awaited
            [
                *cmd,
                "--dsn",
                self.dsn_url,
                "--port",
                str(self.port),
                "--log-level",
                "warning",
            ],
            cwd=ROOT,
            env=env,
            stdout=log,
            stderr=log,
        )
        deadline = time.monotonic() + limit_s
        async with httpx.AsyncClient() as client:
            while time.monotonic() < deadline:
                if self.proc.poll() is not None:
                    raise RuntimeError(f"orbit-server exited with {self.proc.returncode}")
                with contextlib.suppress(httpx.HTTPError):
                    r = await client.get(self.url + "/healthz", timeout=1.0)
                    if r.status_code == 200:
                        return
                await asyncio.sleep(0.1)
        raise RuntimeError("orbit-server did not become healthy")

    def sample(self) -> ProcSample:
        assert self.proc is not None
        return proc_sample(self.proc.pid)

    async def stop(self) -> None:
        if self.proc is None or self.proc.poll() is not None:
            return
        self.proc.send_signal(signal.SIGTERM)
        for _ in range(150):
            if self.proc.poll() is not None:
                return
            await asyncio.sleep(0.1)
        self.proc.kill()
        self.proc.wait()


class WorkerProcs:
    """SDK worker processes (``python -m bench.worker``) for one queue."""

    def __init__(self) -> None:
        self.procs: list[subprocess.Popen[bytes]] = []
        #: Each process's stderr goes to a temporary file, never a pipe: nobody reads a pipe
        #: while the run lasts, and a worker logging a warning per refused reconnect would
        #: fill it and block its whole event loop (every session of the process).
        self._logs: list[Any] = []

    def start(
        self,
        *,
        url: str,
        key: str,
        namespace: str,
        queue: str,
        processes: int,
        sessions: int,
        concurrency: int,
        env: dict[str, str] | None = None,
        targets: list[dict[str, str]] | None = None,
        stagger_s: float = 0.0,
    ) -> None:
        """``processes`` worker processes of ``sessions`` sessions each in ``namespace``; or,
        with ``targets`` (``{"key", "namespace"}`` per session), one session per target,
        the targets split evenly over the processes."""
        base = {"url": url, "key": key, "namespace": namespace, "queue": queue,
                "sessions": sessions, "concurrency": concurrency, "stagger_s": stagger_s}  # fmt: skip
        for i in range(processes):
            one = dict(base)
            if targets is not None:
                one["targets"] = targets[i::processes]
            args = json.dumps(one)
            log = tempfile.TemporaryFile()  # noqa: SIM115 - closed in stop()
            self._logs.append(log)
            self.procs.append(
                subprocess.Popen(
                    [sys.executable, "-m", "bench.worker", args],
                    cwd=ROOT,
                    env={**os.environ, **(env or {})},
                    stdout=subprocess.DEVNULL,
                    stderr=log,
                )
            )

    def pids(self) -> list[int]:
        return [p.pid for p in self.procs]

    async def stop(self) -> list[str]:
        """SIGTERM (drain), then kill after 15 s; the tail of each stderr."""
        for p in self.procs:
            if p.poll() is None:
                p.send_signal(signal.SIGTERM)
        tails: list[str] = []
        for p, log in zip(self.procs, self._logs, strict=True):
            for _ in range(150):
                if p.poll() is not None:
                    break
                await asyncio.sleep(0.1)
            if p.poll() is None:
                p.kill()
                p.wait()
            log.seek(max(0, log.seek(0, os.SEEK_END) - 2000))
            tails.append(log.read().decode(errors="replace"))
            log.close()
        self.procs = []
        self._logs = []
        return tails


def machine() -> dict[str, Any]:
    """Cores, memory, versions and load of this machine."""
    mem_kb = 0
    with contextlib.suppress(OSError):
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemTotal:"):
                mem_kb = int(line.split()[1])
    versions: dict[str, str | None] = {"python": platform.python_version()}
    for mod in ("aiomysql", "pymysql", "starlette", "uvicorn", "websockets", "msgspec", "uvloop"):
        try:
            from importlib.metadata import version

            versions[mod] = version(mod)
        except Exception:
            versions[mod] = None
    with contextlib.suppress(Exception):
        conn = pymysql.connect(**DB.dsn.connect_kwargs(with_database=False))
        with conn.cursor() as cur:
            cur.execute("SELECT VERSION()")
            versions["mariadb"] = cur.fetchone()[0]
            cur.execute("SELECT @@innodb_flush_log_at_trx_commit, @@sync_binlog, @@log_bin")
            flush, sync_binlog, log_bin = cur.fetchone()
            versions["innodb_flush_log_at_trx_commit"] = str(flush)
            versions["sync_binlog"] = str(sync_binlog)
            versions["log_bin"] = str(log_bin)
        conn.close()
    with contextlib.suppress(Exception):
        out = subprocess.run(
            ["psql", "-h", "127.0.0.1", "-U", "postgres", "-Atc", "SHOW server_version"],
            capture_output=True,
            text=True,
            timeout=5,
        )
        if out.returncode == 0:
            versions["postgresql"] = out.stdout.strip()
    return {
        "cores": os.cpu_count(),
        "memory_mb": mem_kb // 1024,
        "platform": platform.platform(),
        "load_avg": [round(x, 2) for x in os.getloadavg()],
        "versions": versions,
    }
