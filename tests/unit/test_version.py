"""One version per distribution, written once and reported by the installed packages."""

from __future__ import annotations

from importlib.metadata import version

import orbit_sdk
import pytest
from orbit_cmd.server import parse_args

from orbit.version import __version__


def test_orbit_server_version_is_the_distributions(capsys: pytest.CaptureFixture[str]) -> None:
    assert version("orbit-server") == __version__
    with pytest.raises(SystemExit) as exit_:
        parse_args(["--version"])
    assert exit_.value.code == 0
    assert capsys.readouterr().out.strip() == f"orbit-server {__version__}"


def test_orbit_sdk_version_is_the_distributions() -> None:
    assert version("orbit-sdk") == orbit_sdk.__version__
