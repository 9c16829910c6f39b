"""Admission of worker traffic (pulse/http/admission.py), against a real uvicorn: bounded
``heartbeat.attempt_ids``, a frame budget per stream (close 1008), a heartbeat budget per
session (stream: close 1008; HTTP: 429 with Retry-After)."""

from __future__ import annotations

import asyncio
import json
import time

import websockets
from platform_fixtures import bearer
from test_pulse_worker_ws import Worker, open_session, stream_url
from test_pulse_worker_ws import client as client  # fixtures
from test_pulse_worker_ws import live as live

from pulse.http.admission import Admission, AdmissionSettings


async def _closed_with(ws: websockets.ClientConnection, within: float) -> tuple[int, list[dict]]:
    """Read until the server closes; (close code, frames seen)."""
    frames = []
    end = time.monotonic() + within
    try:
        while time.monotonic() < end:
            raw = await asyncio.wait_for(ws.recv(), max(0.01, end - time.monotonic()))
            frames.append(json.loads(raw))
    except websockets.ConnectionClosed:
        assert ws.close_code is not None
        return ws.close_code, frames
    raise AssertionError(f"still open after {within}s; last frames {frames[-3:]}")


async def test_a_heartbeat_lists_at_most_the_sessions_capacity(live, client, tenant) -> None:
    """Before: 20,000 ids in one frame cost the node ~0.8 s and returned 2.2 MB."""
    t = await tenant()
    created = (await open_session(client, t, max_concurrency=2)).json()
    ids = [f"{i:032x}" for i in range(20_000)]
    async with websockets.connect(
        stream_url(live, t, created["session_id"]),
        additional_headers=bearer(created["session_token"]), max_size=None,
    ) as ws:  # fmt: skip
        w = Worker(ws)
        started = time.perf_counter()
        reply = await w.call("heartbeat", attempt_ids=ids)
        assert time.perf_counter() - started < 5
        assert reply["type"] == "error" and reply["code"] == "invalid_request", reply
        assert reply["details"]["field"] == "attempt_ids"
        ok = await w.call("heartbeat", attempt_ids=ids[:2])  # the stream stays open
        assert ok["type"] == "heartbeat_ok"
    sid, token = created["session_id"], created["session_token"]
    r = await client.post(
        f"/v1/namespaces/{t.namespace}/workers/sessions/{sid}/heartbeat",
        json={"attempt_ids": ids[:3]}, headers=bearer(token),
    )  # fmt: skip
    assert r.status_code == 400 and r.json()["error"]["details"]["field"] == "attempt_ids"


async def test_a_heartbeat_flood_closes_the_stream_with_1008(live, client, tenant) -> None:
    """A worker heartbeats once per ``heartbeat_ms``; thousands a second (each a locking
    transaction) is a flood: the stream gets ``rate_limited`` and is closed with 1008."""
    t = await tenant()
    created = (await open_session(client, t, max_concurrency=1)).json()
    async with websockets.connect(
        stream_url(live, t, created["session_id"]),
        additional_headers=bearer(created["session_token"]),
    ) as ws:  # fmt: skip
        for i in range(300):
            await ws.send(json.dumps({"type": "heartbeat", "msg_id": f"h{i}", "attempt_ids": []}))
        code, frames = await _closed_with(ws, 20)
    assert code == 1008
    assert any(f["type"] == "error" and f["code"] == "rate_limited" for f in frames)
    # At most the budget's burst was answered before the close.
    assert sum(f["type"] == "heartbeat_ok" for f in frames) <= 30
    counter = live.ctx.metrics.counter("pulse_worker_frames_refused_total", "", ("reason",))
    assert counter.value(reason="heartbeat_budget") >= 1


async def test_a_frame_flood_closes_the_stream_with_1008(live, client, tenant) -> None:
    live.runtime.admission = Admission(
        AdmissionSettings(frame_rate=10, frame_burst=50), metrics=live.ctx.metrics
    )
    t = await tenant()
    created = (await open_session(client, t, max_concurrency=1)).json()
    async with websockets.connect(
        stream_url(live, t, created["session_id"]),
        additional_headers=bearer(created["session_token"]),
    ) as ws:  # fmt: skip
        for _ in range(500):
            await ws.send("{not json")
        code, frames = await _closed_with(ws, 20)
    assert code == 1008
    assert frames[-1]["type"] == "error" and frames[-1]["code"] == "rate_limited"
    assert len(frames) <= 60  # the burst's bad-frame errors, then the refusal


async def test_http_heartbeats_have_the_same_budget(live, client, tenant) -> None:
    t = await tenant()
    created = (await open_session(client, t, max_concurrency=1)).json()
    sid, token = created["session_id"], created["session_token"]
    url = f"/v1/namespaces/{t.namespace}/workers/sessions/{sid}/heartbeat"
    statuses = []
    for _ in range(60):
        r = await client.post(url, json={"attempt_ids": []}, headers=bearer(token))
        statuses.append(r.status_code)
        if r.status_code == 429:
            assert r.json()["error"]["code"] == "rate_limited"
            assert int(r.headers["retry-after"]) >= 1
            break
    assert statuses[-1] == 429 and statuses.count(200) <= 25, statuses


async def test_a_stream_closed_for_its_budget_cools_down(live, client, tenant) -> None:
    """Before: a flood reconnected at once and got a fresh burst each time (16 reconnects a
    second, each a session check and a bind). Now the session's next upgrade within the
    cool-down is refused with 429 and Retry-After before any database work."""
    t = await tenant()
    created = (await open_session(client, t, max_concurrency=1)).json()
    url = stream_url(live, t, created["session_id"])
    headers = bearer(created["session_token"])
    async with websockets.connect(url, additional_headers=headers) as ws:
        for i in range(300):
            await ws.send(json.dumps({"type": "heartbeat", "msg_id": f"h{i}", "attempt_ids": []}))
        code, _ = await _closed_with(ws, 20)
    assert code == 1008
    try:
        async with websockets.connect(url, additional_headers=headers):
            raise AssertionError("the upgrade was accepted during the cool-down")
    except websockets.InvalidStatus as exc:
        assert exc.response.status_code == 429
        assert int(exc.response.headers["Retry-After"]) >= 1
        assert json.loads(exc.response.body)["error"]["code"] == "rate_limited"
    counter = live.ctx.metrics.counter("pulse_worker_frames_refused_total", "", ("reason",))
    assert counter.value(reason="cooling_down") >= 1
    await asyncio.sleep(2.1)  # cooled down: the session's stream works again
    async with websockets.connect(url, additional_headers=headers) as ws:
        reply = await Worker(ws).call("heartbeat", attempt_ids=[])
        assert reply["type"] == "heartbeat_ok", reply
        for i in range(300):  # and floods again: the next cool-down is twice as long
            await ws.send(json.dumps({"type": "heartbeat", "msg_id": f"g{i}", "attempt_ids": []}))
        code, _ = await _closed_with(ws, 20)
    assert code == 1008
    try:
        async with websockets.connect(url, additional_headers=headers):
            raise AssertionError("the upgrade was accepted during the second cool-down")
    except websockets.InvalidStatus as exc:
        assert exc.response.status_code == 429
        assert int(exc.response.headers["Retry-After"]) >= 2


async def test_a_stream_of_refused_frames_is_closed_with_1008(live, client, tenant) -> None:
    """Before: malformed frames and frames naming unknown attempts were answered one by one
    up to the frame budget (1,000 a second, some of them a database round each). A worker
    never sends those: past the error budget the stream is closed with 1008."""
    live.runtime.admission = Admission(
        AdmissionSettings(error_rate=5, error_burst=20), metrics=live.ctx.metrics
    )
    t = await tenant()
    created = (await open_session(client, t, max_concurrency=1)).json()
    async with websockets.connect(
        stream_url(live, t, created["session_id"]),
        additional_headers=bearer(created["session_token"]),
    ) as ws:  # fmt: skip
        for i in range(200):
            await ws.send(json.dumps({"type": "start", "msg_id": f"s{i}", "attempt_id": "0" * 32})
                          if i % 2 else "{not json")  # fmt: skip
        code, frames = await _closed_with(ws, 20)
    assert code == 1008
    assert frames[-1]["type"] == "error" and frames[-1]["code"] == "rate_limited"
    assert sum(f["type"] == "error" for f in frames) <= 20 + 5 + 32  # burst, refill, in flight
    counter = live.ctx.metrics.counter("pulse_worker_frames_refused_total", "", ("reason",))
    assert counter.value(reason="error_budget") >= 1
