"""The app server's clock skewed ±1 h from the database's does not change lease decisions.

``orbit-server`` runs under libfaketime (``FAKETIME=+1h`` / ``-1h``; ``+0`` is the
control, run with ``ORBIT_RELIABILITY_FULL=1``). Expected behaviour
(docs/invariants.md#7-database-time: leases, expiry and start authorisation compare against
``UTC_TIMESTAMP(6)``), identical for every offset:

* a worker session (30 s lease) opened on the skewed server is alive, and a credential
  that expires in 10 minutes by the database clock is accepted;
* ``started.lease_expires_at`` and each heartbeat's lease are the *database* now + the
  queue's ``lease_ms`` (within a second), never the skewed server's now;
* a running attempt that stops heartbeating is recovered once its lease has passed by the
  database clock — not at once (server +1 h) and not an hour late (server −1 h): the task
  is ``NEEDS_REVIEW`` within ``lease_ms`` + a few recovery rounds, and still RUNNING just
  before its lease ends.

Skipped (with the reason) only when the ``faketime`` binary is not installed
(``apt-get install faketime``).
"""

from __future__ import annotations

import json
import os
import time
from datetime import UTC, datetime, timedelta
from pathlib import Path

import httpx
import pytest
from reliability_support import (
    OrbitServer,
    cli_tenant,
    get_task,
    open_session,
    put_queue,
    query,
    record_figures,
    recv_json,
    submit,
    ws_connect,
)
from reliability_support import log_dir as log_dir

from orbit.storage import DSN

pytestmark = pytest.mark.process

LEASE_MS = 3000
#: ``ORBIT_RELIABILITY_FULL=1`` adds the unskewed control run (+0).
FULL = os.environ.get("ORBIT_RELIABILITY_FULL") == "1"
#: libfaketime itself, preloaded into the server (no wrapper process between the test and
#: the server, so signals reach the server directly).
LIBFAKETIME = next(
    (str(p) for p in Path("/usr/lib").glob("*/faketime/libfaketime.so.1")), None
)


def _db_now(dsn: DSN) -> datetime:
    return query(dsn, "SELECT UTC_TIMESTAMP(6)")[0][0].replace(tzinfo=UTC)  # type: ignore[no-any-return]


def _parse(ts: str) -> datetime:
    return datetime.strptime(ts, "%Y-%m-%dT%H:%M:%S.%fZ").replace(tzinfo=UTC)


@pytest.mark.skipif(LIBFAKETIME is None, reason="libfaketime is not installed: run scripts/test as root (it installs faketime), or sudo apt-get install faketime")
@pytest.mark.parametrize("offset", ["+1h", "-1h", *(["+0"] if FULL else [])])
def test_skewed_server_clock_does_not_move_leases(offset: str, dsn: DSN, log_dir: Path) -> None:
    assert LIBFAKETIME is not None
    server = OrbitServer(dsn, log_dir, env={
        "LD_PRELOAD": LIBFAKETIME, "FAKETIME": offset, "DONT_FAKE_MONOTONIC": "1",
        "ORBIT_PULSE_RECOVERY_INTERVAL_MS": "200"})  # fmt: skip
    server.start()
    try:
        skew_s = _server_skew(server, dsn)
        t = cli_tenant(dsn)
        put_queue(server.url, t, "default", lease_ms=LEASE_MS)
        c = httpx.Client(base_url=server.url, timeout=30)
        in_ten = (_db_now(dsn) + timedelta(minutes=10)).strftime("%Y-%m-%dT%H:%M:%S.%fZ")
        r = c.post(f"/v1/applications/{t.application_id}/credentials", headers=t.auth,
                   json={"name": "ten-minutes", "namespaces": ["*"], "actions": ["tasks.read"],
                         "expires_at": in_ten})  # fmt: skip
        assert r.status_code == 201, r.text
        assert c.get("/v1/whoami", headers={"Authorization": f"Bearer {r.json()['key']}"}).status_code == 200

        s = open_session(server.url, t, ["default"])
        task = submit(server.url, t)
        with ws_connect(server, s) as ws:
            offer = recv_json(ws, "offer")
            aid = offer["attempt_id"]
            ws.send(json.dumps({"type": "start", "msg_id": "s", "attempt_id": aid}))
            started = recv_json(ws, "started")
            lease_gap = (_parse(started["lease_expires_at"]) - _db_now(dsn)).total_seconds()
            time.sleep(1.0)
            ws.send(json.dumps({"type": "heartbeat", "msg_id": "h", "attempt_ids": [aid]}))
            hb = recv_json(ws, "heartbeat_ok")
            (att,) = hb["attempts"]
            assert att["ok"] is True
            hb_gap = (_parse(att["lease_expires_at"]) - _db_now(dsn)).total_seconds()
            session_gap = (_parse(hb["session_expires_at"]) - _db_now(dsn)).total_seconds()
            last_heartbeat = time.monotonic()
            # Stop heartbeating (the socket stays open, the session alive through HTTP).
            states = []
            while time.monotonic() - last_heartbeat < LEASE_MS / 1000 + 8:
                state = get_task(server.url, t, task["id"])["state"]
                states.append((round(time.monotonic() - last_heartbeat, 2), state))
                if state != "RUNNING":
                    break
                time.sleep(0.1)
        c.close()
    finally:
        assert server.stop() == 0, server.logs()[-2000:]
    lost_after = states[-1][0]
    record_figures("clock_skew", offset=offset, server_minus_db_s=round(skew_s, 1),
                   started_lease_s=round(lease_gap, 2), heartbeat_lease_s=round(hb_gap, 2),
                   session_lease_s=round(session_gap, 1), recovered_after_s=lost_after)  # fmt: skip
    expected_skew = {"+0": 0, "+1h": 3600, "-1h": -3600}[offset]
    assert abs(skew_s - expected_skew) < 60, f"faketime did not apply: skew {skew_s}"
    assert abs(lease_gap - LEASE_MS / 1000) < 1.0, lease_gap
    assert abs(hb_gap - LEASE_MS / 1000) < 1.0, hb_gap
    assert 20 < session_gap <= 31, session_gap
    assert states[-1][1] == "NEEDS_REVIEW", states[-3:]
    # Not before the lease (measured from the last heartbeat) and not long after it.
    assert LEASE_MS / 1000 - 0.5 <= lost_after <= LEASE_MS / 1000 + 4, states[-5:]


def _server_skew(server: OrbitServer, dsn: DSN) -> float:
    """The server's clock minus the database's (seconds): a process started with the
    server's libfaketime environment reads the same faked clock."""
    import subprocess

    assert server.proc is not None
    env = {**os.environ, **{k: v for k, v in server.env.items() if k in ("LD_PRELOAD", "FAKETIME")}}
    out = subprocess.run(
        ["python3", "-c", "import time; print(time.time())"],
        capture_output=True, text=True, timeout=30, check=True, env=env,
    ).stdout  # fmt: skip
    return float(out) - _db_now(dsn).timestamp()
