"""OrbitClient and SyncOrbitClient against a recording fake of the HTTP API.

The fake is a small Starlette app reached through ``httpx.ASGITransport``: it records every
request (method, path, query, headers, exact body bytes) and answers with what the test
scripted, so these tests pin what the SDK sends and how it reads answers and errors.
"""

from __future__ import annotations

import json
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass, field
from typing import Any

import httpx
import msgspec
import pytest
from orbit_sdk import (
    NotFound,
    OrbitClient,
    OrbitConnectionError,
    PreconditionFailed,
    QuotaExceeded,
    RetryPolicy,
    SyncOrbitClient,
    TaskSpec,
    TaskState,
)
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route

BASE = "http://orbit.test"
KEY = "sk_live_secret_key"
TASK_ID = "a" * 32


@dataclass
class Seen:
    method: str
    path: str
    query: dict[str, str]
    headers: dict[str, str]
    body: bytes


Answer = tuple[int, Any, dict[str, str]]


@dataclass
class FakeApi:
    """Answers scripted per ``(method, path)``: a fixed answer or a function of the request."""

    answers: dict[tuple[str, str], Answer | Callable[[Seen], Answer]] = field(default_factory=dict)
    seen: list[Seen] = field(default_factory=list)

    def on(
        self, method: str, path: str, status: int = 200, body: Any = None, **headers: str
    ) -> None:
        self.answers[(method, path)] = (
            status,
            body,
            {k.replace("_", "-"): v for k, v in headers.items()},
        )

    async def handle(self, request: Request) -> Response:
        seen = Seen(
            request.method,
            request.url.path,
            dict(request.query_params),
            {k.lower(): v for k, v in request.headers.items()},
            await request.body(),
        )
        self.seen.append(seen)
        answer = self.answers.get((seen.method, seen.path))
        if answer is None:
            return Response(
                b'{"error":{"code":"not_found","message":"no route","details":{}}}', 404
            )
        status, body, headers = answer(seen) if callable(answer) else answer
        content = body if isinstance(body, bytes) else json.dumps(body).encode()
        return Response(content, status, headers=headers, media_type="application/json")

    @property
    def last(self) -> Seen:
        return self.seen[-1]


def task_json(**overrides: Any) -> dict[str, Any]:
    task = {
        "id": TASK_ID,
        "queue": "emails",
        "owner_id": "b" * 32,
        "kind": "send",
        "state": "WAITING",
        "priority": 5,
        "payload": {"user": 42},
        "result": None,
        "error": None,
        "attempts": 0,
        "max_attempts": 3,
        "effect_uncertain": False,
        "created_at": "2026-11-29T21:30:00.123456Z",
        "revision": 1,
    }
    task.update(overrides)
    return task


@pytest.fixture
def api() -> FakeApi:
    return FakeApi()


def _http(api: FakeApi) -> httpx.AsyncClient:
    app = Starlette(
        routes=[Route("/{path:path}", api.handle, methods=["GET", "POST", "PUT", "DELETE"])]
    )
    return httpx.AsyncClient(transport=httpx.ASGITransport(app=app))


@pytest.fixture
async def client(api: FakeApi) -> AsyncIterator[OrbitClient]:
    async with _http(api) as http, OrbitClient(BASE, KEY, namespace="ns", http=http) as orbit:
        yield orbit


async def test_submit_sends_exact_payload_bytes_and_idempotency_key(
    api: FakeApi, client: OrbitClient
) -> None:
    api.on("POST", "/v1/namespaces/ns/tasks", 201, task_json())
    exact = b'{"amount": 1.10, "n": 12345678901234567890}'
    task = await client.tasks.submit(
        "emails",
        "send",
        msgspec.Raw(exact),
        dedup_key="user-42",
        priority=5,
        idempotency_key="idem-1",
    )
    seen = api.last
    assert seen.headers["authorization"] == f"Bearer {KEY}"
    assert seen.headers["idempotency-key"] == "idem-1"
    assert seen.headers["content-type"] == "application/json"
    assert exact in seen.body, "a Raw payload must be sent byte for byte"
    body = json.loads(seen.body)
    assert body == {
        "queue": "emails",
        "kind": "send",
        "payload": json.loads(exact),
        "dedup_key": "user-42",
        "priority": 5,
    }, "unset options are not sent"
    assert task.id == TASK_ID and task.state == TaskState.WAITING and not task.deduplicated
    assert task.decode_payload() == {"user": 42} and task.decode_result() is None


async def test_submit_dedup_hit_and_plain_payload(api: FakeApi, client: OrbitClient) -> None:
    api.on("POST", "/v1/namespaces/ns/tasks", 200, task_json(deduplicated=True))
    task = await client.tasks.submit("emails", "send", {"user": 42})
    assert task.deduplicated
    assert "idempotency-key" not in api.last.headers
    assert json.loads(api.last.body)["payload"] == {"user": 42}


async def test_submit_batch_reports_items_in_order(api: FakeApi, client: OrbitClient) -> None:
    api.on(
        "POST",
        "/v1/namespaces/ns/tasks:batch",
        200,
        {
            "items": [
                {"status": 201, "task": task_json()},
                {"status": 400, "error": {"code": "invalid_request", "message": "bad"}},
            ]
        },
    )
    items = await client.tasks.submit_batch(
        [TaskSpec(queue="emails", kind="send", payload=1), {"queue": "emails", "kind": ""}],
        idempotency_key="b-1",
    )
    assert [i.status for i in items] == [201, 400] and items[0].ok and not items[1].ok
    assert items[0].task is not None and items[0].task.id == TASK_ID
    assert json.loads(api.last.body) == {
        "tasks": [
            {"queue": "emails", "kind": "send", "payload": 1},
            {"queue": "emails", "kind": ""},
        ]
    }
    assert api.last.headers["idempotency-key"] == "b-1"


async def test_list_and_iter_follow_cursors_with_filters(api: FakeApi, client: OrbitClient) -> None:
    def pages(seen: Seen) -> Answer:
        cursor = seen.query.get("cursor")
        if cursor is None:
            return (
                200,
                {"items": [task_json(id="1" * 32), task_json(id="2" * 32)], "next_cursor": "c2"},
                {},
            )
        return 200, {"items": [task_json(id="3" * 32)], "next_cursor": None}, {}

    api.answers[("GET", "/v1/namespaces/ns/tasks")] = pages
    page = await client.tasks.list(queue="emails", state="WAITING", limit=2)
    assert [t.id[0] for t in page.items] == ["1", "2"] and page.next_cursor == "c2"
    assert api.last.query == {"queue": "emails", "state": "WAITING", "limit": "2"}
    ids = [t.id[0] async for t in client.tasks.iter(owner_id="o", page_size=2)]
    assert ids == ["1", "2", "3"]
    assert api.seen[-1].query == {"owner_id": "o", "limit": "2", "cursor": "c2"}


async def test_cancel_running_task_marks_cancel_requested(
    api: FakeApi, client: OrbitClient
) -> None:
    api.on("POST", f"/v1/namespaces/ns/tasks/{TASK_ID}/cancel", 202, task_json(state="RUNNING"))
    task = await client.tasks.cancel(TASK_ID)
    assert task.cancel_requested and task.state == "RUNNING"
    api.on("POST", "/v1/namespaces/ns/tasks:cancel", 200, {"cancelled": 4, "cancel_requested": 1})
    result = await client.tasks.cancel_all(owner_id="o" * 32)
    assert (result.cancelled, result.cancel_requested) == (4, 1)
    assert json.loads(api.last.body) == {"owner_id": "o" * 32}


async def test_resolve_attempts_events_and_wait(api: FakeApi, client: OrbitClient) -> None:
    api.on(
        "POST",
        f"/v1/namespaces/ns/tasks/{TASK_ID}/resolve",
        200,
        task_json(state="SUCCEEDED", result=[1]),
    )
    task = await client.tasks.resolve(TASK_ID, "succeed", note="checked by hand", result=[1])
    assert json.loads(api.last.body) == {
        "action": "succeed",
        "note": "checked by hand",
        "result": [1],
    }
    assert task.decode_result() == [1] and task.is_terminal

    api.on(
        "GET",
        f"/v1/namespaces/ns/tasks/{TASK_ID}/attempts",
        200,
        {
            "items": [{"id": "c" * 32, "generation": 1, "state": "FAILED", "evidence": {"x": 1}}],
            "next_cursor": None,
        },
    )
    attempts = await client.tasks.attempts(TASK_ID)
    assert attempts[0].generation == 1 and attempts[0].evidence == {"x": 1}

    event = {
        "seq": 7,
        "event_id": "d" * 32,
        "type": "task.succeeded",
        "task_id": TASK_ID,
        "state": "SUCCEEDED",
        "result": {"ok": 1.5},
    }
    api.on(
        "GET",
        "/v1/namespaces/ns/events",
        200,
        {"items": [event], "next_cursor": None, "next_after_seq": 7},
    )
    events = await client.tasks.events(after_seq=6, limit=10)
    assert api.last.query == {"after_seq": "6", "limit": "10"}
    assert events.items[0].seq == 7 and events.items[0].decode_result() == {"ok": 1.5}
    assert events.next_after_seq == 7

    states = iter(["WAITING", "RUNNING", "SUCCEEDED"])
    api.answers[("GET", f"/v1/namespaces/ns/tasks/{TASK_ID}")] = lambda s: (
        200,
        task_json(state=next(states)),
        {},
    )
    done = await client.tasks.wait(TASK_ID, timeout=5, interval=0.001)
    assert done.state == "SUCCEEDED"


async def test_queue_put_get_with_etags(api: FakeApi, client: OrbitClient) -> None:
    api.on(
        "PUT",
        "/v1/namespaces/ns/queues/emails",
        201,
        {"name": "emails", "lease_ms": 30000},
        etag='"1"',
    )
    queue = await client.queues.put(
        "emails",
        lease_ms=30000,
        max_concurrency=None,
        retry=RetryPolicy(max_attempts=5, backoff_initial_ms=100),
        create_only=True,
    )
    assert queue.created and queue.etag == '"1"'
    assert api.last.headers["if-none-match"] == "*"
    assert json.loads(api.last.body) == {
        "max_concurrency": None,
        "lease_ms": 30000,
        "retry": {"max_attempts": 5, "backoff_initial_ms": 100},
    }
    api.on(
        "GET",
        "/v1/namespaces/ns/queues/emails",
        200,
        {"name": "emails", "counts": {"WAITING": 3}},
        etag='"2"',
    )
    current = await client.queues.get("emails")
    assert current.counts == {"WAITING": 3} and current.etag == '"2"' and not current.created
    api.on(
        "PUT",
        "/v1/namespaces/ns/queues/emails",
        412,
        {"error": {"code": "precondition_failed", "message": "etag", "details": {}}},
    )
    with pytest.raises(PreconditionFailed):
        await client.queues.put("emails", lease_ms=1000, if_match='"1"')
    assert api.last.headers["if-match"] == '"1"'
    api.on("POST", "/v1/namespaces/ns/queues/emails/pause", 200, {"paused": True})
    assert await client.queues.pause("emails") == {"paused": True}
    api.on(
        "GET", "/v1/namespaces/ns/queues", 200, {"items": [{"name": "emails"}], "next_cursor": None}
    )
    assert [q.name async for q in client.queues.iter()] == ["emails"]


async def test_errors_map_to_classes_with_retry_after(api: FakeApi, client: OrbitClient) -> None:
    api.on(
        "POST",
        "/v1/namespaces/ns/tasks",
        429,
        {"error": {"code": "quota_exceeded", "message": "too many", "details": {"limit": 10}}},
        retry_after="3",
    )
    with pytest.raises(QuotaExceeded) as info:
        await client.tasks.submit("emails", "send")
    assert info.value.retry_after == 3 and info.value.details == {"limit": 10}
    with pytest.raises(NotFound):
        await client.tasks.get("f" * 32)


async def test_admin_calls_and_secret_key_not_in_repr(api: FakeApi, client: OrbitClient) -> None:
    api.on("POST", "/v1/applications", 201, {"id": "1" * 32, "name": "shop"})
    app = await client.admin.create_application("shop", idempotency_key="app-1")
    assert app.id == "1" * 32 and api.last.headers["idempotency-key"] == "app-1"
    api.on("POST", f"/v1/applications/{app.id}/namespaces", 201, {"id": "2" * 32, "name": "prod"})
    ns = await client.admin.create_namespace(app.id, "prod")
    assert ns.name == "prod"
    api.on(
        "POST",
        f"/v1/applications/{app.id}/credentials",
        201,
        {"id": "3" * 32, "key": "sk_new_secret"},
    )
    cred = await client.admin.create_credential(
        app.id, "w", namespaces=["prod"], actions=["workers.connect"]
    )
    assert cred.key == "sk_new_secret" and "sk_new_secret" not in repr(cred)
    assert json.loads(api.last.body) == {
        "name": "w",
        "namespaces": ["prod"],
        "actions": ["workers.connect"],
    }
    api.on("DELETE", f"/v1/credentials/{cred.id}", 204, b"")
    await client.admin.revoke_credential(cred.id)
    assert KEY not in repr(client)


async def test_with_namespace_and_missing_namespace(api: FakeApi, client: OrbitClient) -> None:
    api.on("GET", f"/v1/namespaces/other/tasks/{TASK_ID}", 200, task_json())
    other = client.with_namespace("other")
    assert (await other.tasks.get(TASK_ID)).id == TASK_ID
    await other.aclose()  # does not close the shared pool
    api.on("GET", f"/v1/namespaces/ns/tasks/{TASK_ID}", 200, task_json())
    assert (await client.tasks.get(TASK_ID)).id == TASK_ID
    bare = OrbitClient(BASE, KEY, _transport=None)
    with pytest.raises(ValueError, match="namespace"):
        await bare.tasks.get(TASK_ID)
    await bare.aclose()


async def test_unreachable_server_raises_connection_error() -> None:
    async with OrbitClient("http://127.0.0.1:9", KEY, namespace="ns", timeout=2) as orbit:
        with pytest.raises(OrbitConnectionError):
            await orbit.tasks.get(TASK_ID)


def test_sync_client_mirrors_the_async_one(api: FakeApi) -> None:
    api.on("POST", "/v1/namespaces/ns/tasks", 201, task_json())
    api.on("GET", "/v1/namespaces/ns/tasks", 200, {"items": [task_json()], "next_cursor": None})
    with SyncOrbitClient(BASE, KEY, namespace="ns", http=_http(api)) as orbit:
        task = orbit.tasks.submit("emails", "send", {"user": 42}, idempotency_key="s-1")
        assert task.id == TASK_ID and api.last.headers["idempotency-key"] == "s-1"
        assert [t.id for t in orbit.tasks.iter(queue="emails")] == [TASK_ID]
        with pytest.raises(NotFound):
            orbit.queues.get("nope")
