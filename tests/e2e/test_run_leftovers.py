"""A test run leaves nothing behind — after a failure, a Ctrl-C, or a kill of pytest itself.

Each case runs a real pytest with this suite's conftest on a test that leaks on purpose: a
database (created the suite's way), a temporary folder with a file in it, and a process in its
own session (as a private mariadbd or a server would be). Afterwards none may remain.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path

import pymysql
import pytest
from conftest import SERVER_DSN
from leftovers import alive

pytestmark = pytest.mark.process

TESTS = Path(__file__).resolve().parents[1]
ROOT = TESTS.parent

LEAKY_TEST = '''
import os, subprocess, tempfile, time
from conftest import create_database

def test_leaks_everything():
    dsn = create_database("orbit_test_leak")
    folder = tempfile.mkdtemp()
    with open(os.path.join(folder, "data"), "wb") as f:
        f.write(b"x" * 100_000)
    sleeper = subprocess.Popen(["sleep", "600"], start_new_session=True,
                               stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    print("STATE", os.environ["ORBIT_TEST_TMP"], dsn.database, folder, sleeper.pid, flush=True)
    if os.environ.get("LEAKY_HANG"):
        time.sleep(600)
    raise AssertionError("fails on purpose")
'''


def _database_exists(name: str) -> bool:
    conn = pymysql.connect(**SERVER_DSN.connect_kwargs(with_database=False))
    try:
        with conn.cursor() as cur:
            cur.execute("SELECT 1 FROM information_schema.schemata WHERE schema_name = %s", (name,))
            return cur.fetchone() is not None
    finally:
        conn.close()


class Leaky:
    """A pytest run of LEAKY_TEST in its own run (no environment of ours that names one)."""

    def __init__(self, tmp_path: Path, **env: str) -> None:
        (tmp_path / "test_leaky.py").write_text(LEAKY_TEST)
        child_env = {k: v for k, v in os.environ.items()
                     if k not in ("ORBIT_TEST_RUN", "ORBIT_TEST_TMP", "ORBIT_TEST_SESSION_PID")}  # fmt: skip
        child_env.update(TMPDIR=str(tmp_path), PYTHONPATH=str(TESTS), **env)
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "pytest", "-q", "-s", "-p", "no:cacheprovider",
             "-p", "no:schemathesis", "-p", "no:hypothesispytest", "-p", "conftest",
             "-c", str(ROOT / "pyproject.toml"), "--rootdir", str(tmp_path),
             str(tmp_path / "test_leaky.py")],
            cwd=tmp_path, env=child_env, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT, text=True,
        )  # fmt: skip
        self.output: list[str] = []
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            self.output.append(line)
            if line.startswith("STATE "):
                run_dir, self.database, folder, pid = line.split()[1:]
                self.run_dir, self.folder, self.pid = Path(run_dir), Path(folder), int(pid)
                break
        else:
            raise AssertionError("".join(self.output))

    def wait(self) -> int:
        out, _ = self.proc.communicate(timeout=60)
        self.output.append(out)
        return self.proc.returncode

    def assert_leaked(self) -> None:
        assert _database_exists(self.database)
        assert (self.folder / "data").exists() and alive(self.pid)

    def assert_nothing_left(self) -> None:
        log = "".join(self.output)[-3000:]
        assert not _database_exists(self.database), log
        assert not self.run_dir.exists(), log
        assert not alive(self.pid), log


def test_a_failed_run_leaves_nothing(tmp_path: Path) -> None:
    run = Leaky(tmp_path)
    assert run.wait() == 1
    assert run.folder.is_relative_to(run.run_dir)
    run.assert_nothing_left()


def test_an_interrupted_run_leaves_nothing(tmp_path: Path) -> None:
    run = Leaky(tmp_path, LEAKY_HANG="1")
    run.assert_leaked()
    run.proc.send_signal(signal.SIGINT)  # Ctrl-C
    assert run.wait() == 2  # pytest: interrupted
    run.assert_nothing_left()


def test_a_killed_run_is_cleaned_up_by_the_test_command(tmp_path: Path) -> None:
    # As scripts/test does: it names the run and its folder, and cleans up after pytest exits.
    run_dir = tmp_path / "orbit-test-run"
    run_dir.mkdir()
    env = {"ORBIT_TEST_RUN": "0badc0de", "ORBIT_TEST_TMP": str(run_dir), "LEAKY_HANG": "1"}
    run = Leaky(tmp_path, **env)
    assert run.run_dir == run_dir and "_0badc0de_" in run.database
    run.proc.kill()  # no teardown at all
    run.wait()
    run.assert_leaked()
    cleanup = subprocess.run([sys.executable, str(TESTS / "leftovers.py")],
                             env={**os.environ, **env}, capture_output=True, text=True, timeout=60)  # fmt: skip
    assert cleanup.returncode == 0, cleanup.stderr
    run.assert_nothing_left()
