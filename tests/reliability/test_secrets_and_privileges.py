"""Secrets never leak, and the least-privilege runtime account is enough (and no more).

Expected behaviour (docs/invariants.md#8-ids-and-secrets and #9-tenant-isolation;
docs/security.md):

* a run that uses every kind of secret — API keys (bootstrap and created, one revoked), a
  worker session token, execution tokens (right and wrong), delivery proofs (acked, nacked,
  wrong) — leaves none of them, nor their secret parts, in the server's captured
  stdout/stderr (at ``debug``, the chattiest level; ``ORBIT_SECRETS_LOG_LEVEL`` overrides),
  in any error body, in any row of any Orbit table (events, result events, audit,
  idempotency records, ...), or in ``/metrics``. (Found and fixed: at ``debug`` uvicorn
  logged the WebSocket handshake's ``Authorization: Bearer pws_...`` header, and the head
  and tail of every frame — a ``complete`` frame ends with its execution token; orbit/logs.py
  now redacts bearer credentials, key/token shapes and frame payloads from every record.)
* ``orbit-migrate grants --apply`` makes an account that runs ``orbit-server`` (readiness,
  a task end to end over the worker stream) but gets 1142 on DDL and on dropping the
  immutability triggers, and 1644 on UPDATE/DELETE of every history table.
"""

from __future__ import annotations

import json
import os
import secrets
import subprocess
import sys
from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path

import httpx
import pymysql
import pytest
from reliability_support import (
    OrbitServer,
    cli_tenant,
    connect,
    open_session,
    orbit_tables,
    process_env,
    put_queue,
    query,
    record_figures,
    recv_json,
    run_task_over_ws,
    submit,
    ws_connect,
)
from reliability_support import log_dir as log_dir  # fixtures

from orbit.storage import DSN

pytestmark = pytest.mark.process

HISTORY_TABLES = ("orbit_event_batches", "orbit_events", "orbit_result_events", "orbit_audit_events",
                  "pulse_attempt_evidence", "pulse_schedule_versions",
                  "weave_definition_versions", "weave_poll_rounds")  # fmt: skip


def _secret_parts(value: str) -> list[str]:
    """The value, its random tail (the part after the last ``_``, when long enough) and its
    last 16 characters (log lines that truncate the middle of a message keep its end)."""
    out = [value]
    tail = value.rsplit("_", 1)[-1]
    if len(tail) >= 16 and tail != value:
        out.append(tail)
    if len(value) >= 32:
        out.append(value[-16:])
    return out


def test_no_secret_in_logs_errors_rows_or_metrics(dsn: DSN, log_dir: Path) -> None:
    server = OrbitServer(dsn, log_dir, log_level=os.environ.get("ORBIT_SECRETS_LOG_LEVEL", "debug"))
    server.start()
    secrets_seen: dict[str, str] = {}
    bodies: list[str] = []
    try:
        t = cli_tenant(dsn, namespace="sec")
        secrets_seen["bootstrap_key"] = t.key
        c = httpx.Client(base_url=server.url, timeout=30)
        put_queue(server.url, t, "default")
        r = c.post(f"/v1/applications/{t.application_id}/credentials", headers={**t.auth, "Idempotency-Key": "cred-1"},
                   json={"name": "worker", "namespaces": ["*"], "actions": ["workers.connect", "tasks.read"]})  # fmt: skip
        assert r.status_code == 201
        secrets_seen["created_key"] = r.json()["key"]
        replay = c.post(f"/v1/applications/{t.application_id}/credentials", headers={**t.auth, "Idempotency-Key": "cred-1"},
                        json={"name": "worker", "namespaces": ["*"], "actions": ["workers.connect", "tasks.read"]})  # fmt: skip
        bodies.append(replay.text)
        r = c.post(f"/v1/applications/{t.application_id}/credentials", headers=t.auth,
                   json={"name": "revoked", "namespaces": ["*"], "actions": ["tasks.read"]})  # fmt: skip
        secrets_seen["revoked_key"] = r.json()["key"]
        c.delete(f"/v1/credentials/{r.json()['id']}", headers=t.auth)
        for key in (secrets_seen["revoked_key"], secrets_seen["revoked_key"] + "x", "orb_" + "a" * 32 + "_" + "b" * 43):
            bodies.append(c.get("/v1/whoami", headers={"Authorization": f"Bearer {key}"}).text)

        # A subscription, so result events become deliveries with proofs.
        ns = f"/v1/namespaces/{t.namespace}"
        assert c.put(f"{ns}/subscriptions/all", headers=t.auth, json={"start": "earliest"}).status_code == 201

        # A worker session and two tasks: one completed, one failed with a wrong token first.
        s = open_session(server.url, t, ["default"])
        secrets_seen["session_token"] = s.token
        done = submit(server.url, t)
        submit(server.url, t)
        with ws_connect(server, s) as ws:
            tokens = []
            offers = [recv_json(ws, "offer"), recv_json(ws, "offer")]
            for offer in offers:
                ws.send(json.dumps({"type": "start", "msg_id": offer["attempt_id"], "attempt_id": offer["attempt_id"]}))
                started = recv_json(ws, "started")
                tokens.append((offer, started["execution_token"]))
                secrets_seen[f"execution_token_{offer['task']['id']}"] = started["execution_token"]
            for offer, token in tokens:
                aid = offer["attempt_id"]
                ws.send(json.dumps({"type": "complete", "msg_id": "bad" + aid, "attempt_id": aid,
                                    "execution_token": token[::-1], "result": 1}))  # fmt: skip
                bodies.append(json.dumps(recv_json(ws, "error")))
                if offer["task"]["id"] == done["id"]:
                    frame = {"type": "complete", "result": {"ok": 1}}
                else:
                    frame = {"type": "fail", "error": {"type": "boom", "message": "x"}}
                ws.send(json.dumps({**frame, "msg_id": "ok" + aid, "attempt_id": aid, "execution_token": token}))
                recv_json(ws, "receipt")
        # The same over HTTP with a wrong token (error body).
        bodies.append(c.post(f"{ns}/attempts/{tokens[0][0]['attempt_id']}/complete",
                             headers={"Authorization": f"Bearer {s.token}"},
                             json={"execution_token": tokens[0][1], "result": 2}).text)  # fmt: skip
        bodies.append(c.post(f"{ns}/workers/sessions/{s.session_id}/heartbeat",
                             headers={"Authorization": f"Bearer {s.token}x"}, json={}).text)  # fmt: skip

        proofs: list[str] = []
        for _ in range(100):
            r = c.post(f"{ns}/subscriptions/all/pull", headers=t.auth, json={"max": 10, "wait_ms": 200})
            for d in r.json()["deliveries"]:
                proofs.append(d["proof"])
                secrets_seen[f"proof_{d['delivery_id']}"] = d["proof"]
                bodies.append(c.post(f"{ns}/deliveries/{d['delivery_id']}/ack", headers=t.auth,
                                     json={"proof": d["proof"][::-1]}).text)  # fmt: skip
                verb = "ack" if len(proofs) % 2 else "nack"
                assert c.post(f"{ns}/deliveries/{d['delivery_id']}/{verb}", headers=t.auth,
                              json={"proof": d["proof"]}).status_code == 200  # fmt: skip
            if len(proofs) >= 2:
                break
        assert len(proofs) >= 2
        metrics = c.get("/metrics").text
        c.close()
    finally:
        code = server.stop()
    logs = server.logs()
    assert code == 0, logs[-2000:]
    assert "serving on" in logs  # the capture works

    rows_text = _all_rows_text(dsn)
    needles = {f"{name}[{i}]": part for name, value in secrets_seen.items()
               for i, part in enumerate(_secret_parts(value))}  # fmt: skip
    found = []
    for where, text in (("logs", logs), ("error bodies", "\n".join(bodies)),
                        ("database rows", rows_text), ("metrics", metrics)):  # fmt: skip
        found += [f"{name} in {where}" for name, needle in needles.items() if needle in text]
    record_figures("secrets_scan", secrets=len(secrets_seen), needles=len(needles),
                   log_bytes=len(logs), row_bytes=len(rows_text), findings=len(found))  # fmt: skip
    assert len(secrets_seen) >= 8
    assert not found, found


def _all_rows_text(dsn: DSN) -> str:
    """Every row of every Orbit table, as text (binary columns hex-encoded too)."""
    out: list[str] = []
    conn = connect(dsn)
    try:
        with conn.cursor() as cur:
            for table in orbit_tables(dsn):
                cur.execute(f"SELECT * FROM `{table}`")
                for row in cur.fetchall():
                    for v in row:
                        if isinstance(v, bytes):
                            out.append(v.hex())
                            out.append(v.decode("utf-8", "replace"))
                        else:
                            out.append(str(v))
    finally:
        conn.close()
    return "\n".join(out)


# --- least privilege --------------------------------------------------------------------------


@pytest.fixture
def runtime_account(dsn: DSN, server_dsn: DSN) -> Iterator[DSN]:
    user = f"orbit_rt_{secrets.token_hex(4)}"
    password = secrets.token_urlsafe(16)
    r = subprocess.run(
        [sys.executable, "-m", "orbit_cmd.migrate", "--dsn", dsn.url(hide_password=False),
         "grants", "--user", user, "--host", "%", "--apply", f"--password={password}"],
        env=process_env(), capture_output=True, text=True, timeout=60, check=False,
    )  # fmt: skip
    assert r.returncode == 0, r.stderr
    try:
        yield replace(dsn, user=user, password=password)
    finally:
        query(server_dsn.with_database("mysql"), f"DROP USER IF EXISTS '{user}'@'%'")


def _code(conn: pymysql.connections.Connection, sql: str) -> int | None:
    try:
        with conn.cursor() as cur:
            cur.execute(sql)
    except pymysql.MySQLError as exc:
        return int(exc.args[0])
    return None


def test_runtime_account_runs_the_server_and_cannot_rewrite_history(
    runtime_account: DSN, dsn: DSN, log_dir: Path
) -> None:
    server = OrbitServer(runtime_account, log_dir)
    server.start()
    try:
        t = cli_tenant(dsn)  # the bootstrap is an operator step (admin account)
        put_queue(server.url, t, "default")
        final = run_task_over_ws(server, t, result={"under": "runtime account"})
        assert final["result"] == {"under": "runtime account"}
        assert httpx.get(server.url + "/readyz").status_code == 200
    finally:
        assert server.stop() == 0, server.logs()[-2000:]

    conn = connect(runtime_account)
    try:
        denied = {
            "create": _code(conn, "CREATE TABLE orbit_evil (id INT PRIMARY KEY)"),
            "alter": _code(conn, "ALTER TABLE pulse_tasks ADD COLUMN evil INT"),
            "drop": _code(conn, "DROP TABLE orbit_events"),
            "drop_trigger": _code(conn, "DROP TRIGGER trg_orbit_events_no_update"),
            "truncate": _code(conn, "TRUNCATE TABLE orbit_audit_events"),
            "grant": _code(conn, f"GRANT ALL ON `{dsn.database}`.* TO CURRENT_USER()"),
        }
        history = {}
        for table in HISTORY_TABLES:
            history[f"update {table}"] = _code(conn, f"UPDATE `{table}` SET namespace_id = namespace_id LIMIT 1")
            history[f"delete {table}"] = _code(conn, f"DELETE FROM `{table}` LIMIT 1")
        rows = {table: query(dsn, f"SELECT COUNT(*) FROM `{table}`")[0][0] for table in HISTORY_TABLES}
    finally:
        conn.close()
    assert all(code in (1142, 1044, 1227, 1370, 1410) for code in denied.values()), denied
    # Every history table has rows in this database (else the trigger check proves nothing)
    # except the ones the run did not touch.
    for what, code in history.items():
        table = what.split()[1]
        if rows[table]:
            assert code == 1644, (what, code)
        else:
            assert code in (1644, None), (what, code)
    assert rows["orbit_event_batches"] and rows["orbit_result_events"] and rows["orbit_audit_events"]
