"""Hostile worker WebSocket frames against a real ``orbit-server``.

Expected behaviour (docs/api/workers.md "The stream"):

* every frame a worker can send — malformed JSON, JSON of the wrong shape, known types with
  wrong field types, unknown types, binary frames, over-deep nesting, reports for attempts
  that were never offered (frames out of order) — is answered with one frame: an ``error``
  (never code ``internal``) or the operation's normal reply (``start_denied``,
  ``heartbeat_ok``, ...); or the connection is closed cleanly (never 1011);
* none of them changes a task, attempt, receipt or event row;
* a frame over the request size limit (1 MiB) gets ``payload_too_large``; one over uvicorn's
  ``ws_max_size`` (16 MiB) closes the socket with 1009; either way the server keeps serving;
* after the flood the server still runs a task end to end for another session, and its RSS
  grew by a bounded amount.
"""

from __future__ import annotations

import json
import os
import time
from datetime import datetime, timedelta
from typing import Any

import pytest
from hypothesis import HealthCheck, Phase, given, settings
from hypothesis import strategies as st
from reliability_support import (
    CliTenant,
    Fingerprint,
    OrbitServer,
    Session,
    cli_tenant,
    diff,
    open_session,
    put_queue,
    record_figures,
    run_task_over_ws,
    ws_connect,
)
from reliability_support import log_dir as log_dir
from reliability_support import server as server  # fixtures
from websockets.exceptions import ConnectionClosed, InvalidStatus

from orbit.storage import DSN
from pulse.sessions import WorkerSettings

pytestmark = pytest.mark.process

EXAMPLES = int(os.environ.get("ORBIT_FUZZ_EXAMPLES", "12")) * 10
SERVER_TYPES = {"offer", "started", "start_denied", "heartbeat_ok", "receipt", "cancel",
                "effect_state", "error"}  # fmt: skip
#: Rows a hostile frame may change: the session's own keep-alive (every heartbeat extends it)
#: and the audit log.
MAY_CHANGE = ("pulse_worker_sessions", "pulse_worker_instances", "orbit_audit_events")

HEX = st.text("0123456789abcdef", min_size=32, max_size=32)
ANY_JSON = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | st.text(max_size=20),
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=8), inner, max_size=3),
    max_leaves=10,
)  # fmt: skip
TYPES = st.sampled_from(["start", "heartbeat", "complete", "fail", "cancelled", "effect",
                         "offer", "receipt", "nope", "", "START"])  # fmt: skip
FIELD_VALUES = st.one_of(HEX, ANY_JSON, st.text(max_size=300))


def _frame_objects() -> st.SearchStrategy[Any]:
    shaped = st.fixed_dictionaries(
        {"type": TYPES},
        optional={
            "msg_id": st.one_of(st.text(min_size=1, max_size=10), st.integers(), st.text(min_size=129, max_size=140)),
            "attempt_id": FIELD_VALUES,
            "attempt_ids": st.one_of(st.lists(HEX, max_size=5), ANY_JSON),
            "execution_token": FIELD_VALUES,
            "result": ANY_JSON,
            "error": st.one_of(st.fixed_dictionaries({"type": st.text(max_size=300)}), ANY_JSON),
            "retryable": ANY_JSON,
            "retry_after_ms": st.one_of(st.integers(), ANY_JSON),
            "key": FIELD_VALUES,
            "phase": st.one_of(st.sampled_from(["begin", "commit"]), ANY_JSON),
        },
    )  # fmt: skip
    return st.one_of(shaped, ANY_JSON)


FRAMES = st.one_of(
    _frame_objects().map(lambda o: ("text", json.dumps(o))),
    st.text(max_size=200).map(lambda s: ("text", s)),
    st.binary(max_size=200).map(lambda b: ("binary", b)),
    _frame_objects().map(lambda o: ("binary", json.dumps(o).encode())),
    st.integers(20, 80).map(lambda n: ("text", '{"type": "heartbeat", "msg_id": "d", "x": ' + "[" * n + "]" * n + "}")),
)  # fmt: skip


class Prober:
    """One stream; reconnects (same session) when the server closed it."""

    def __init__(self, server: OrbitServer, session: Session) -> None:
        self.server = server
        self.session = session
        self.ws: Any = None
        self.frames = 0
        self.replies: dict[str, int] = {}
        self.closes: dict[int, int] = {}
        self.problems: list[str] = []
        self.cool_downs = 0

    def _conn(self) -> Any:
        while self.ws is None:
            try:
                self.ws = ws_connect(self.server, self.session)
            except InvalidStatus as exc:  # a stream closed for its budget cools down first
                if exc.response.status_code != 429:
                    raise
                self.cool_downs += 1
                time.sleep(float(exc.response.headers.get("Retry-After", "1")))
        return self.ws

    def send(self, kind: str, data: str | bytes) -> None:
        ws = self._conn()
        self.frames += 1
        try:
            ws.send(data)
            reply = json.loads(ws.recv(timeout=10))
        except ConnectionClosed as exc:
            code = exc.rcvd.code if exc.rcvd else 1006
            self.closes[code] = self.closes.get(code, 0) + 1
            if code in (1011, 1006):
                self.problems.append(f"closed {code} after {kind} {str(data)[:120]!r}")
            self.ws = None
            return
        except TimeoutError:
            self.problems.append(f"no reply to {kind} {str(data)[:120]!r}")
            return
        t = reply.get("type")
        self.replies[t] = self.replies.get(t, 0) + 1
        if t not in SERVER_TYPES:
            self.problems.append(f"unknown reply {reply!r}")
        if t == "error":
            if reply.get("code") == "internal" or set(reply) - {
                "type",
                "code",
                "message",
                "ref_msg_id",
                "details",
            }:
                self.problems.append(f"error frame {reply!r} for {str(data)[:120]!r}")
            if not isinstance(reply.get("code"), str) or not isinstance(reply.get("message"), str):
                self.problems.append(f"malformed error frame {reply!r}")

    def close(self) -> None:
        if self.ws is not None:
            self.ws.close()


@pytest.fixture(scope="module")
def ws_tenant(server: OrbitServer, dsn: DSN) -> CliTenant:
    t = cli_tenant(dsn)
    put_queue(server.url, t, "default")
    return t


def test_hypothesis_frames_get_an_answer_and_change_nothing(
    server: OrbitServer, ws_tenant: CliTenant, dsn: DSN
) -> None:
    session = open_session(server.url, ws_tenant, ["default"])
    prober = Prober(server, session)
    fp = Fingerprint(dsn, exclude=MAY_CHANGE, application_id=ws_tenant.application_id)
    before = fp.take()

    @settings(max_examples=EXAMPLES, deadline=None, database=None,
              suppress_health_check=list(HealthCheck), phases=[Phase.generate])  # fmt: skip
    @given(frames=st.lists(FRAMES, min_size=1, max_size=4))
    def run(frames: list[tuple[str, Any]]) -> None:
        for kind, data in frames:
            prober.send(kind, data)

    try:
        run()
    finally:
        prober.close()
    after = fp.take()
    fp.close()
    record_figures("hostile_ws_frames", frames=prober.frames, replies=prober.replies,
                   closes=prober.closes, anomalies=len(prober.problems))  # fmt: skip
    assert not prober.problems, "\n".join(prober.problems[:20])
    assert diff(before, after) == {}
    assert prober.replies.get("error", 0) > prober.frames // 2  # most hostile frames are refused
    assert server.alive()
    run_task_over_ws(server, ws_tenant)  # the server still serves a real worker


#: How long an offer stays valid on the test server (a task is offered anew only after it).
OFFER_LEASE = timedelta(milliseconds=WorkerSettings.from_env().offer_lease_ms)


def parse_time(text: str) -> datetime:
    return datetime.fromisoformat(text.replace("Z", "+00:00"))


def test_out_of_order_frames_on_a_real_attempt(server: OrbitServer, ws_tenant: CliTenant) -> None:
    """complete/fail/effect before start, a second start, a report with another attempt's
    token: refused, and the task still completes exactly once afterwards."""
    from reliability_support import get_task, recv_json, submit

    # A queue of its own: an offer of another test's task cannot come between the replies.
    put_queue(server.url, ws_tenant, "out-of-order")
    s = open_session(server.url, ws_tenant, ["out-of-order"])
    task = submit(server.url, ws_tenant, "out-of-order")
    with ws_connect(server, s) as ws:
        offer = recv_json(ws, "offer")
        while offer["task"]["id"] != task["id"]:
            offer = recv_json(ws, "offer")
        aid = offer["attempt_id"]
        lease_end = offer["lease_expires_at"]

        def reply() -> dict[str, Any]:
            """The next frame that is not an offer. The same offer may be pushed twice (on
            connect, outstanding offers are sent again) and, on a slow box, the task may be
            offered anew once its offer lease passed — never while it is still running."""
            nonlocal aid, lease_end
            while True:
                frame = recv_json(ws)
                if frame.get("type") != "offer":
                    return frame
                if frame["attempt_id"] != aid:
                    assert frame["task"]["id"] == task["id"], frame
                    renewed_at = parse_time(frame["lease_expires_at"]) - OFFER_LEASE
                    assert parse_time(lease_end) <= renewed_at, (lease_end, frame)
                    aid, lease_end = frame["attempt_id"], frame["lease_expires_at"]

        for i, frame in enumerate([
            {"type": "complete", "attempt_id": aid, "execution_token": "x" * 43, "result": 1},
            {"type": "fail", "attempt_id": aid, "execution_token": "x", "error": {"type": "e"}},
            {"type": "effect", "attempt_id": aid, "execution_token": "x", "key": "k", "phase": "begin"},
            {"type": "cancelled", "attempt_id": aid, "execution_token": "x"},
        ]):  # fmt: skip
            ws.send(json.dumps({**frame, "msg_id": f"early{i}"}))
            answer = reply()
            assert answer["type"] == "error" and answer["ref_msg_id"] == f"early{i}", answer
            assert answer["code"] in ("stale_token", "conflict", "not_found", "invalid_request"), (
                answer
            )
        assert get_task(server.url, ws_tenant, task["id"])["state"] == "LEASED"
        ws.send(json.dumps({"type": "start", "msg_id": "s1", "attempt_id": aid}))
        started = recv_json(ws, "started")
        ws.send(json.dumps({"type": "start", "msg_id": "s2", "attempt_id": aid}))
        again = recv_json(ws, "started")  # a re-sent start rotates the token
        assert again["generation"] == started["generation"]
        assert again["execution_token"] != started["execution_token"]
        ws.send(json.dumps({"type": "complete", "msg_id": "c0", "attempt_id": aid,
                            "execution_token": started["execution_token"], "result": 2}))  # fmt: skip
        assert recv_json(ws, "error")["code"] == "stale_token"  # the first token is stale
        started = again
        ws.send(json.dumps({"type": "complete", "msg_id": "c1", "attempt_id": aid,
                            "execution_token": started["execution_token"] + "x", "result": 2}))  # fmt: skip
        assert recv_json(ws, "error")["code"] == "stale_token"
        ws.send(json.dumps({"type": "complete", "msg_id": "c2", "attempt_id": aid,
                            "execution_token": started["execution_token"], "result": 3}))  # fmt: skip
        assert recv_json(ws, "receipt")["outcome"] == "applied"
        ws.send(json.dumps({"type": "fail", "msg_id": "f1", "attempt_id": aid,
                            "execution_token": started["execution_token"], "error": {"type": "late"}}))  # fmt: skip
        assert recv_json(ws, "error")["code"] == "stale_token"  # kept as evidence
    final = get_task(server.url, ws_tenant, task["id"])
    assert final["state"] == "SUCCEEDED" and final["result"] == 3 and final["attempts"] == 1


def test_huge_frames_and_a_flood_keep_memory_bounded(
    server: OrbitServer, ws_tenant: CliTenant
) -> None:
    # An empty queue of its own: no offer can take the place of a frame's reply.
    put_queue(server.url, ws_tenant, "flood")
    session = open_session(server.url, ws_tenant, ["flood"])
    prober = Prober(server, session)
    # Warm up (first frames allocate decoders, pools, ...), then measure.
    for _ in range(20):
        prober.send("text", "{" * 10)
    rss_before = server.rss_kib()
    started = time.monotonic()
    big = "x" * (1024 * 1024 + 10)  # over the 1 MiB frame limit: error payload_too_large
    flood = 0
    for i in range(60):
        prober.send("text", big if i % 2 else '{"type": "heartbeat", "msg_id": "' + big + '"}')
        flood += len(big)
    huge = b"y" * (17 * 1024 * 1024)  # over uvicorn's ws_max_size: the socket is closed (1009)
    for _ in range(3):
        prober.send("binary", huge)
        flood += len(huge)
    for _ in range(200):
        prober.send("text", '{"type": "start", "msg_id": "m", "attempt_id": "' + "0" * 32 + '"}')
    prober.close()
    time.sleep(0.5)
    rss_after = server.rss_kib()
    record_figures("hostile_ws_flood", bytes_sent=flood, frames=prober.frames,
                   rss_before_kib=rss_before, rss_after_kib=rss_after, closes=prober.closes,
                   replies=prober.replies, seconds=round(time.monotonic() - started, 1))  # fmt: skip
    assert not prober.problems, prober.problems[:10]
    assert prober.replies.get("error", 0) >= 60 and prober.closes.get(1009, 0) == 3
    assert rss_after - rss_before < 96 * 1024, (rss_before, rss_after)  # < 96 MiB for ~110 MiB sent
    run_task_over_ws(server, ws_tenant)
