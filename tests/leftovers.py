"""What one test run leaves behind, and its removal — also after a failure, Ctrl-C or a kill.

A run has an id (``ORBIT_TEST_RUN``, 8 hex digits) and one temporary folder
(``ORBIT_TEST_TMP``). ``scripts/test`` makes both and exports them; a plain ``pytest`` gets
its own from ``tests/conftest.py``. Everything the run creates is marked with them:

* every database it creates is named ``<prefix>_<run id>_<random>`` (``run_database_name``);
* ``TMPDIR`` points into the folder, so temporary files of the tests and of every process they
  start (servers, private ``mariadbd`` data directories, browsers) land there, and pytest's
  ``tmp_path`` folders too.

``clean(run, folder)`` stops the processes the run started (their environment holds its
``TMPDIR``, or their command line names the folder), drops the run's databases and removes
the folder. ``conftest.py`` calls it when the session ends (pytest still ends its session
after a Ctrl-C); ``scripts/test`` calls it again on exit (``python tests/leftovers.py``) for the
runs that did not get that far (a second Ctrl-C, a kill).
"""

from __future__ import annotations

import contextlib
import os
import re
import shutil
import signal
import sys
import time
from pathlib import Path

import pymysql

RUN_RE = re.compile(r"^[0-9a-f]{8}$")
DEFAULT_TEST_DSN = "mysql://root@127.0.0.1:3306/mysql"


def run_database_name(prefix: str, run: str, token: str) -> str:
    """The name of a database of run ``run`` (at most 64 characters, MySQL's limit)."""
    name = f"{prefix}_{run}_{token}"
    if len(name) > 64:
        raise ValueError(f"database name {name!r} is longer than 64 characters")
    return name


def _run_processes(folder: Path) -> list[int]:
    """Processes started by the run: TMPDIR is its folder, or their command line names it."""
    marker_env = f"TMPDIR={folder}".encode()
    marker_arg = str(folder).encode()
    mine = {os.getpid(), os.getppid()}
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit() or int(entry.name) in mine:
            continue
        try:
            env = (entry / "environ").read_bytes().split(b"\0")
            cmd = (entry / "cmdline").read_bytes()
        except OSError:  # gone meanwhile, or not ours to read
            continue
        if marker_env in env or marker_arg in cmd:
            found.append(int(entry.name))
    return found


def stop_processes(folder: Path, grace_s: float = 5.0) -> list[int]:
    """SIGTERM, then after ``grace_s`` SIGKILL, to every process the run left running."""
    pids = _run_processes(folder)
    for pid in pids:
        _signal(pid, signal.SIGTERM)
    deadline = time.monotonic() + grace_s
    while pids and time.monotonic() < deadline:
        time.sleep(0.1)
        pids = [p for p in pids if alive(p)]
    for pid in pids:
        _signal(pid, signal.SIGKILL)
    return pids


def _signal(pid: int, sig: signal.Signals) -> None:
    with contextlib.suppress(ProcessLookupError):
        os.kill(pid, sig)


def alive(pid: int) -> bool:
    """Whether process ``pid`` exists and is not a zombie."""
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except (OSError, IndexError):
        return False
    return state != "Z"


def drop_databases(run: str, dsn_text: str | None = None) -> list[str]:
    """Drop every database of run ``run`` on the test server; returns their names."""
    if not RUN_RE.match(run):  # never a pattern that could match another run's databases
        raise ValueError(f"not a run id: {run!r}")
    from orbit.storage import DSN

    dsn = DSN.parse(dsn_text or os.environ.get("ORBIT_TEST_DSN", DEFAULT_TEST_DSN))
    conn = pymysql.connect(autocommit=True, **dsn.connect_kwargs(with_database=False))
    try:
        with conn.cursor() as cur:
            cur.execute(
                "SELECT schema_name FROM information_schema.schemata WHERE schema_name LIKE %s",
                (f"%\\_{run}\\_%",),
            )
            names = [row[0] for row in cur.fetchall()]
            for name in names:
                cur.execute(f"DROP DATABASE IF EXISTS `{name}`")
    finally:
        conn.close()
    return names


def clean(run: str, folder: Path | None) -> None:
    """Stop the run's processes, drop its databases, remove its folder."""
    if folder is not None:
        stop_processes(folder)
    drop_databases(run)
    if folder is not None:
        shutil.rmtree(folder, ignore_errors=True)


def main() -> int:
    run = os.environ.get("ORBIT_TEST_RUN", "")
    folder = os.environ.get("ORBIT_TEST_TMP")
    try:
        clean(run, Path(folder) if folder else None)
    except (ValueError, pymysql.err.MySQLError) as exc:
        print(f"leftovers: {exc}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
