"""``orbit retention get|set`` as processes against a real orbit-server: the defaults, a
partial change that keeps the other windows, ``forever``, a refused value (exit 1 naming
the field), and usage errors (exit 2)."""

from __future__ import annotations

import pytest
from cli_support import CliTenant, loads, server_fixture

from orbit.storage import DSN

pytestmark = pytest.mark.process

server = server_fixture()


@pytest.fixture
def t(server, dsn: DSN) -> CliTenant:
    return CliTenant.bootstrap(server, dsn)


def test_retention_get_and_set(t: CliTenant) -> None:
    first = loads(t.orbit("retention", "get", "--json"))
    assert first["revision"] == 1 and first["events_days"] is None
    out = loads(t.orbit("retention", "set", "--events-days", "14", "--audit-days", "90",
                        "--json"))  # fmt: skip
    assert (out["events_days"], out["audit_days"], out["revision"]) == (14, 90, 2)
    out = loads(t.orbit("retention", "set", "--finished-tasks-days", "30", "--json"))
    assert (out["finished_tasks_days"], out["events_days"], out["audit_days"]) == (30, 14, 90)
    out = loads(t.orbit("retention", "set", "--finished-tasks-days", "forever", "--json"))
    assert out["finished_tasks_days"] is None and out["events_days"] == 14
    human = t.orbit("retention", "get")
    assert human.returncode == 0 and "purged_total" in human.stdout
    refused = t.orbit("retention", "set", "--audit-days", "10")
    assert refused.returncode == 1 and "400" in refused.stderr and "audit_days" in refused.stderr
    assert t.orbit("retention", "set").returncode == 2
    assert t.orbit("retention", "set", "--events-days", "soon").returncode == 2
