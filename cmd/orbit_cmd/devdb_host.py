"""The host side of the private dev database (:mod:`orbit_cmd.devdb`): finding the installed
server binaries, probing a DSN, free loopback ports, spawning server processes with their log,
and finding, signalling and stopping ``mariadbd``/``mysqld`` processes by their ``--datadir``."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import signal
import socket
import subprocess
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

import pymysql

from orbit.storage.dsn import DSN

log = logging.getLogger("orbit.devdb")

DEFAULT_DATA_DIR = Path(".orbit/mysql")
START_TIMEOUT = 60.0  # seconds for initialisation + start-up until the server answers
STOP_TIMEOUT = 30.0  # seconds after SIGTERM before SIGKILL
#: Where the binaries are looked for besides $PATH (a user's PATH often lacks the sbin folders).
SEARCH_DIRS = (
    "/usr/sbin",
    "/usr/local/sbin",
    "/usr/bin",
    "/usr/local/bin",
    "/usr/local/mysql/bin",
    "/usr/local/mariadb/bin",
    "/usr/libexec",
    "/opt/homebrew/bin",
    "/opt/homebrew/sbin",
)
INSTALL_HINT = (
    "install MariaDB (Debian/Ubuntu: `sudo apt-get install mariadb-server`, or run "
    "`sudo scripts/db-up`, which installs and starts the system server), or point "
    "--dsn / ORBIT_DSN at a server that is running"
)
MAX_SOCKET_PATH = 100  # sun_path holds 108 bytes; keep a margin
BIND_ERRORS = ("Bind on TCP/IP port", "Address already in use", "Do you already have another")


class DevDatabaseError(RuntimeError):
    """The private dev database could not be found, initialised or started; says why and what to do."""


@dataclass(frozen=True, slots=True)
class ServerBinaries:
    """The installed server and how to initialise a data folder for it."""

    server: Path  # mariadbd or mysqld
    flavor: Literal["mariadb", "mysql"]
    install_db: Path | None  # mariadb-install-db; None means `mysqld --initialize-insecure`
    version: str


def dev_dsn_default() -> DSN:
    """The DSN ``--dev`` tries first: ``$ORBIT_DSN``, else ``mysql://root@127.0.0.1:3306/orbit``."""
    return DSN.from_env()


# --------------------------------------------------------------------------------------------
# Finding the binaries


def _candidates(names: Sequence[str], search_path: Sequence[str | Path] | None) -> Iterator[Path]:
    if search_path is None:
        dirs: list[str] = [d for d in os.environ.get("PATH", "").split(os.pathsep) if d]
        dirs += [d for d in SEARCH_DIRS if d not in dirs]
    else:
        dirs = [str(d) for d in search_path]
    for name in names:
        for d in dirs:
            p = Path(d) / name
            if p.is_file() and os.access(p, os.X_OK):
                yield p


def find_server_binaries(search_path: Sequence[str | Path] | None = None) -> ServerBinaries:
    """Find ``mariadbd``/``mysqld`` (and ``mariadb-install-db``) in $PATH and the usual sbin folders.

    ``search_path`` replaces that list of folders. Raises :class:`DevDatabaseError` with
    install instructions when no server binary is found.
    """
    server = next(_candidates(("mariadbd", "mysqld"), search_path), None)
    if server is None:
        raise DevDatabaseError(
            f"no MariaDB/MySQL server binary (mariadbd, mysqld) found: {INSTALL_HINT}"
        )
    try:
        out = subprocess.run(
            [str(server), "--no-defaults", "--version"],
            capture_output=True,
            text=True,
            timeout=20,
            check=False,
        )
        version = (out.stdout or out.stderr).strip()
    except (OSError, subprocess.TimeoutExpired) as exc:
        raise DevDatabaseError(f"{server} --version failed: {exc}") from exc
    if "mariadb" in version.lower():
        install_db = next(
            _candidates(("mariadb-install-db", "mysql_install_db"), search_path), None
        )
        if install_db is None:
            raise DevDatabaseError(
                f"found {server} but not mariadb-install-db to initialise a data folder: {INSTALL_HINT}"
            )
        return ServerBinaries(server, "mariadb", install_db, version)
    return ServerBinaries(server, "mysql", None, version)


# --------------------------------------------------------------------------------------------
# Probing


def _server_error(exc: BaseException) -> bool:
    """True when the error came from a server (it answered), False for a connection failure."""
    if isinstance(exc, pymysql.err.MySQLError) and exc.args and isinstance(exc.args[0], int):
        return not 2000 <= exc.args[0] < 3000
    return False


def pymysql_kwargs(dsn: DSN, *, with_database: bool) -> dict[str, Any]:
    """``dsn``'s connect arguments, typed for ``pymysql.connect``."""
    return dict(dsn.connect_kwargs(with_database=with_database))


def ping(dsn: DSN, timeout: float) -> bool:
    try:
        conn = pymysql.connect(connect_timeout=timeout, **pymysql_kwargs(dsn, with_database=False))
    except Exception as exc:
        return _server_error(exc)
    conn.close()
    return True


async def server_reachable(dsn: DSN, *, connect_timeout: float = 2.0) -> bool:
    """True when a MySQL/MariaDB server answers at ``dsn``'s address.

    A server that answers but refuses the login (wrong password, unknown user) counts as
    reachable: starting a private server would not fix the DSN, and connecting will say why.
    """
    return await asyncio.to_thread(ping, dsn, connect_timeout)


# --------------------------------------------------------------------------------------------
# Processes


def pid_alive(pid: int) -> bool:
    """The process exists and is not a zombie."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return True
    return stat.rsplit(")", 1)[-1].split()[0] != "Z"


def cmdline(pid: int) -> list[str]:
    try:
        raw = Path(f"/proc/{pid}/cmdline").read_bytes()
    except OSError:
        return []
    return [a.decode(errors="replace") for a in raw.split(b"\0") if a]


def servers_on(datadir: Path) -> list[int]:
    """Pids of live processes started with ``--datadir=<datadir>`` (Linux: /proc; else the pid file)."""
    wanted = f"--datadir={datadir}"
    proc = Path("/proc")
    pids: list[int] = []
    if proc.is_dir():
        for entry in proc.iterdir():
            if (
                entry.name.isdigit()
                and wanted in cmdline(int(entry.name))
                and pid_alive(int(entry.name))
            ):
                pids.append(int(entry.name))
        return pids
    pid_file = datadir.parent / "mysqld.pid"
    with contextlib.suppress(OSError, ValueError):
        pid = int(pid_file.read_text().strip())
        if pid_alive(pid):
            pids.append(pid)
    return pids


def arg_value(args: Sequence[str], name: str) -> str | None:
    prefix = f"--{name}="
    return next((a[len(prefix) :] for a in args if a.startswith(prefix)), None)


#: Server processes started by this Python process, so that whoever stops one also reaps it.
CHILDREN: dict[int, subprocess.Popen[bytes]] = {}


def alive(pid: int) -> bool:
    child = CHILDREN.get(pid)
    if child is not None:
        if child.poll() is None:
            return True
        CHILDREN.pop(pid, None)
        return False
    return pid_alive(pid)


def send_signal(pid: int, sig: signal.Signals) -> None:
    try:
        os.kill(pid, sig)
    except ProcessLookupError:
        pass
    except PermissionError:
        raise DevDatabaseError(
            f"the dev database server (pid {pid}) belongs to another user: stop it as that user"
        ) from None


def stop_pid(pid: int, grace: float) -> None:
    """SIGTERM (the server's clean shutdown), wait up to ``grace`` seconds, then SIGKILL."""
    if not alive(pid):
        return
    send_signal(pid, signal.SIGTERM)
    deadline = time.monotonic() + grace
    while alive(pid):
        if time.monotonic() >= deadline:
            log.warning("dev database (pid %d) did not stop in %.0f s: SIGKILL", pid, grace)
            send_signal(pid, signal.SIGKILL)
            kill_deadline = time.monotonic() + 10
            while alive(pid) and time.monotonic() < kill_deadline:
                time.sleep(0.05)
            return
        time.sleep(0.05)


# --------------------------------------------------------------------------------------------
# Ports and processes


def port_free(port: int) -> bool:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            s.bind(("127.0.0.1", port))
        except OSError:
            return False
    return True


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def log_tail(path: Path, start: int = 0, lines: int = 15) -> str:
    try:
        with path.open("rb") as f:
            f.seek(start)
            text = f.read().decode(errors="replace")
    except OSError:
        return ""
    return "\n".join(text.strip().splitlines()[-lines:])


def run_as_root() -> bool:
    return hasattr(os, "geteuid") and os.geteuid() == 0


def spawn(cmd: list[str], log_path: Path | None) -> subprocess.Popen[bytes]:
    """Start ``cmd`` detached from our stdio (and from the terminal's signals).

    subprocess.Popen rather than asyncio's subprocess: the server must be stoppable from
    code without an event loop (:meth:`DevDatabase.stop_sync`). Fork+exec is quick.
    """
    if log_path is None:
        return subprocess.Popen(
            cmd,
            stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
            start_new_session=True,
        )
    with log_path.open("wb") as out:
        return subprocess.Popen(
            cmd,
            stdin=subprocess.DEVNULL,
            stdout=out,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )


async def run_logged(cmd: list[str], log_path: Path, deadline: float) -> int:
    """Run a short command with its output in ``log_path``; kill it past ``deadline`` or on cancel."""
    proc = spawn(cmd, log_path)
    try:
        while proc.poll() is None:
            if time.monotonic() >= deadline:
                raise DevDatabaseError(
                    f"{Path(cmd[0]).name} did not finish in time (log: {log_path})"
                )
            await asyncio.sleep(0.05)
        return proc.returncode
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
