"""The production install path: the wheels scripts/wheels builds install into a fresh virtual
environment with the pinned requirements alone, and run there without the repository —
``orbit-server --version``, ``orbit-migrate status|up`` (the migrations come with the wheel),
and a server that answers ``/readyz`` and serves the web console."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import time
import venv
from pathlib import Path

import httpx
import pytest
from conftest import create_database, drop_database

from orbit.version import __version__

pytestmark = [pytest.mark.process, pytest.mark.slow, pytest.mark.timeout(600)]

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def installed(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A fresh venv with the runtime lock and the two wheels: its bin/ folder."""
    tmp = tmp_path_factory.mktemp("wheels")
    dist = tmp / "dist"
    build = subprocess.run([str(ROOT / "scripts" / "wheels"), str(dist)],
                           capture_output=True, text=True, timeout=300, check=False)  # fmt: skip
    assert build.returncode == 0, build.stderr[-3000:]
    wheels = sorted(p.name for p in dist.glob("*.whl"))
    assert wheels == [f"orbit_sdk-{__version__}-py3-none-any.whl",
                      f"orbit_server-{__version__}-py3-none-any.whl"], wheels  # fmt: skip
    assert (dist / "requirements.txt").read_text() == (ROOT / "requirements" / "runtime.txt").read_text()

    env_dir = tmp / "venv"
    venv.EnvBuilder(with_pip=True, clear=True).create(env_dir)
    pip = [str(env_dir / "bin" / "python"), "-m", "pip", "--disable-pip-version-check", "--no-input"]
    for args in (["install", "--require-hashes", "--no-deps", "-r", str(dist / "requirements.txt")],
                 ["install", "--no-deps", *map(str, dist.glob("*.whl"))],
                 ["check"]):  # fmt: skip
        r = subprocess.run([*pip, *args], cwd=tmp, capture_output=True, text=True,
                           env=_host_env(), timeout=300, check=False)  # fmt: skip
        assert r.returncode == 0, (args, r.stdout[-2000:], r.stderr[-2000:])
    return env_dir / "bin"


def _host_env(**extra: str) -> dict[str, str]:
    """A host without the repository: no PYTHONPATH, no virtual environment of ours."""
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "VIRTUAL_ENV")}
    env.update(extra)
    return env


def _run(bin_dir: Path, *cmd: str, **env: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([str(bin_dir / cmd[0]), *cmd[1:]], cwd=bin_dir.parent, capture_output=True,
                          text=True, env=_host_env(**env), timeout=120, check=False)  # fmt: skip


def test_the_installed_packages_come_from_the_wheels(installed: Path) -> None:
    r = _run(installed, "python", "-c",
             "import orbit, orbit_sdk, orbit_cmd; print(orbit.__file__, orbit_sdk.__file__, orbit_sdk.__version__)")  # fmt: skip
    assert r.returncode == 0, r.stderr
    orbit_file, sdk_file, sdk_version = r.stdout.split()
    site = installed.parent / "lib"
    assert Path(orbit_file).is_relative_to(site) and Path(sdk_file).is_relative_to(site)
    assert not Path(orbit_file).is_relative_to(ROOT)
    assert sdk_version == __version__


def test_orbit_server_version(installed: Path) -> None:
    r = _run(installed, "orbit-server", "--version")
    assert r.returncode == 0, r.stderr
    assert r.stdout.strip() == f"orbit-server {__version__}"


def test_migrate_status_and_up_and_a_serving_node(installed: Path) -> None:
    dsn = create_database("orbit_test_wheel")
    url = dsn.url(hide_password=False)
    try:
        pending = _run(installed, "orbit-migrate", "status", "--dsn", url)
        assert pending.returncode != 0 and "0001_platform.sql" in pending.stdout + pending.stderr
        up = _run(installed, "orbit-migrate", "up", "--dsn", url)
        assert up.returncode == 0, up.stderr
        current = _run(installed, "orbit-migrate", "status", "--dsn", url)
        assert current.returncode == 0, current.stdout + current.stderr

        port = _free_port()
        server = subprocess.Popen(
            [str(installed / "orbit-server"), "--port", str(port)], cwd=installed.parent,
            env=_host_env(ORBIT_DSN=url), stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True,
        )  # fmt: skip
        try:
            base = f"http://127.0.0.1:{port}"
            assert _wait_ready(base, server), server.stderr.read() if server.stderr else ""
            ui = httpx.get(f"{base}/ui/", timeout=10)
            assert ui.status_code == 200 and "<html" in ui.text.lower()
        finally:
            server.send_signal(signal.SIGTERM)
            code = server.wait(timeout=60)
        assert code == 0
    finally:
        drop_database(dsn)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _wait_ready(base: str, server: subprocess.Popen[str], timeout_s: float = 60) -> bool:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline and server.poll() is None:
        try:
            if httpx.get(f"{base}/readyz", timeout=2).status_code == 200:
                return True
        except httpx.HTTPError:
            pass
        time.sleep(0.2)
    return False
