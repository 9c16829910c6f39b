"""Edge values and odd requests answer a 4xx naming what is wrong, never 500: sequence numbers
beyond the 64-bit range, an ``available_at`` so early that the dispatch order leaves the
range of times, the names ``.`` and ``..``, bodies that are not JSON (415), and a client that
goes away in the middle of its body (counted as 499, not as an error)."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncIterator
from typing import Any

import httpx
import pytest
from platform_fixtures import PTenant, asgi_client, make_app, new_tenant, pulse_weave_routes
from starlette.applications import Starlette

import orbit.http.subscriptions as sub_routes
from orbit.storage import Database


@pytest.fixture(scope="module")
def app(db: Database) -> Starlette:
    return make_app(db, lambda ctx: [*sub_routes.routes(), *pulse_weave_routes(ctx)],
                    body_timeout_s=0.5)  # fmt: skip


@pytest.fixture(scope="module")
async def client(app: Starlette) -> AsyncIterator[httpx.AsyncClient]:
    async with asgi_client(app) as c:
        yield c


@pytest.fixture(scope="module")
async def tenant(client: httpx.AsyncClient, db: Database) -> PTenant:
    t = await new_tenant(db)
    r = await client.put(f"/v1/namespaces/{t.namespace}/queues/q", json={}, headers=t.auth)
    assert r.status_code == 201, r.text
    return t


def _field(r: httpx.Response) -> Any:
    assert r.status_code == 400, r.text
    assert r.json()["error"]["code"] == "invalid_request"
    return r.json()["error"]["details"].get("field")


async def test_sequence_numbers_beyond_64_bits_are_400(
    client: httpx.AsyncClient, tenant: PTenant
) -> None:
    ns = f"/v1/namespaces/{tenant.namespace}"
    r = await client.put(f"{ns}/subscriptions/big", json={"start": {"after_seq": 2**64}},
                         headers=tenant.auth)  # fmt: skip
    assert _field(r) in ("start", "start.after_seq")
    assert (await client.get(f"{ns}/subscriptions/big", headers=tenant.auth)).status_code == 404
    r = await client.get(f"{ns}/events", params={"after_seq": 2**64}, headers=tenant.auth)
    assert _field(r) == "after_seq"


@pytest.mark.parametrize("available_at", ["0001-01-01T00:00:00Z", "0001-01-01T00:00:00+05:00",
                                          "1969-12-31T23:59:59Z"])  # fmt: skip
async def test_an_available_at_before_1970_is_400(
    client: httpx.AsyncClient, tenant: PTenant, available_at: str
) -> None:
    body = {"queue": "q", "kind": "k", "payload": {}, "available_at": available_at, "priority": 9}
    r = await client.post(f"/v1/namespaces/{tenant.namespace}/tasks", json=body,
                          headers=tenant.auth)  # fmt: skip
    assert _field(r) == "available_at"
    r = await client.post(f"/v1/namespaces/{tenant.namespace}/tasks:batch",
                          json={"tasks": [body]}, headers=tenant.auth)  # fmt: skip
    assert r.status_code in (200, 207, 400), r.text
    assert "available_at" in r.text


@pytest.mark.parametrize("name", [".", ".."])
async def test_dot_names_are_refused(
    client: httpx.AsyncClient, tenant: PTenant, name: str
) -> None:
    ns = f"/v1/namespaces/{tenant.namespace}"
    escaped = name.replace(".", "%2E")
    r = await client.post(f"/v1/applications/{tenant.app_hex}/namespaces", json={"name": name},
                          headers=tenant.auth)  # fmt: skip
    assert _field(r) == "name"
    for path in (f"{ns}/queues/{escaped}", f"{ns}/subscriptions/{escaped}"):
        r = await client.put(path, json={}, headers=tenant.auth)
        assert r.status_code == 400, (path, r.text)
        assert r.json()["error"]["details"]["field"] in ("name", "queue")
    r = await client.post("/v1/applications", json={"name": name}, headers=tenant.auth)
    assert r.status_code in (400, 403), r.text
    # Longer names with dots are names.
    r = await client.put(f"{ns}/queues/{name}.x", json={}, headers=tenant.auth)
    assert r.status_code == 201, r.text


@pytest.mark.parametrize("content_type", ["text/plain", "application/x-www-form-urlencoded",
                                          "multipart/form-data; boundary=x"])  # fmt: skip
async def test_bodies_that_are_not_json_are_415(
    client: httpx.AsyncClient, tenant: PTenant, content_type: str
) -> None:
    url = f"/v1/namespaces/{tenant.namespace}/tasks"
    body = b'{"queue": "q", "kind": "k", "payload": {}}'
    r = await client.post(url, content=body, headers={**tenant.auth, "Content-Type": content_type})
    assert r.status_code == 415, r.text
    assert r.json()["error"]["code"] == "unsupported_media_type"


@pytest.mark.parametrize("content_type", [None, "application/json",
                                          "application/json; charset=utf-8",
                                          "application/merge-patch+json"])  # fmt: skip
async def test_json_bodies_are_taken(
    client: httpx.AsyncClient, tenant: PTenant, content_type: str | None
) -> None:
    url = f"/v1/namespaces/{tenant.namespace}/tasks"
    body = b'{"queue": "q", "kind": "k", "payload": {}}'
    headers = dict(tenant.auth)
    if content_type is not None:
        headers["Content-Type"] = content_type
    r = await client.post(url, content=body, headers=headers)
    assert r.status_code == 201, r.text


async def test_a_body_slower_than_the_deadline_is_408(
    client: httpx.AsyncClient, tenant: PTenant
) -> None:
    async def trickle() -> AsyncIterator[bytes]:
        yield b'{"queue": "q",'
        await asyncio.sleep(3)
        yield b' "kind": "k", "payload": {}}'

    url = f"/v1/namespaces/{tenant.namespace}/tasks"
    started = asyncio.get_running_loop().time()
    r = await client.post(url, content=trickle(), headers=tenant.auth)
    assert r.status_code == 408, r.text
    assert r.json()["error"]["code"] == "request_timeout"
    assert r.headers["connection"] == "close"
    assert asyncio.get_running_loop().time() - started < 2.5


async def test_a_client_gone_mid_body_is_not_an_error(
    app: Starlette, tenant: PTenant, caplog: pytest.LogCaptureFixture
) -> None:
    messages: list[dict[str, Any]] = [
        {"type": "http.request", "body": b'{"queue": "q"', "more_body": True},
        {"type": "http.disconnect"},
    ]
    sent: list[dict[str, Any]] = []

    async def receive() -> dict[str, Any]:
        return messages.pop(0) if messages else {"type": "http.disconnect"}

    async def send(message: dict[str, Any]) -> None:
        sent.append(message)

    path = f"/v1/namespaces/{tenant.namespace}/tasks"
    scope = {
        "type": "http", "asgi": {"version": "3.0"}, "http_version": "1.1", "method": "POST",
        "scheme": "http", "path": path, "raw_path": path.encode(), "root_path": "",
        "query_string": b"", "server": ("orbit.test", 80), "client": ("127.0.0.1", 1),
        "headers": [(b"host", b"orbit.test"), (b"content-type", b"application/json"),
                    (b"authorization", f"Bearer {tenant.key}".encode())],
    }  # fmt: skip
    with caplog.at_level(logging.INFO, logger="orbit.http"):
        await app(scope, receive, send)  # type: ignore[arg-type]
    assert not [r for r in caplog.records if r.levelno >= logging.ERROR], caplog.text
    assert not any(m.get("status") == 500 for m in sent)
    metrics = app.state.ctx.metrics.render()
    assert 'route="/v1/namespaces/{ns}/tasks",method="POST",status="499"' in metrics


async def test_openapi_describes_the_body_rules_and_budgets(client: httpx.AsyncClient) -> None:
    doc = (await client.get("/openapi.json")).json()
    tasks = doc["paths"]["/v1/namespaces/{ns}/tasks"]
    assert {"408", "413", "415"} <= set(tasks["post"]["responses"])
    assert "429" in tasks["get"]["responses"]  # the list-bytes budget
    assert "429" in doc["paths"]["/v1/namespaces/{ns}/events"]["get"]["responses"]
    put = doc["paths"]["/v1/namespaces/{ns}/subscriptions/{name}"]["put"]["responses"]
    assert {"408", "415", "429"} <= set(put)  # the subscription quota
    assert "415" not in tasks["get"]["responses"]
