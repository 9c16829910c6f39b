"""The node's fair share of HTTP request handling (orbit/request_share.py) in the real
application: one application's burst of requests in progress cannot make another
application's request wait behind it, and a burst past its queue is refused 429
``rate_limited`` with ``Retry-After`` before anything of it is done.

A test route holds its requests in progress until the test lets them go, so the order in
which requests are served is observed, not timed."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from dataclasses import dataclass, field

import httpx
import pytest
from platform_fixtures import asgi_client, new_tenant, pulse_routes
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

from orbit.context import AppContext
from orbit.http.app import build_app
from orbit.http.auth import authenticated
from orbit.request_share import RequestShare, ShareSettings
from orbit.settings import Settings
from orbit.storage import Database

SLOTS = 4


@dataclass
class Holds:
    """Requests of the hold route: the order they got in, and the gate that lets them go."""

    entered: list[str] = field(default_factory=list)
    release: asyncio.Event = field(default_factory=asyncio.Event)


@pytest.fixture
async def app(db: Database) -> AsyncIterator[tuple[httpx.AsyncClient, RequestShare, Holds]]:
    holds = Holds()

    async def hold(request: Request) -> Response:
        principal = await authenticated(request)
        holds.entered.append(request.query_params.get("tag", ""))
        await holds.release.wait()
        return JSONResponse({"application": principal.application_id.hex()})

    ctx = AppContext(db=db, settings=Settings())
    share = RequestShare(
        ShareSettings(slots=SLOTS, tenant_queue=8, hold_s=3600, wait_s=3600, active_window_s=3600)
    )
    ctx.request_share = share
    async with asgi_client(
        build_app(ctx, [*pulse_routes(ctx), Route("/test/hold", hold)])
    ) as client:
        yield client, share, holds


async def _until(predicate: object, what: str) -> None:
    for _ in range(2000):
        if callable(predicate) and predicate():
            return
        await asyncio.sleep(0.005)
    raise AssertionError(f"never: {what}")


async def test_a_burst_of_one_application_does_not_queue_another(
    app: tuple[httpx.AsyncClient, RequestShare, Holds], db: Database
) -> None:
    client, share, holds = app
    flood, quiet = await new_tenant(db), await new_tenant(db)
    flood_auth = {"Authorization": f"Bearer {flood.key}"}
    quiet_auth = {"Authorization": f"Bearer {quiet.key}"}
    ns = f"/v1/namespaces/{quiet.namespace}"
    assert (await client.put(f"{ns}/queues/q", json={}, headers=quiet_auth)).status_code == 201
    holds.release.set()  # one request each, so the node knows both keys
    assert (await client.get("/test/hold", headers=flood_auth)).status_code == 200
    holds.release.clear()
    holds.entered.clear()

    burst = [
        asyncio.create_task(client.get("/test/hold", params={"tag": f"f{i}"}, headers=flood_auth))
        for i in range(SLOTS + 4)
    ]
    flood_key = ("app", flood.application_id)
    # The quiet application was active a moment ago: the flood holds its share, the rest
    # of its burst waits in its own queue, though slots are free.
    await _until(lambda: len(holds.entered) == share.share() and share.waiting(flood_key) > 0,
                 "the flood's share in progress")  # fmt: skip
    in_progress = len(holds.entered)
    assert in_progress < SLOTS
    assert share.waiting(flood_key) == SLOTS + 4 - in_progress

    # The quiet application's requests are served while the flood's burst is still waiting.
    r = await client.post(f"{ns}/tasks", json={"queue": "q", "kind": "k", "payload": {}},
                          headers=quiet_auth)  # fmt: skip
    assert r.status_code == 201, r.text
    task = await client.get(f"{ns}/tasks/{r.json()['id']}", headers=quiet_auth)
    assert task.status_code == 200
    assert len(holds.entered) == in_progress  # no flood request got in meanwhile
    assert share.waiting(flood_key) == SLOTS + 4 - in_progress

    holds.release.set()  # the burst drains: every request is served in its turn
    results = await asyncio.gather(*burst)
    assert [x.status_code for x in results] == [200] * (SLOTS + 4)
    assert sorted(holds.entered) == sorted(f"f{i}" for i in range(SLOTS + 4))
    assert share.in_use == 0


async def test_a_burst_past_its_queue_is_refused_early(
    app: tuple[httpx.AsyncClient, RequestShare, Holds], db: Database
) -> None:
    client, share, holds = app
    flood = await new_tenant(db)
    flood_auth = {"Authorization": f"Bearer {flood.key}"}
    holds.release.set()
    assert (await client.get("/test/hold", headers=flood_auth)).status_code == 200
    holds.release.clear()
    flood_key = ("app", flood.application_id)

    burst = [asyncio.create_task(client.get("/test/hold", headers=flood_auth)) for _ in range(16)]
    await _until(lambda: sum(t.done() for t in burst) == 16 - 8 - share.share()
                 and len(holds.entered) == 1 + share.share(),
                 "a full queue, the rest refused")  # fmt: skip
    held = share.held[flood_key]
    assert share.waiting(flood_key) == 8 and held == share.share()
    over = await client.get("/test/hold", headers=flood_auth)
    assert over.status_code == 429
    assert over.headers["Retry-After"] == "1"
    assert over.json()["error"]["code"] == "rate_limited"
    assert over.json()["error"]["details"]["reason"] == "request_share"
    assert len(holds.entered) == 1 + held  # the refused requests never reached the handler
    holds.release.set()
    statuses = sorted(x.status_code for x in await asyncio.gather(*burst))
    assert statuses == [200] * (held + 8) + [429] * (16 - 8 - held), statuses
