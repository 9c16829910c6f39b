"""Conflicts are events, not noise: every conflict kind a client can make the server
produce is answered explicitly (409/412/422/429), counted in
``orbit_conflicts_total{kind}`` and written to the audit trail with outcome ``conflict`` —
over HTTP and inside both WebSockets (worker stream, subscription stream) alike.

Each case below makes one conflict of one kind through the real server (every route and
loop of ``orbit-server``) and checks the answer, the metric's increase and the audit row.
The kinds not walked here arise only from races between concurrent writers (``cas``,
``idempotency_in_progress``) or inside background loops and locked transactions where
they cannot reach a client (``pump_position``, ``start``, ``report``, ``heartbeat``;
``instance`` needs two applications in one namespace, which cannot exist); the first two go
through the same error handler as every case here.
"""

from __future__ import annotations

import json
from collections.abc import Awaitable, Callable
from typing import Any

import httpx
import msgspec
import pytest
import websockets
from sdk_server import Env, env_fixture, server_fixture, unique  # noqa: F401

from orbit.metrics import conflicts
from orbit.storage import Database, Tx
from orbit.types import ZERO_ID

#: Every kind walked by this module (the test at the end checks none is forgotten).
WALKED: set[str] = set()


def _metric(env: Env, kind: str) -> float:
    return conflicts(env.server.ctx.metrics).value(kind=kind)


async def _conflict_audits(db: Database, namespace_id: bytes, action: str) -> list[dict[str, Any]]:
    async def run(tx: Tx) -> list[dict[str, Any]]:
        return await tx.fetchall(
            "SELECT action, resource_kind, resource_id, outcome, status_code, details"
            " FROM orbit_audit_events WHERE namespace_id IN (%s, %s) AND action = %s"
            " AND outcome = 'conflict' ORDER BY created_at",
            (namespace_id, ZERO_ID, action),
        )

    rows = await db.read(run)
    for r in rows:
        r["details"] = msgspec.json.decode(r["details"]) if r["details"] else {}
    return rows


async def _walk(
    env: Env,
    db: Database,
    *,
    kind: str,
    action: str,
    status: int,
    make: Callable[[], Awaitable[None]],
    count: int = 1,
) -> dict[str, Any]:
    """Run ``make`` (which must produce the conflict); check metric and audit; return the
    audit row."""
    WALKED.add(kind)
    before = _metric(env, kind)
    audits = len(await _conflict_audits(db, env.tenant.namespace_id, action))
    await make()
    assert _metric(env, kind) == before + count, f"{kind}: metric not counted"
    rows = await _conflict_audits(db, env.tenant.namespace_id, action)
    assert len(rows) == audits + 1, f"{kind}: no audit row for {action}"
    row = rows[-1]
    assert row["status_code"] == status, row
    assert row["details"].get("kind", row["details"].get("code")) == kind, row
    return row


def _expect(r: httpx.Response, status: int, code: str) -> None:
    assert r.status_code == status, r.text
    assert r.json()["error"]["code"] == code, r.text


async def _queue(http: httpx.AsyncClient, ns: str, **config: Any) -> str:
    name = unique("cq")
    r = await http.put(f"/v1/namespaces/{ns}/queues/{name}", json=config)
    assert r.status_code == 201, r.text
    return name


async def _submit(http: httpx.AsyncClient, ns: str, queue: str, **fields: Any) -> dict[str, Any]:
    r = await http.post(f"/v1/namespaces/{ns}/tasks", json={"queue": queue, "kind": "k", **fields})
    assert r.status_code == 201, r.text
    return r.json()  # type: ignore[no-any-return]


class _Worker:
    """A session driven over the HTTP fallback (its stream is opened separately)."""

    def __init__(self, http: httpx.AsyncClient, ns: str) -> None:
        self.http, self.ns = http, ns
        self.sid = self.token = ""

    async def open(self, queue: str, **extra: Any) -> httpx.Response:
        r = await self.http.post(
            f"/v1/namespaces/{self.ns}/workers/sessions",
            json={"instance": {"host": "h", "pid": 1, "sdk": "raw", **extra}, "queues": [queue],
                  "max_concurrency": 4},
        )  # fmt: skip
        if r.status_code == 201:
            self.sid, self.token = r.json()["session_id"], r.json()["session_token"]
        return r

    @property
    def auth(self) -> dict[str, str]:
        return {"Authorization": f"Bearer {self.token}"}

    async def started(self) -> tuple[str, str]:
        r = await self.http.post(
            f"/v1/namespaces/{self.ns}/workers/sessions/{self.sid}/poll?wait_ms=10000",
            headers=self.auth,
        )
        (offer,) = r.json()["offers"]
        aid = offer["attempt_id"]
        s = await self.http.post(
            f"/v1/namespaces/{self.ns}/attempts/{aid}/start", headers=self.auth
        )
        assert s.json()["type"] == "started", s.text
        return aid, s.json()["execution_token"]

    async def report(self, aid: str, op: str, body: dict[str, Any]) -> httpx.Response:
        return await self.http.post(
            f"/v1/namespaces/{self.ns}/attempts/{aid}/{op}", json=body, headers=self.auth
        )


async def test_platform_and_task_conflicts(env: Env, db: Database) -> None:
    ns = env.ns
    async with env.http() as http:
        app = env.tenant.app_hex

        async def name_taken() -> None:
            r = await http.post(f"/v1/applications/{app}/namespaces", json={"name": ns})
            _expect(r, 409, "conflict")

        await _walk(env, db, kind="name_taken", action="namespaces.create", status=409,
                    make=name_taken)  # fmt: skip

        queue = await _queue(http, ns, max_unfinished_tasks=1)

        async def precondition() -> None:
            r = await http.put(
                f"/v1/namespaces/{ns}/queues/{queue}", json={}, headers={"If-Match": '"99"'}
            )
            _expect(r, 412, "precondition_failed")

        await _walk(env, db, kind="precondition_failed", action="queues.put", status=412,
                    make=precondition)  # fmt: skip

        async def idempotency_mismatch() -> None:
            h = {"Idempotency-Key": unique("idem")}
            first = await http.post(
                f"/v1/namespaces/{ns}/tasks", json={"queue": queue, "kind": "a"}, headers=h
            )
            assert first.status_code == 201, first.text
            r = await http.post(
                f"/v1/namespaces/{ns}/tasks", json={"queue": queue, "kind": "b"}, headers=h
            )
            _expect(r, 422, "idempotency_mismatch")

        await _walk(env, db, kind="idempotency_mismatch", action="tasks.submit", status=422,
                    make=idempotency_mismatch)  # fmt: skip

        async def quota() -> None:  # the queue holds its one unfinished task already
            r = await http.post(f"/v1/namespaces/{ns}/tasks", json={"queue": queue, "kind": "c"})
            _expect(r, 429, "quota_exceeded")
            assert int(r.headers["Retry-After"]) >= 1

        await _walk(env, db, kind="quota_exceeded", action="tasks.submit", status=429,
                    make=quota)  # fmt: skip

        async def batch_quota() -> None:
            r = await http.post(
                f"/v1/namespaces/{ns}/tasks:batch",
                json={"tasks": [{"queue": queue, "kind": "d"}, {"queue": queue, "kind": "e"}]},
            )
            assert r.status_code == 200, r.text
            items = r.json()["items"]
            assert [i["status"] for i in items] == [429, 429]
            assert all(i["retry_after_ms"] >= 1000 for i in items)
            assert items[0]["error"]["code"] == "quota_exceeded"

        row = await _walk(env, db, kind="quota_exceeded", action="tasks.submit", status=429,
                          make=batch_quota, count=2)  # fmt: skip
        assert row["details"]["refused"] == [0, 1]

        other = await _queue(http, ns)
        waiting = await _submit(http, ns, other)

        async def task_state() -> None:
            r = await http.post(
                f"/v1/namespaces/{ns}/tasks/{waiting['id']}/resolve",
                json={"action": "retry", "note": "n"},
            )
            _expect(r, 409, "conflict")

        await _walk(env, db, kind="task_state", action="tasks.resolve", status=409,
                    make=task_state)  # fmt: skip


async def test_worker_conflicts_over_http_and_the_stream(env: Env, db: Database) -> None:
    ns = env.ns
    async with env.http() as http:
        queue = await _queue(http, ns)
        await _submit(http, ns, queue)
        worker = _Worker(http, ns)
        assert (await worker.open(queue)).status_code == 201
        aid, token = await worker.started()

        async def stale_http() -> None:
            r = await worker.report(aid, "complete", {"execution_token": "ext_wrong", "result": 1})
            _expect(r, 409, "stale_token")

        row = await _walk(env, db, kind="stale_token", action="attempts.complete", status=409,
                          make=stale_http)  # fmt: skip
        assert row["resource_kind"] == "attempt" and row["resource_id"] == aid

        async def not_cancel_requested() -> None:
            r = await worker.report(aid, "cancelled", {"execution_token": token})
            _expect(r, 409, "conflict")

        await _walk(env, db, kind="not_cancel_requested", action="attempts.cancelled",
                    status=409, make=not_cancel_requested)  # fmt: skip

        url = env.server.url.replace("http://", "ws://")
        path = f"/v1/namespaces/{ns}/workers/sessions/{worker.sid}/stream"
        async with websockets.connect(url + path, additional_headers=worker.auth) as ws:

            async def stale_ws() -> None:
                await ws.send(json.dumps({"type": "fail", "msg_id": "f", "attempt_id": aid,
                                          "execution_token": "ext_wrong",
                                          "error": {"type": "x", "message": "m"}}))  # fmt: skip
                while (frame := json.loads(await ws.recv()))["type"] != "error":
                    pass
                assert frame["code"] == "stale_token" and frame["ref_msg_id"] == "f"

            await _walk(env, db, kind="stale_token", action="attempts.fail", status=409,
                        make=stale_ws)  # fmt: skip


async def test_subscription_conflicts_over_http_and_the_stream(env: Env, db: Database) -> None:
    ns = env.ns
    async with env.http() as http:
        queue = await _queue(http, ns)
        name = unique("sub")
        r = await http.put(
            f"/v1/namespaces/{ns}/subscriptions/{name}",
            json={"filter": {"queues": [queue]}, "start": "earliest", "ack_timeout_ms": 60_000},
        )
        assert r.status_code == 201, r.text

        async def subscription_start() -> None:
            r = await http.put(
                f"/v1/namespaces/{ns}/subscriptions/{name}", json={"start": "latest"}
            )
            _expect(r, 409, "conflict")

        await _walk(env, db, kind="subscription_start", action="subscriptions.put", status=409,
                    make=subscription_start)  # fmt: skip

        for _ in range(2):  # two result events to deliver
            t = await _submit(http, ns, queue, delay_ms=3_600_000)
            c = await http.post(f"/v1/namespaces/{ns}/tasks/{t['id']}/cancel")
            assert c.status_code == 200, c.text
        pulled: list[dict[str, Any]] = []
        for _ in range(100):
            p = await http.post(
                f"/v1/namespaces/{ns}/subscriptions/{name}/pull", json={"max": 1, "wait_ms": 5000}
            )
            pulled += p.json()["deliveries"]
            if pulled:
                break
        (first,) = pulled
        did = first["delivery_id"]

        async def stale_proof_http() -> None:
            r = await http.post(f"/v1/namespaces/{ns}/deliveries/{did}/ack", json={"proof": "nope"})
            _expect(r, 409, "stale_proof")

        await _walk(env, db, kind="stale_proof", action="deliveries.ack", status=409,
                    make=stale_proof_http)  # fmt: skip

        ok = await http.post(
            f"/v1/namespaces/{ns}/deliveries/{did}/ack", json={"proof": first["proof"]}
        )
        assert ok.status_code == 200, ok.text

        async def delivery_acked() -> None:
            r = await http.post(
                f"/v1/namespaces/{ns}/deliveries/{did}/nack", json={"proof": first["proof"]}
            )
            _expect(r, 409, "conflict")

        await _walk(env, db, kind="delivery_acked", action="deliveries.nack", status=409,
                    make=delivery_acked)  # fmt: skip

        url = env.server.url.replace("http://", "ws://")
        path = f"/v1/namespaces/{ns}/subscriptions/{name}/stream"
        headers = {"Authorization": f"Bearer {env.tenant.key}"}
        async with websockets.connect(url + path, additional_headers=headers) as ws:
            while (frame := json.loads(await ws.recv()))["type"] != "delivery":
                pass

            async def stale_proof_ws() -> None:
                await ws.send(json.dumps(
                    {"type": "ack", "delivery_id": frame["delivery_id"], "proof": "nope"}
                ))  # fmt: skip
                while (reply := json.loads(await ws.recv()))["type"] != "error":
                    pass
                assert reply["code"] == "stale_proof"

            await _walk(env, db, kind="stale_proof", action="deliveries.ack", status=409,
                        make=stale_proof_ws)  # fmt: skip


WORKFLOW = {
    "steps": [
        {"id": "wait", "type": "wait_signal", "signal": "go"},
        {"id": "done", "type": "succeed", "output": {"$": "$.steps.wait.output"}},
    ]
}


async def test_workflow_conflicts(env: Env, db: Database) -> None:
    ns = env.ns
    async with env.http() as http:
        wf = unique("wf")
        r = await http.post(f"/v1/namespaces/{ns}/workflows/{wf}/versions",
                            json={"definition": WORKFLOW})  # fmt: skip
        assert r.status_code == 201, r.text
        r = await http.post(f"/v1/namespaces/{ns}/workflows/{wf}/instances", json={"input": {}})
        assert r.status_code == 201, r.text
        iid = r.json()["id"]
        signal = f"/v1/namespaces/{ns}/instances/{iid}/signals/go"
        first = await http.post(signal, json={"signal_id": "s1", "payload": {"n": 1}})
        assert first.status_code == 201, first.text

        async def signal_id_reused() -> None:
            r = await http.post(signal, json={"signal_id": "s1", "payload": {"n": 2}})
            _expect(r, 409, "conflict")

        await _walk(env, db, kind="signal_id_reused", action="workflows.signal", status=409,
                    make=signal_id_reused)  # fmt: skip

        r = await http.post(f"/v1/namespaces/{ns}/workflows/{wf}/instances", json={"input": {}})
        other = r.json()["id"]
        c = await http.post(f"/v1/namespaces/{ns}/instances/{other}/cancel")
        assert c.status_code == 200, c.text

        async def instance_state() -> None:
            r = await http.post(f"/v1/namespaces/{ns}/instances/{other}/pause")
            _expect(r, 409, "conflict")

        await _walk(env, db, kind="instance_state", action="workflows.pause", status=409,
                    make=instance_state)  # fmt: skip


@pytest.mark.parametrize("kind", ["stale_proof", "stale_token", "quota_exceeded"])
def test_every_kind_named_in_the_metrics_docs_is_walked(kind: str) -> None:
    """Runs after the walks (file order): the kinds clients hit most are covered."""
    assert kind in WALKED
