"""The bench's own MariaDB: a private ``mariadbd`` that only the bench talks to.

Why: the ledger (statements, transactions, rows, fsyncs, redo bytes per task) is read from
``SHOW GLOBAL STATUS`` deltas and MariaDB's CPU from its process, so the server must carry
no other client's work; and the secondary-index entries need the binary log in ROW format
(the before and after image of every changed row), which is a server start-up setting.
Nothing global of a shared server is changed.

The instance is the installed package's ``mariadbd`` started with ``--no-defaults`` and the
few settings a Debian install adds in its configuration (utf8mb4, no name resolution,
loopback only); everything else is the compiled-in default, as on a stock server (128 MB
buffer pool, durable commits, O_DIRECT). Added: the binary log (``ROW``,
``binlog_row_image=NOBLOB``, ``sync_binlog=0``), which costs MariaDB some CPU per row
written (``--no-binlog`` leaves it off; the index entries are then not measured). The data
folder is made fresh under ``.orbit/bench/mariadb-<pid>`` for every run (so runs can overlap) and deleted at the end.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import shutil
import signal
import subprocess
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

import pymysql

from orbit.storage import DSN

SEARCH = ("/usr/sbin", "/usr/local/sbin", "/usr/bin", "/usr/local/bin")


def _find(name: str) -> str | None:
    found = shutil.which(name)
    if found:
        return found
    for d in SEARCH:
        p = Path(d) / name
        if p.is_file() and os.access(p, os.X_OK):
            return str(p)
    return None


def binaries() -> tuple[str, str] | str:
    """(mariadbd, mariadb-install-db), or why they cannot be used."""
    server = _find("mariadbd")
    install = _find("mariadb-install-db") or _find("mysql_install_db")
    if server is None or install is None:
        return "no mariadbd / mariadb-install-db installed"
    return server, install


def _free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@dataclass
class PrivateMariaDB:
    """A private ``mariadbd`` on a free loopback port with its own fresh data folder."""

    root: Path
    binlog: bool = True
    port: int = field(default_factory=_free_port)
    proc: subprocess.Popen[bytes] | None = None
    version: str = ""

    @property
    def datadir(self) -> Path:
        return self.root / "data"

    @property
    def dsn(self) -> DSN:
        return DSN(user="root", password="", host="127.0.0.1", port=self.port, database="mysql")

    @property
    def pid(self) -> int | None:
        return self.proc.pid if self.proc is not None else None

    def args(self, server: str, sock: str) -> list[str]:
        cmd = [
            server,
            "--no-defaults",
            f"--datadir={self.datadir}",
            f"--socket={sock}",
            f"--port={self.port}",
            "--bind-address=127.0.0.1",
            f"--pid-file={self.root / 'mariadbd.pid'}",
            f"--log-error={self.root / 'mariadbd.err'}",
            "--character-set-server=utf8mb4",
            "--collation-server=utf8mb4_general_ci",
            "--skip-name-resolve",
        ]
        if self.binlog:
            cmd += [
                f"--log-bin={self.datadir / 'binlog'}",
                "--server-id=1",
                "--binlog-format=ROW",
                "--binlog-row-image=NOBLOB",
                "--sync-binlog=0",
            ]
        if hasattr(os, "geteuid") and os.geteuid() == 0:
            cmd.append("--user=root")
        return cmd

    async def start(self, limit_s: float = 90.0) -> None:
        found = binaries()
        if isinstance(found, str):
            raise RuntimeError(found)
        server, install = found
        await asyncio.to_thread(shutil.rmtree, self.root, True)
        self.datadir.mkdir(parents=True, exist_ok=True)
        user = ["--user=root"] if hasattr(os, "geteuid") and os.geteuid() == 0 else []
        init = subprocess.run(  # noqa: ASYNC221 - a few seconds, once per run
            [install, "--no-defaults", f"--datadir={self.datadir}",
             "--auth-root-authentication-method=normal", "--skip-test-db", *user],
            capture_output=True, text=True, timeout=120,
        )  # fmt: skip
        if init.returncode != 0:
            raise RuntimeError(f"mariadb-install-db failed: {init.stderr[-500:]}")
        sock = str(Path(tempfile.gettempdir()) / f"orbit-bench-{self.port}.sock")
        self.proc = subprocess.Popen(  # noqa: ASYNC220 - a long-lived child
            self.args(server, sock),
            stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
            start_new_session=True,
        )  # fmt: skip
        deadline = time.monotonic() + limit_s
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(
                    f"mariadbd exited with {self.proc.returncode}: {self._log_tail()}"
                )
            try:
                conn = pymysql.connect(**self.dsn.connect_kwargs(with_database=False),
                                       connect_timeout=1)  # fmt: skip
            except pymysql.err.MySQLError:
                await asyncio.sleep(0.2)
                continue
            with conn.cursor() as cur:
                cur.execute("SELECT VERSION()")
                self.version = str(cur.fetchone()[0])
            conn.close()
            return
        raise RuntimeError(f"mariadbd did not answer in {limit_s:.0f} s: {self._log_tail()}")

    def _log_tail(self) -> str:
        with contextlib.suppress(OSError):
            return (self.root / "mariadbd.err").read_text(errors="replace")[-600:]
        return ""

    async def stop(self, *, remove: bool = True) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            for _ in range(600):
                if self.proc.poll() is not None:
                    break
                await asyncio.sleep(0.1)
            if self.proc.poll() is None:
                self.proc.kill()
                self.proc.wait()
        if remove:
            await asyncio.to_thread(shutil.rmtree, self.root, True)
