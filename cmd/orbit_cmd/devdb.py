"""A private MariaDB/MySQL server for ``orbit-server --dev``
(the host side, binaries and processes, is :mod:`orbit_cmd.devdb_host`).

:func:`ensure_dev_database` answers "where is my database?" for a developer's laptop: if a
server answers at the configured DSN it returns ``None`` (use that one). Otherwise it starts a
private server from the installed binaries (``mariadbd`` or ``mysqld``), as the current user,
with its own data folder, unix socket and a free TCP port on 127.0.0.1, and returns a
:class:`DevDatabase` whose ``dsn`` points at it and whose ``stop()`` shuts it down cleanly.

Layout of the data folder (default ``.orbit/mysql``)::

    data/            the server's datadir (initialised once, reused on every later start)
    initialised      marker written after initialisation succeeded (no marker: initialise again)
    mysqld.log       the server's error log; install-db.log holds the initialisation output
    mysqld.pid       written by the server while it runs
    mysqld.sock      the unix socket (in a short folder under $TMPDIR when this path is too long)
    port             the last TCP port, reused when it is still free
    .lock            held while a process starts or adopts the server

A server left running by a previous process (``orbit-server`` killed with SIGKILL) is found by
its ``--datadir`` argument and *adopted* when it answers, else stopped; a stale pid file or
socket left by a crash is removed before starting. ``python -m orbit_cmd.devdb status|stop|reset``
inspects, stops or deletes the private database (docs/operations-dev.md).
"""

from __future__ import annotations

import asyncio
import contextlib
import errno
import fcntl
import hashlib
import logging
import os
import shutil
import sys
import tempfile
import time
from collections.abc import AsyncIterator, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import pymysql

from orbit.storage.dsn import DSN
from orbit_cmd.devdb_host import (
    BIND_ERRORS,
    CHILDREN,
    DEFAULT_DATA_DIR,
    MAX_SOCKET_PATH,
    START_TIMEOUT,
    STOP_TIMEOUT,
    DevDatabaseError,
    ServerBinaries,
    alive,
    arg_value,
    cmdline,
    dev_dsn_default,
    find_server_binaries,
    free_port,
    log_tail,
    ping,
    port_free,
    pymysql_kwargs,
    run_as_root,
    run_logged,
    server_reachable,
    servers_on,
    spawn,
    stop_pid,
)

__all__ = [
    "DEFAULT_DATA_DIR",
    "DevDatabase",
    "DevDatabaseError",
    "ServerBinaries",
    "dev_dsn_default",
    "ensure_dev_database",
    "find_server_binaries",
    "server_reachable",
    "start_dev_database",
    "stop_dev_database",
]

log = logging.getLogger("orbit.devdb")


# --------------------------------------------------------------------------------------------
# The running server


@dataclass(eq=False)
class DevDatabase:
    """A private server started (or adopted) by :func:`ensure_dev_database`.

    ``dsn`` reaches it over TCP on 127.0.0.1 as root with no password; ``socket`` is its unix
    socket. ``adopted`` is True when it was already running (left by an earlier process).
    ``stop()``/``stop_sync()`` shut it down cleanly and may be called more than once.
    """

    dsn: DSN
    data_dir: Path
    socket: Path
    log_file: Path
    pid: int
    adopted: bool = False
    _stopped: bool = field(default=False, repr=False)

    @property
    def running(self) -> bool:
        """The server process is alive."""
        return not self._stopped and alive(self.pid)

    async def stop(self, grace: float = STOP_TIMEOUT) -> None:
        """Shut the server down: SIGTERM, wait up to ``grace`` seconds, then SIGKILL.

        Runs in a thread; cancelling the caller does not interrupt the shutdown.
        """
        await asyncio.to_thread(self.stop_sync, grace)

    def stop_sync(self, grace: float = STOP_TIMEOUT) -> None:
        """:meth:`stop` for code without an event loop (``finally`` after ``asyncio.run``, atexit)."""
        if self._stopped:
            return
        stop_pid(self.pid, grace)
        self._stopped = True
        log.info("dev database stopped (%s)", self.data_dir)


# --------------------------------------------------------------------------------------------
# Starting


@dataclass(frozen=True, slots=True)
class _Layout:
    root: Path

    @property
    def datadir(self) -> Path:
        return self.root / "data"

    @property
    def marker(self) -> Path:
        return self.root / "initialised"

    @property
    def log_file(self) -> Path:
        return self.root / "mysqld.log"

    @property
    def install_log(self) -> Path:
        return self.root / "install-db.log"

    @property
    def pid_file(self) -> Path:
        return self.root / "mysqld.pid"

    @property
    def port_file(self) -> Path:
        return self.root / "port"

    @property
    def lock_file(self) -> Path:
        return self.root / ".lock"

    @property
    def socket(self) -> Path:
        path = self.root / "mysqld.sock"
        if len(os.fsencode(path)) <= MAX_SOCKET_PATH:
            return path
        tag = hashlib.sha256(os.fsencode(self.root)).hexdigest()[:12]
        return Path(tempfile.gettempdir()) / f"orbit-devdb-{os.getuid()}-{tag}" / "mysqld.sock"


def _socket_dsn(sock: Path, database: str) -> DSN:
    return DSN(user="root", password="", database=database, unix_socket=str(sock))


def _query_one(dsn: DSN, sql: str, *, with_database: bool = False) -> object:
    conn = pymysql.connect(connect_timeout=5, **pymysql_kwargs(dsn, with_database=with_database))
    try:
        with conn.cursor() as cur:
            cur.execute(sql)
            row = cur.fetchone()
            return row[0] if row else None
    finally:
        conn.close()


def _choose_port(layout: _Layout) -> int:
    with contextlib.suppress(OSError, ValueError):
        port = int(layout.port_file.read_text().strip())
        if 1024 <= port < 65536 and port_free(port):
            return port
    return free_port()


async def _initialise(bins: ServerBinaries, layout: _Layout, deadline: float) -> None:
    """Create a fresh datadir with root@localhost/127.0.0.1 and no password."""
    # A datadir without the marker is a half-done earlier initialisation.
    await asyncio.to_thread(shutil.rmtree, layout.datadir, ignore_errors=True)
    user = ["--user=root"] if run_as_root() else []
    if bins.install_db is not None:
        cmd = [
            str(bins.install_db),
            "--no-defaults",
            f"--datadir={layout.datadir}",
            "--auth-root-authentication-method=normal",
            "--skip-test-db",
            *user,
        ]
    else:
        cmd = [
            str(bins.server),
            "--no-defaults",
            "--initialize-insecure",
            f"--datadir={layout.datadir}",
            *user,
        ]
    log.info("initialising the dev database in %s", layout.datadir)
    rc = await run_logged(cmd, layout.install_log, deadline)
    if rc != 0:
        raise DevDatabaseError(
            f"{Path(cmd[0]).name} failed with exit code {rc} (log: {layout.install_log}):\n"
            + log_tail(layout.install_log)
        )
    await asyncio.to_thread(layout.marker.write_text, bins.version + "\n")


def _server_command(bins: ServerBinaries, layout: _Layout, port: int) -> list[str]:
    cmd = [
        str(bins.server),
        "--no-defaults",  # must come first: no /etc/mysql, no ~/.my.cnf
        f"--datadir={layout.datadir}",
        f"--socket={layout.socket}",
        f"--port={port}",
        "--bind-address=127.0.0.1",
        f"--pid-file={layout.pid_file}",
        f"--log-error={layout.log_file}",
        "--character-set-server=utf8mb4",
        "--collation-server=utf8mb4_general_ci",
    ]
    if bins.flavor == "mariadb":
        cmd.append("--skip-name-resolve")  # root@127.0.0.1 exists; no DNS look-ups
    else:
        cmd += ["--mysqlx=OFF", "--skip-log-bin"]  # no second port; no binlog (trigger rules)
    if run_as_root():
        cmd.append("--user=root")
    return cmd


def _clear_stale(layout: _Layout) -> None:
    sock = layout.socket
    for path in (layout.pid_file, sock, sock.with_name(sock.name + ".lock")):
        with contextlib.suppress(FileNotFoundError):
            path.unlink()


async def _wait_answering(dsn: DSN, deadline: float, alive: Iterator[bool]) -> bool:
    """Poll ``dsn`` until it answers (True), the process dies or the deadline passes (False)."""
    while time.monotonic() < deadline:
        if await asyncio.to_thread(ping, dsn, 1.0):
            return True
        if not next(alive):
            return False
        await asyncio.sleep(0.1)
    return False


def _alive_iter(pid: int) -> Iterator[bool]:
    while True:
        yield alive(pid)


async def _adopt_or_stop_running(layout: _Layout, database: str) -> DevDatabase | None:
    """A server already running from this datadir: adopt it when it answers, else stop it."""
    for pid in servers_on(layout.datadir):
        args = cmdline(pid)
        sock = Path(arg_value(args, "socket") or layout.socket)
        sdsn = _socket_dsn(sock, database)
        if await _wait_answering(sdsn, time.monotonic() + 3.0, _alive_iter(pid)):
            port = int(str(await asyncio.to_thread(_query_one, sdsn, "SELECT @@port")))
            log.info("adopting the dev database already running from %s (pid %d)", layout.root, pid)
            return DevDatabase(
                dsn=DSN(user="root", password="", host="127.0.0.1", port=port, database=database),
                data_dir=layout.root,
                socket=sock,
                log_file=layout.log_file,
                pid=pid,
                adopted=True,
            )
        log.warning("stopping a dev database that does not answer (pid %d)", pid)
        await asyncio.to_thread(stop_pid, pid, STOP_TIMEOUT)
    return None


@contextlib.asynccontextmanager
async def _locked(layout: _Layout, deadline: float) -> AsyncIterator[None]:
    """Hold an exclusive flock on the data folder (two processes never start it at once)."""
    fd = os.open(layout.lock_file, os.O_RDWR | os.O_CREAT, 0o600)
    try:
        while True:
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                break
            except OSError as exc:
                if exc.errno not in (errno.EAGAIN, errno.EACCES):
                    raise
                if time.monotonic() >= deadline:
                    raise DevDatabaseError(
                        f"another process holds {layout.lock_file} (starting the dev database?)"
                    ) from None
                await asyncio.sleep(0.1)
        yield
    finally:
        os.close(fd)  # releases the lock


def _prepare(data_dir: Path) -> _Layout:
    layout = _Layout(Path(data_dir).resolve())
    layout.root.mkdir(parents=True, exist_ok=True)
    layout.socket.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
    return layout


def _before_start(layout: _Layout) -> tuple[int, int]:
    """Remove a crash's leftovers; return (port to use, current size of the log)."""
    _clear_stale(layout)
    size = layout.log_file.stat().st_size if layout.log_file.exists() else 0
    return _choose_port(layout), size


async def start_dev_database(
    data_dir: Path = DEFAULT_DATA_DIR,
    *,
    database: str = "orbit",
    start_timeout: float = START_TIMEOUT,
    binaries: ServerBinaries | None = None,
) -> DevDatabase:
    """Start (or adopt) the private server of ``data_dir`` and create ``database`` in it.

    Initialises the data folder on first use (a few seconds); later starts reuse it. Waits
    at most ``start_timeout`` seconds for initialisation plus start-up. Raises
    :class:`DevDatabaseError` (with the end of the server's log) when it cannot.
    """
    deadline = time.monotonic() + start_timeout
    bins: ServerBinaries = (
        binaries if binaries is not None else await asyncio.to_thread(find_server_binaries)
    )
    layout = await asyncio.to_thread(_prepare, data_dir)
    async with _locked(layout, deadline):
        dev = await _adopt_or_stop_running(layout, database)
        if dev is None:
            if not await asyncio.to_thread(layout.marker.exists):
                await _initialise(bins, layout, deadline)
            dev = await _start_server(bins, layout, database, deadline)
        try:
            await asyncio.to_thread(
                _query_one,
                _socket_dsn(dev.socket, database),
                f"CREATE DATABASE IF NOT EXISTS `{database.replace('`', '``')}`"
                " CHARACTER SET utf8mb4 COLLATE utf8mb4_bin",
            )
            # The DSN we hand out goes over TCP: prove that it works.
            await asyncio.to_thread(_query_one, dev.dsn, "SELECT 1", with_database=True)
        except BaseException as exc:
            if not dev.adopted:
                await asyncio.shield(dev.stop(grace=10))
            if isinstance(exc, pymysql.err.MySQLError):
                raise DevDatabaseError(
                    f"the dev database started but does not accept {dev.dsn}: {exc}"
                ) from exc
            raise
    return dev


async def _start_server(
    bins: ServerBinaries, layout: _Layout, database: str, deadline: float
) -> DevDatabase:
    for _attempt in range(3):
        port, log_start = await asyncio.to_thread(_before_start, layout)
        cmd = _server_command(bins, layout, port)
        log.info("starting the dev database: %s", " ".join(cmd))
        # Own session: a Ctrl-C in the terminal reaches orbit-server, which stops us cleanly.
        proc = spawn(cmd, None)
        CHILDREN[proc.pid] = proc
        dev = DevDatabase(
            dsn=DSN(user="root", password="", host="127.0.0.1", port=port, database=database),
            data_dir=layout.root,
            socket=layout.socket,
            log_file=layout.log_file,
            pid=proc.pid,
        )
        try:
            up = await _wait_answering(
                _socket_dsn(layout.socket, database), deadline, _alive_iter(proc.pid)
            )
        except BaseException:
            await asyncio.shield(dev.stop(grace=10))
            raise
        if up:
            await asyncio.to_thread(layout.port_file.write_text, f"{port}\n")
            log.info(
                "dev database ready at %s (pid %d, data in %s)", dev.dsn, dev.pid, dev.data_dir
            )
            return dev
        tail = await asyncio.to_thread(log_tail, layout.log_file, log_start)
        if alive(proc.pid):
            await dev.stop(grace=10)
            raise DevDatabaseError(
                f"the dev database did not answer in time (log: {layout.log_file}):\n{tail}"
            )
        if any(marker in tail for marker in BIND_ERRORS) and time.monotonic() < deadline:
            log.warning("port %d was taken; trying another", port)
            await asyncio.to_thread(layout.port_file.unlink, missing_ok=True)
            continue
        raise DevDatabaseError(
            f"{bins.server.name} exited with code {proc.returncode} during start-up "
            f"(log: {layout.log_file}):\n{tail}"
        )
    raise DevDatabaseError(
        f"could not get a free TCP port for the dev database ({layout.log_file})"
    )


async def ensure_dev_database(
    dsn: DSN,
    *,
    data_dir: Path = DEFAULT_DATA_DIR,
    start_timeout: float = START_TIMEOUT,
) -> DevDatabase | None:
    """``None`` when a server answers at ``dsn`` (use it); else a private server's :class:`DevDatabase`.

    The private server's database is named like ``dsn``'s (``orbit`` by default). Raises
    :class:`DevDatabaseError` when no server binary is installed (saying how to install one)
    or when the private server cannot start within ``start_timeout`` seconds.
    """
    if await server_reachable(dsn):
        return None
    log.info("no database answers at %s: starting a private one in %s", dsn, data_dir)
    return await start_dev_database(data_dir, database=dsn.database, start_timeout=start_timeout)


def stop_dev_database(data_dir: Path = DEFAULT_DATA_DIR, grace: float = STOP_TIMEOUT) -> int:
    """Stop every server running from ``data_dir`` (e.g. left by a killed run); return how many."""
    layout = _Layout(Path(data_dir).resolve())
    pids = servers_on(layout.datadir)
    for pid in pids:
        stop_pid(pid, grace)
    return len(pids)


# --------------------------------------------------------------------------------------------
# python -m orbit_cmd.devdb status|stop|reset [DATA_DIR]


def _main(argv: Sequence[str]) -> int:
    usage = "usage: python -m orbit_cmd.devdb status|stop|reset [DATA_DIR]  (default .orbit/mysql)"
    if not argv or argv[0] not in ("status", "stop", "reset") or len(argv) > 2:
        print(usage, file=sys.stderr)
        return 2
    layout = _Layout(Path(argv[1] if len(argv) > 1 else DEFAULT_DATA_DIR).resolve())
    if argv[0] == "status":
        pids = servers_on(layout.datadir)
        state = f"running (pid {', '.join(map(str, pids))})" if pids else "not running"
        init = "initialised" if layout.marker.exists() else "not initialised"
        print(f"{layout.root}: {init}, {state}")
        return 0
    stopped = stop_dev_database(layout.root)
    print(f"stopped {stopped} server(s) running from {layout.root}")
    if argv[0] == "reset":
        _clear_stale(layout)
        if layout.socket.parent != layout.root:
            shutil.rmtree(layout.socket.parent, ignore_errors=True)
        if layout.root.exists():
            shutil.rmtree(layout.root)
        print(f"deleted {layout.root}")
    return 0


if __name__ == "__main__":
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    sys.exit(_main(sys.argv[1:]))
