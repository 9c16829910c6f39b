"""Cross-tenant probe over EVERY operation of ``/openapi.json`` on a real ``orbit-server``.

Tenant B owns one of everything (queue, tasks, a worker session and attempt, a subscription
and a delivery, a schedule, a workflow and an instance, a credential). Tenant A, with a key
holding every action and ``admin`` on its own application, calls every operation with:

* ``foreign``: B's namespace name, application id, credential id, ids and names;
* ``foreign_ns_absent``: a namespace name that exists nowhere, with random ids;
* ``cross``: A's own namespace with B's ids and names (an id of another namespace);
* ``absent``: A's own namespace with random ids and fresh names.

Expected behaviour (docs/invariants.md#9-tenant-isolation): ``foreign`` answers exactly like
``foreign_ns_absent`` and ``cross`` exactly like ``absent`` — same status, same body (after
replacing the requested values themselves) — so nothing reveals that B's objects exist; no
answer to A ever contains one of B's ids; and afterwards none of B's objects changed.
The same holds for the two WebSocket streams. Revoked keys, expired credentials and expired
worker sessions are refused on the very next request.
"""

from __future__ import annotations

import json
import secrets
import time
from datetime import UTC, datetime, timedelta
from typing import Any

import httpx
import pytest
from reliability_support import (
    CliTenant,
    OrbitServer,
    cli_tenant,
    open_session,
    put_queue,
    query,
    record_figures,
    submit,
    unique,
)
from reliability_support import log_dir as log_dir
from reliability_support import server as server  # fixtures
from websockets.exceptions import InvalidStatus
from websockets.sync.client import connect as ws_connect_raw

from orbit.storage import DSN

pytestmark = pytest.mark.process

ID_KEYS = ("app_id", "cred", "sid", "attempt", "delivery", "instance", "task")
OPEN = {"/healthz", "/readyz", "/metrics", "/openapi.json", "/v1/whoami"}


def _hex() -> str:
    return secrets.token_hex(16)


def _populate(base: str, t: CliTenant, tag: str) -> dict[str, str]:
    """One of everything in ``t``'s namespace; the identifiers by path-parameter role."""
    c = httpx.Client(base_url=base, headers=t.auth, timeout=30)
    ns = f"/v1/namespaces/{t.namespace}"
    ids: dict[str, str] = {"ns": t.namespace, "app_id": t.application_id, "queue": f"q{tag}",
                           "sub": f"sub{tag}", "schedule": f"sch{tag}", "workflow": f"wf{tag}",
                           "signal": "go"}  # fmt: skip
    put_queue(base, t, ids["queue"])
    ids["task"] = submit(base, t, ids["queue"])["id"]
    cancelled = submit(base, t, ids["queue"])["id"]
    r = c.put(f"{ns}/subscriptions/{ids['sub']}", json={"filter": {}, "start": "earliest"})
    assert r.status_code == 201, r.text
    assert c.post(f"{ns}/tasks/{cancelled}/cancel").status_code == 200  # a result event
    r = c.put(f"{ns}/schedules/{ids['schedule']}",
              json={"queue": ids["queue"], "every_ms": 3_600_000, "task": {"kind": "k"},
                    "start_at": "2999-01-01T00:00:00.000000Z"})  # fmt: skip
    assert r.status_code == 201, r.text
    r = c.post(f"{ns}/workflows/{ids['workflow']}/versions", json={"definition": {"steps": [
        {"id": "w", "type": "wait_signal", "signal": "go", "timeout_ms": 3_600_000}]}})  # fmt: skip
    assert r.status_code == 201, r.text
    ids["version"] = str(r.json()["version"])
    r = c.post(f"{ns}/workflows/{ids['workflow']}/instances", json={"input": {}})
    assert r.status_code == 201, r.text
    ids["instance"] = r.json()["id"]
    r = c.post(f"/v1/applications/{t.application_id}/credentials",
               json={"name": f"extra{tag}", "namespaces": ["*"], "actions": ["tasks.read"]})  # fmt: skip
    assert r.status_code == 201, r.text
    ids["cred"] = r.json()["id"]
    session = open_session(base, t, [ids["queue"]])
    ids["sid"], ids["session_token"] = session.session_id, session.token
    r = httpx.post(f"{base}{ns}/workers/sessions/{session.session_id}/poll", params={"wait_ms": 5000},
                   headers={"Authorization": f"Bearer {session.token}"}, timeout=30)  # fmt: skip
    assert r.status_code == 200 and r.json()["offers"], r.text
    ids["attempt"] = r.json()["offers"][0]["attempt_id"]
    ids["leased_task"] = r.json()["offers"][0]["task"]["id"]
    for _ in range(100):
        r = c.post(f"{ns}/subscriptions/{ids['sub']}/pull", json={"max": 1, "wait_ms": 100})
        if r.status_code == 200 and r.json()["deliveries"]:
            ids["delivery"] = r.json()["deliveries"][0]["delivery_id"]
            break
    assert "delivery" in ids, "no delivery for the cancelled task"
    c.close()
    return ids


def _param_value(name: str, path: str, ids: dict[str, str]) -> str:
    """The value of path parameter ``name`` for this route, from ``ids`` (one tenant's)."""
    if name == "ns":
        return ids["ns"]
    if name == "app_id":
        return ids["app_id"]
    if name == "cred_id":
        return ids["cred"]
    if name == "sid":
        return ids["sid"]
    if name == "aid":
        return ids["attempt"]
    if name == "queue":
        return ids["queue"]
    if name == "version":
        return ids["version"]
    if name == "signal":
        return ids["signal"]
    if name == "id":
        if "/deliveries/" in path:
            return ids["delivery"]
        if "/instances/" in path:
            return ids["instance"]
        return ids["task"]
    if name == "name":
        if "/subscriptions/" in path:
            return ids["sub"]
        if "/schedules/" in path:
            return ids["schedule"]
        return ids["workflow"]
    raise AssertionError(f"unknown path parameter {name} in {path}")


def _absent_ids(ns: str) -> dict[str, str]:
    tag = secrets.token_hex(3)
    return {"ns": ns, "app_id": _hex(), "cred": _hex(), "sid": _hex(), "attempt": _hex(),
            "queue": f"qx{tag}", "version": "7", "signal": "go", "delivery": _hex(),
            "instance": _hex(), "task": _hex(), "sub": f"subx{tag}", "schedule": f"schx{tag}",
            "workflow": f"wfx{tag}"}  # fmt: skip


def _body(method: str, path: str, v: dict[str, str]) -> Any:
    if method in ("get", "delete"):
        return None
    q = v["queue"]
    bodies: list[tuple[str, Any]] = [
        ("/namespaces", {"name": f"n{secrets.token_hex(3)}"}) if path.startswith("/v1/applications/") else ("", None),
        ("/credentials", {"name": "c", "namespaces": ["*"], "actions": ["tasks.read"]}),
        ("/resources", {"max_unfinished_tasks": 5}),
        ("/ack", {"proof": "p" * 43}), ("/nack", {"proof": "p" * 43}), ("/budget", {"add": 1}),
        ("/pull", {"max": 1, "wait_ms": 0}),
        ("/tasks:batch", {"tasks": [{"queue": q, "kind": "k"}]}),
        ("/tasks:cancel", {"queue": q}),
        ("/resolve", {"action": "fail", "note": "probe"}),
        ("/workers/sessions", {"instance": {"host": "h", "pid": 1, "sdk": "probe"}, "queues": [q], "max_concurrency": 1}),
        ("/complete", {"execution_token": "t" * 43, "result": 1}),
        ("/fail", {"execution_token": "t" * 43, "error": {"type": "e"}}),
        ("/cancelled", {"execution_token": "t" * 43}),
        ("/effect", {"execution_token": "t" * 43, "key": "k", "phase": "begin"}),
        ("/heartbeat", {"attempt_ids": []}),
        ("/tasks", {"queue": q, "kind": "k"}),
        ("/versions", {"definition": {"steps": [{"id": "s", "type": "task", "queue": q, "kind": "k"}]}}),
        ("/instances", {"input": {}}),
        ("/signals/{signal}", {"signal_id": "sig-1", "payload": {}}),
        ("/cancel", {}),
    ]  # fmt: skip
    if "/schedules/{name}" in path and method == "put":
        return {"queue": q, "every_ms": 3_600_000, "task": {"kind": "k"}}
    if "/subscriptions/{name}" in path and method == "put":
        return {"filter": {}, "start": "earliest"}
    if "/queues/{queue}" in path and method == "put":
        return {}
    for suffix, body in bodies:
        if suffix and path.endswith(suffix):
            return body
    return None


def _normalise(text: str, values: dict[str, str]) -> str:
    for k, v in sorted(values.items(), key=lambda kv: -len(kv[1])):
        if len(v) > 1:
            text = text.replace(v, f"<{k}>")
    return text


def _call(base: str, method: str, path: str, values: dict[str, str], auth: str) -> tuple[int, str]:
    url = path
    used: dict[str, str] = {}
    for name in [seg[1:-1] for seg in path.split("/") if seg.startswith("{")] + (
        ["signal"] if "{signal}" in path else []
    ):
        v = _param_value(name, path, values)
        used[name] = v
        url = url.replace("{" + name + "}", v)
    body = _body(method, path, values)
    r = _CLIENT.request(method.upper(), base + url, json=body,
                        headers={"Authorization": f"Bearer {auth}"})  # fmt: skip
    return r.status_code, _normalise(r.text, used)


_CLIENT = httpx.Client(timeout=30)


def _session_route(path: str) -> bool:
    return "/attempts/" in path or ("/workers/sessions/{sid}" in path)


def test_every_route_answers_foreign_like_absent(server: OrbitServer, dsn: DSN) -> None:
    # Distinct namespace names: a name is resolved within the caller's application, so B's
    # "default" would simply be A's own "default".
    a, b = cli_tenant(dsn, namespace=unique("nsa")), cli_tenant(dsn, namespace=unique("nsb"))
    ids_a = _populate(server.url, a, "a")
    ids_b = _populate(server.url, b, "b")
    doc = httpx.get(server.url + "/openapi.json").json()
    secret_b = {k: v for k, v in ids_b.items() if k in (
        "task", "attempt", "sid", "instance", "delivery", "cred", "app_id", "leased_task")}  # fmt: skip
    problems: list[str] = []
    calls = 0
    routes = 0
    for path, ops in doc["paths"].items():
        if path in OPEN:
            continue
        for method in ops:
            routes += 1
            auth = ids_a["session_token"] if _session_route(path) else a.key
            foreign = {**ids_b, "session_token": ""}
            variants = {
                "foreign": foreign,
                "foreign_ns_absent": _absent_ids(f"nsx{secrets.token_hex(3)}"),
                # Names are resolved within the caller's namespace (B's queue name in A's
                # namespace is just a name), so only the ids cross over here.
                "cross": {**_absent_ids(a.namespace), **{k: ids_b[k] for k in ID_KEYS}},
                "absent": _absent_ids(a.namespace),
            }
            if path.startswith("/v1/applications/") or path.startswith("/v1/credentials/"):
                variants["cross"] = variants["foreign"]
                variants["absent"] = variants["foreign_ns_absent"]
            out = {name: _call(server.url, method, path, v, auth) for name, v in variants.items()}
            calls += len(out)
            for name, (_status, text) in out.items():
                leaked = [k for k, v in secret_b.items() if v in text]
                if leaked:
                    problems.append(f"{method.upper()} {path} [{name}] shows B's {leaked}: {text[:200]}")
            for x, y in (("foreign", "foreign_ns_absent"), ("cross", "absent")):
                (sx, tx), (sy, ty) = out[x], out[y]
                if sx != sy or (sx >= 400 and json.loads(tx) != json.loads(ty)):
                    problems.append(f"{method.upper()} {path}: {x} {sx} {tx[:150]} != {y} {sy} {ty[:150]}")
                if sx < 400 and x == "foreign" and "{" in path:
                    problems.append(f"{method.upper()} {path}: foreign namespace answered {sx}")
    # The WebSocket streams: B's session and subscription are as unknown to A as random ones.
    ws_out = {}
    for label, sid in (("foreign", ids_b["sid"]), ("absent", _hex())):
        url = f"{server.ws_url}/v1/namespaces/{a.namespace}/workers/sessions/{sid}/stream"
        ws_out[label] = _ws_status(url, ids_a["session_token"])
    for label, ns_name in (("foreign", b.namespace), ("absent", unique("nsx"))):
        url = f"{server.ws_url}/v1/namespaces/{ns_name}/subscriptions/{ids_b['sub']}/stream"
        ws_out["sub_" + label] = _ws_status(url, a.key)
    if ws_out["foreign"] != ws_out["absent"] or ws_out["sub_foreign"] != ws_out["sub_absent"]:
        problems.append(f"websocket answers differ: {ws_out}")

    # Nothing of B's changed.
    cb = httpx.Client(base_url=server.url, headers=b.auth, timeout=30)
    nsb = f"/v1/namespaces/{b.namespace}"
    assert cb.get(f"{nsb}/tasks/{ids_b['task']}").json()["state"] in ("LEASED", "WAITING")
    # (its offer may have expired meanwhile: back to WAITING, never started or finished)
    assert cb.get(f"{nsb}/tasks/{ids_b['leased_task']}").json()["state"] in ("LEASED", "WAITING")
    assert cb.get(f"{nsb}/queues/{ids_b['queue']}").json().get("paused") in (False, None)
    assert cb.get(f"{nsb}/gate").json()["paused"] is False
    assert cb.get(f"{nsb}/instances/{ids_b['instance']}").json()["state"] == "RUNNING"
    assert cb.get(f"{nsb}/instances/{ids_b['instance']}").json()["paused"] is False
    assert cb.get(f"{nsb}/schedules/{ids_b['schedule']}").json().get("paused") in (False, None)
    assert httpx.get(server.url + "/v1/whoami",
                     headers={"Authorization": f"Bearer {b.key}"}).status_code == 200  # fmt: skip
    creds = cb.get(f"/v1/applications/{b.application_id}/credentials").json()["items"]
    assert all(c["revoked_at"] is None for c in creds)
    cb.close()
    n_tasks = query(dsn, "SELECT COUNT(*) FROM pulse_tasks t JOIN orbit_namespaces n ON n.id = t.namespace_id"
                         " WHERE n.name = %s AND n.application_id = UNHEX(%s)", (b.namespace, b.application_id))  # fmt: skip
    assert n_tasks == [(2,)]
    record_figures("isolation_probe", routes=routes, calls=calls, anomalies=len(problems),
                   ws_answers=ws_out)  # fmt: skip
    assert not problems, "\n".join(problems[:40])


def _ws_status(url: str, token: str) -> str:
    try:
        with ws_connect_raw(url, additional_headers={"Authorization": f"Bearer {token}"},
                            open_timeout=10) as ws:  # fmt: skip
            try:
                ws.recv(timeout=2)
            except Exception as exc:
                rcvd = getattr(exc, "rcvd", None)
                return f"closed {rcvd.code if rcvd else '?'}"
            return "open"
    except InvalidStatus as exc:
        return f"http {exc.response.status_code} {_normalise(exc.response.body.decode(), {})}"


def test_revoked_keys_expired_credentials_and_sessions_are_refused_at_once(
    server: OrbitServer, dsn: DSN
) -> None:
    t = cli_tenant(dsn)
    put_queue(server.url, t, "default")
    c = httpx.Client(base_url=server.url, timeout=30)
    garbage = c.get("/v1/whoami", headers={"Authorization": "Bearer orb_" + "0" * 32 + "_x"})
    assert garbage.status_code == 401

    r = c.post(f"/v1/applications/{t.application_id}/credentials", headers=t.auth,
               json={"name": "doomed", "namespaces": ["*"], "actions": ["tasks.read"]})  # fmt: skip
    key = r.json()["key"]
    assert c.get("/v1/whoami", headers={"Authorization": f"Bearer {key}"}).status_code == 200
    assert c.delete(f"/v1/credentials/{r.json()['id']}", headers=t.auth).status_code == 200
    revoked = c.get("/v1/whoami", headers={"Authorization": f"Bearer {key}"})
    assert revoked.status_code == 401 and revoked.json()["error"] == garbage.json()["error"]

    soon = (datetime.now(UTC) + timedelta(seconds=2)).strftime("%Y-%m-%dT%H:%M:%S.%fZ")
    r = c.post(f"/v1/applications/{t.application_id}/credentials", headers=t.auth,
               json={"name": "brief", "namespaces": ["*"], "actions": ["tasks.read"],
                     "expires_at": soon})  # fmt: skip
    assert r.status_code == 201, r.text
    brief = r.json()["key"]
    assert c.get("/v1/whoami", headers={"Authorization": f"Bearer {brief}"}).status_code == 200
    time.sleep(2.5)
    expired = c.get("/v1/whoami", headers={"Authorization": f"Bearer {brief}"})
    assert expired.status_code == 401 and expired.json()["error"] == garbage.json()["error"]

    s = open_session(server.url, t, ["default"])
    hb = f"/v1/namespaces/{t.namespace}/workers/sessions/{s.session_id}/heartbeat"
    auth = {"Authorization": f"Bearer {s.token}"}
    assert c.post(hb, headers=auth, json={"attempt_ids": []}).status_code == 200
    # Expire it in the database (as the clock would); recovery has not run yet.
    query(dsn, "UPDATE pulse_worker_sessions SET expires_at = UTC_TIMESTAMP(6) - INTERVAL 1 SECOND,"
               " revision = revision + 1 WHERE id = UNHEX(%s)", (s.session_id,))  # fmt: skip
    gone = c.post(hb, headers=auth, json={"attempt_ids": []})
    assert gone.status_code == 401, gone.text
    assert _ws_status(f"{server.ws_url}{s.stream_path()}", s.token).startswith(("http 401", "closed 4401"))
    c.close()


def test_a_refused_subscription_stream_answers_the_documented_status(
    server: OrbitServer, dsn: DSN
) -> None:
    """Before the fix (orbit/http/errors.py) every refused subscription upgrade reached the
    client as a bare HTTP 403 (uvicorn's answer to a close before accept), so the documented
    4401/4403/4404 never arrived; now it is the HTTP error itself."""
    t = cli_tenant(dsn)
    base = f"{server.ws_url}/v1/namespaces/{t.namespace}/subscriptions"
    assert _ws_status(f"{base}/nosuch/stream", t.key).startswith('http 404 {"error":{"code":"not_found"')
    assert _ws_status(f"{base}/nosuch/stream", "orb_bad").startswith('http 401 {"error":{"code":"unauthenticated"')
