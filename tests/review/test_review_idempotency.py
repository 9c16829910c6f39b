"""Review: an Idempotency-Key digest must tell apart bodies whose numbers differ only beyond
double precision (business JSON is stored byte for byte,
docs/invariants.md#10-business-json-keeps-its-numbers)."""

from __future__ import annotations

from collections.abc import AsyncIterator

import httpx
import pytest
from platform_fixtures import make_app, pulse_routes

from orbit.idempotency import request_digest
from orbit.storage import Database


def test_digest_keeps_numbers_beyond_double_precision() -> None:
    a = request_digest("POST", "/p", b'{"amount": 0.30000000000000001}')
    b = request_digest("POST", "/p", b'{"amount": 0.3}')
    c = request_digest("POST", "/p", b'{ "amount":0.30000000000000001 }')
    assert a != b
    assert a == c  # spacing still does not matter
    big = request_digest("POST", "/p", b'{"n": 123456789012345678901234567890.5}')
    assert big != request_digest("POST", "/p", b'{"n": 123456789012345678901234567890.6}')


@pytest.fixture
async def http(db: Database) -> AsyncIterator[httpx.AsyncClient]:
    app = make_app(db, pulse_routes)
    transport = httpx.ASGITransport(app=app)
    async with httpx.AsyncClient(transport=transport, base_url="http://orbit.test") as client:
        yield client


async def test_same_key_other_amount_is_422_not_a_replay(http: httpx.AsyncClient, tenant) -> None:
    t = await tenant()
    url = f"/v1/namespaces/{t.namespace}/tasks"
    headers = {**t.auth, "Idempotency-Key": "pay-1", "Content-Type": "application/json"}
    first = b'{"queue": "default", "kind": "pay", "payload": {"amount": 0.30000000000000001}}'
    other = b'{"queue": "default", "kind": "pay", "payload": {"amount": 0.3}}'
    r1 = await http.post(url, content=first, headers=headers)
    assert r1.status_code == 201
    r2 = await http.post(url, content=other, headers=headers)
    assert r2.status_code == 422, r2.text
    assert r2.json()["error"]["code"] == "idempotency_mismatch"
    r3 = await http.post(url, content=first, headers=headers)
    assert r3.status_code == 201 and r3.headers["Idempotent-Replayed"] == "true"
    assert r3.content == r1.content
