"""The SDK worker against a fake protocol server on a local port.

``FakeOrbit`` is a test double of the remote peer only (the SDK must not depend on the
server packages): a tiny Starlette app served by uvicorn that speaks the worker protocol
(session creation, WebSocket stream, offers, start/heartbeat/complete/fail/cancelled,
effects, receipts with replay) and lets a test drop connections, expire sessions, push
cancels and refuse heartbeats. The real server is exercised by tests/e2e/test_sdk_worker.py.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import secrets
import signal
import socket
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from typing import Any

import msgspec
import pytest
import uvicorn
from orbit_sdk import (
    Backoff,
    EffectUncertain,
    PermanentError,
    RetryableError,
    TaskContext,
    Unauthenticated,
    Worker,
)
from orbit_sdk.wire import (
    WORKER_DECODER,
    AttemptLease,
    Cancel,
    Cancelled,
    Complete,
    Effect,
    EffectState,
    Fail,
    Heartbeat,
    HeartbeatOk,
    Offer,
    OfferedTask,
    Receipt,
    ServerError,
    SessionCreate,
    SessionCreated,
    Start,
    StartDenied,
    Started,
    encode,
)
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route, WebSocketRoute
from starlette.websockets import WebSocket, WebSocketDisconnect

NS = "ns1"
KEY = "sk_test_" + "k" * 24


# --------------------------------------------------------------------------- fake server


@dataclass
class FakeTask:
    id: str
    queue: str
    kind: str
    payload: bytes
    generation: int = 0
    state: str = "WAITING"
    reports: list[str] = field(default_factory=list)  # raw report frames, in arrival order


@dataclass
class FakeAttempt:
    id: str
    task: FakeTask
    session_id: str
    state: str = "offered"  # offered → started → done
    token: str = ""
    cancel_requested: bool = False


@dataclass
class FakeSession:
    id: str
    token: str
    body: SessionCreate
    ws: WebSocket | None = None
    instance_id: str = ""
    gone: bool = False
    connects: int = 0
    handshakes: int = 0  # stream upgrade requests, refused ones included
    heartbeats: list[Heartbeat] = field(default_factory=list)
    held: set[str] = field(default_factory=set)  # attempt ids offered or running


class FakeOrbit:
    """Speaks the worker protocol; every knob a test needs is a plain attribute."""

    def __init__(
        self, *, heartbeat_ms: int = 100, lease_ms: int = 3000, attempt_lease_ms: int | None = None
    ) -> None:
        self.heartbeat_ms = heartbeat_ms
        self.lease_ms = lease_ms  # the session's lease (announced at session creation)
        self.attempt_lease_ms = attempt_lease_ms or lease_ms  # what offers/heartbeats grant
        self.url = ""
        self.sessions: dict[str, FakeSession] = {}
        self.tasks: dict[str, FakeTask] = {}
        self.waiting: list[FakeTask] = []
        self.attempts: dict[str, FakeAttempt] = {}
        self.frames: list[str] = []  # every worker→server frame, raw
        self.receipts: dict[tuple[str, bytes], Receipt] = {}
        self.effects: dict[tuple[str, str], tuple[str, bytes]] = {}
        # frame types: close the stream instead of replying (once)
        self.drop_after: set[str] = set()
        # frame types: answer `unauthenticated` and expire the session (once)
        self.expire_on: set[str] = set()
        self.heartbeat_mode = "ok"  # ok | lost | ignore
        self.deny_start = False
        self.requeue_retryable = False  # put a retryable failure back into `waiting`
        self.session_status: int | None = None  # force an error status on session create
        self.session_requests = 0  # session creations asked for (refused ones too)
        self.app = Starlette(
            routes=[
                Route(
                    f"/v1/namespaces/{NS}/workers/sessions", self._create_session, methods=["POST"]
                ),
                WebSocketRoute(
                    f"/v1/namespaces/{NS}/workers/sessions/{{sid}}/stream", self._stream
                ),
            ]
        )

    # ---- test controls

    def submit(self, kind: str, payload: bytes = b"{}", *, queue: str = "q") -> FakeTask:
        task = FakeTask(secrets.token_hex(16), queue, kind, payload)
        self.tasks[task.id] = task
        self.waiting.append(task)
        return task

    async def dispatch(self) -> None:
        for session in list(self.sessions.values()):
            ws = session.ws
            if ws is None or session.gone:
                continue
            free = session.body.max_concurrency - len(session.held)
            matching = [t for t in self.waiting[: 4 * free] if t.queue in session.body.queues]
            for task in matching[: max(free, 0)]:
                self.waiting.remove(task)
                task.generation += 1
                task.state = "LEASED"
                attempt = FakeAttempt(secrets.token_hex(16), task, session.id)
                self.attempts[attempt.id] = attempt
                session.held.add(attempt.id)
                offer = Offer(
                    attempt_id=attempt.id,
                    task=OfferedTask(
                        id=task.id,
                        queue=task.queue,
                        kind=task.kind,
                        payload=msgspec.Raw(task.payload),
                        generation=task.generation,
                    ),
                    lease_expires_at=_later(self.attempt_lease_ms),
                )
                await _send(ws, offer)

    async def cancel(self, attempt: FakeAttempt) -> None:
        attempt.cancel_requested = True
        ws = self.sessions[attempt.session_id].ws
        if ws is not None:
            await _send(ws, Cancel(attempt_id=attempt.id, reason="user"))

    async def expire(self, session: FakeSession, *, code: int = 1001, recover: bool = True) -> None:
        """The session expires: stream refused from now on; with ``recover`` its attempts go
        back to waiting (as the server's recovery loop would do)."""
        session.gone = True
        for attempt in self.attempts.values():
            if recover and attempt.session_id == session.id and attempt.state != "done":
                self._close(attempt)
                attempt.task.state = "WAITING"
                self.waiting.append(attempt.task)
        if session.ws is not None:
            await session.ws.close(code=code)

    def _close(self, attempt: FakeAttempt) -> None:
        attempt.state = "done"
        self.sessions[attempt.session_id].held.discard(attempt.id)

    def sessions_connected(self) -> int:
        """Sessions whose stream was opened at least once."""
        return sum(1 for s in self.sessions.values() if s.connects)

    def reports_of(self, kind: str) -> list[Any]:
        return [
            f for f in map(WORKER_DECODER.decode, self.frames) if type(f).__name__.lower() == kind
        ]

    def attempt_of(self, task: FakeTask) -> FakeAttempt:
        return next(a for a in self.attempts.values() if a.task is task)

    # ---- HTTP

    async def _create_session(self, request: Request) -> Response:
        if request.headers.get("authorization") != f"Bearer {KEY}":
            return JSONResponse({"error": {"code": "unauthenticated", "message": "bad key"}}, 401)
        self.session_requests += 1
        if self.session_status is not None:
            code = {401: "unauthenticated", 503: "not_ready"}[self.session_status]
            return JSONResponse(
                {"error": {"code": code, "message": "x", "details": {}}}, self.session_status
            )
        body = msgspec.json.decode(await request.body(), type=SessionCreate)
        known = body.instance.id
        instance_id = known if isinstance(known, str) else secrets.token_hex(16)
        session = FakeSession(
            secrets.token_hex(16), secrets.token_hex(32), body, instance_id=instance_id
        )
        self.sessions[session.id] = session
        created = SessionCreated(
            session_id=session.id,
            session_token=session.token,
            instance_id=instance_id,
            heartbeat_ms=self.heartbeat_ms,
            lease_ms=self.lease_ms,
        )
        return Response(encode(created), 201, media_type="application/json")

    # ---- WebSocket

    async def _stream(self, ws: WebSocket) -> None:
        session = self.sessions.get(ws.path_params["sid"])
        if session is not None:
            session.handshakes += 1
        if session is None or session.gone:
            await ws.send_denial_response(Response(status_code=404))
            return
        if ws.headers.get("authorization") != f"Bearer {session.token}":
            await ws.send_denial_response(Response(status_code=401))
            return
        await ws.accept()
        session.ws = ws
        session.connects += 1
        await self.dispatch()
        try:
            while True:
                raw = await ws.receive_text()
                self.frames.append(raw)
                frame = WORKER_DECODER.decode(raw)
                if type(frame).__name__.lower() in self.expire_on:
                    self.expire_on.discard(type(frame).__name__.lower())
                    gone = ServerError(
                        code="unauthenticated", message="expired", ref_msg_id=frame.msg_id
                    )
                    await _send(ws, gone)
                    await self.expire(session, code=4401, recover=False)
                    return
                if type(frame).__name__.lower() in self.drop_after:
                    self.drop_after.discard(type(frame).__name__.lower())
                    self._apply(session, frame, raw)  # the server did the work; the reply is lost
                    await ws.close(code=1011)
                    return
                reply = self._apply(session, frame, raw)
                if reply is not None:
                    await _send(ws, reply)
                await self.dispatch()
        except WebSocketDisconnect:
            pass
        finally:
            if session.ws is ws:
                session.ws = None

    def _apply(self, session: FakeSession, frame: Any, raw: str) -> Any:
        if isinstance(frame, Heartbeat):
            session.heartbeats.append(frame)
            if self.heartbeat_mode == "ignore":
                return None
            leases = []
            for aid in frame.attempt_ids:
                attempt = self.attempts.get(aid)
                ok = (
                    self.heartbeat_mode == "ok"
                    and attempt is not None
                    and attempt.state == "started"
                    and attempt.session_id == session.id
                )
                leases.append(
                    AttemptLease(
                        attempt_id=aid,
                        ok=ok,
                        lease_expires_at=_later(self.attempt_lease_ms),
                        cancel_requested=bool(attempt and attempt.cancel_requested),
                    )
                )
            return HeartbeatOk(ref_msg_id=frame.msg_id, attempts=leases)
        attempt = self.attempts.get(frame.attempt_id)
        if attempt is None:
            return ServerError(code="not_found", message="attempt", ref_msg_id=frame.msg_id)
        if isinstance(frame, Start):
            if self.deny_start:
                self._close(attempt)
                return StartDenied(
                    ref_msg_id=frame.msg_id, attempt_id=attempt.id, reason="gate closed"
                )
            if attempt.state == "offered":
                attempt.state, attempt.token = "started", secrets.token_hex(16)
                attempt.task.state = "RUNNING"
            return Started(
                ref_msg_id=frame.msg_id,
                attempt_id=attempt.id,
                execution_token=attempt.token,
                generation=attempt.task.generation,
                concurrency_token=None,
                lease_expires_at=_later(self.attempt_lease_ms),
            )
        if frame.execution_token != attempt.token:
            return ServerError(code="stale_token", message="stale", ref_msg_id=frame.msg_id)
        if isinstance(frame, Effect):
            return self._effect(attempt, frame)
        return self._report(attempt, frame, raw)

    def _effect(self, attempt: FakeAttempt, frame: Effect) -> EffectState:
        key = (attempt.task.id, frame.key)
        known = self.effects.get(key)
        if frame.phase == "begin":
            if known is None:
                self.effects[key] = ("begun", b"null")
                state, result = "new", b"null"
            elif known[0] == "committed":
                state, result = "committed", known[1]
            else:
                state, result = "uncertain", b"null"
        else:
            result = bytes(frame.result) if isinstance(frame.result, msgspec.Raw) else b"null"
            self.effects[key] = ("committed", result)
            state = "committed"
        return EffectState(
            ref_msg_id=frame.msg_id, key=frame.key, state=state, result=msgspec.Raw(result)
        )

    def _report(self, attempt: FakeAttempt, frame: Any, raw: str) -> Receipt:
        # The identity of a report is its content without msg_id (a re-send may differ there).
        identity = encode(msgspec.structs.replace(frame, msg_id=""))
        known = self.receipts.get((attempt.id, identity))
        if known is not None:
            return Receipt(
                ref_msg_id=frame.msg_id,
                attempt_id=attempt.id,
                receipt_id=known.receipt_id,
                outcome="replayed",
                task_state=known.task_state,
            )
        task = attempt.task
        task.reports.append(raw)
        if isinstance(frame, Complete):
            task.state = "SUCCEEDED"
        elif isinstance(frame, Cancelled):
            task.state = "CANCELLED"
        elif isinstance(frame, Fail):
            task.state = "WAITING" if frame.retryable else "FAILED"
            if frame.retryable and self.requeue_retryable:
                self.waiting.append(task)
        self._close(attempt)
        receipt = Receipt(
            ref_msg_id=frame.msg_id,
            attempt_id=attempt.id,
            receipt_id=secrets.token_hex(16),
            outcome="applied",
            task_state=task.state,
        )
        self.receipts[(attempt.id, identity)] = receipt
        return receipt


def _later(ms: int) -> datetime:
    return datetime.now(UTC) + timedelta(milliseconds=ms)


async def _send(ws: WebSocket, frame: Any) -> None:
    with contextlib.suppress(Exception):  # the peer may be gone already
        await ws.send_text(encode(frame).decode())


class _Server(uvicorn.Server):
    @contextlib.contextmanager
    def capture_signals(self) -> Any:  # leave signal handling to the code under test
        yield


@contextlib.asynccontextmanager
async def serve(fake: FakeOrbit) -> AsyncIterator[FakeOrbit]:
    # proto=IPPROTO_TCP: asyncio sets TCP_NODELAY only on sockets that say so; without it
    # Nagle + delayed ACKs add ~40 ms to every second frame sent in a row.
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM, socket.IPPROTO_TCP)
    sock.bind(("127.0.0.1", 0))
    config = uvicorn.Config(fake.app, log_level="warning", ws="websockets-sansio", lifespan="off")
    server = _Server(config)
    task = asyncio.create_task(server.serve(sockets=[sock]))
    while not server.started:  # noqa: ASYNC110 - uvicorn exposes only a flag
        await asyncio.sleep(0.005)
    fake.url = f"http://127.0.0.1:{sock.getsockname()[1]}"
    try:
        yield fake
    finally:
        server.should_exit = True
        await task
        sock.close()


@pytest.fixture
async def fake() -> AsyncIterator[FakeOrbit]:
    async with serve(FakeOrbit()) as f:
        yield f


def make_worker(fake: FakeOrbit, **kwargs: Any) -> Worker:
    kwargs.setdefault("backoff", Backoff(initial=0.02, maximum=0.1))
    return Worker(fake.url, KEY, namespace=NS, **kwargs)


async def eventually(cond: Callable[[], bool], within: float = 5.0) -> None:
    """Poll a condition on the fake's state (plain attributes, no events to await)."""
    async with asyncio.timeout(within):
        while not cond():  # noqa: ASYNC110
            await asyncio.sleep(0.01)


def run_in_background(worker: Worker, **kwargs: Any) -> asyncio.Task[Any]:
    kwargs.setdefault("install_signal_handlers", False)
    return asyncio.create_task(worker.run(**kwargs))


# --------------------------------------------------------------------------- tests


async def test_offer_start_complete_keeps_payload_and_result_bytes(fake: FakeOrbit) -> None:
    worker = make_worker(fake, max_concurrency=4)
    seen: list[bytes] = []

    @worker.task("q", "echo")
    async def echo(ctx: TaskContext, payload: Any) -> Any:
        seen.append(bytes(ctx.payload_raw))
        assert ctx.generation == 1 and ctx.kind == "echo" and ctx.queue == "q"
        return msgspec.Raw(bytes(ctx.payload_raw))  # echo the exact bytes back

    @worker.task("q", "add")
    async def add(ctx: TaskContext, payload: dict[str, int]) -> dict[str, int]:
        return {"sum": payload["a"] + payload["b"]}

    exact = b'{"amount": 1.10, "big": 12345678901234567890, "s": "\\u00e9"}'
    t1 = fake.submit("echo", exact)
    t2 = fake.submit("add", b'{"a": 2, "b": 3}')
    stats = await worker.run(until_idle=True, idle_timeout=0.3, install_signal_handlers=False)

    assert seen == [exact]
    assert t1.state == t2.state == "SUCCEEDED"
    r1 = WORKER_DECODER.decode(t1.reports[0])
    r2 = WORKER_DECODER.decode(t2.reports[0])
    assert isinstance(r1, Complete) and bytes(r1.result) == exact
    assert isinstance(r2, Complete) and msgspec.json.decode(r2.result) == {"sum": 5}
    assert stats.succeeded == 2 and stats.sessions == 1
    session = next(iter(fake.sessions.values()))
    assert session.body.queues == ["q"] and session.body.max_concurrency == 4
    assert session.body.instance.pid == os.getpid() and session.body.instance.sdk.startswith(
        "orbit-sdk"
    )


async def test_handler_errors_become_fail_reports(fake: FakeOrbit) -> None:
    worker = make_worker(fake)

    class Order(msgspec.Struct):
        id: int

    @worker.task("q", "retry")
    async def retry(ctx: TaskContext, payload: Any) -> None:
        raise RetryableError("busy", retry_after_ms=1500, details={"upstream": "x"})

    @worker.task("q", "perm")
    async def perm(ctx: TaskContext, payload: Any) -> None:
        raise PermanentError("bad input", type="Validation")

    @worker.task("q", "boom")
    async def boom(ctx: TaskContext, payload: Any) -> None:
        raise KeyError("nope")

    @worker.task("q", "typed", payload_type=Order)
    async def typed(ctx: TaskContext, payload: Order) -> int:
        return payload.id

    tasks = {k: fake.submit(k, b'{"id": "not-an-int"}') for k in ("retry", "perm", "boom", "typed")}
    await worker.run(until_idle=True, idle_timeout=0.3, install_signal_handlers=False)

    fails = {k: WORKER_DECODER.decode(t.reports[0]) for k, t in tasks.items()}
    assert all(isinstance(f, Fail) for f in fails.values())
    assert fails["retry"].retryable and fails["retry"].retry_after_ms == 1500
    assert fails["retry"].error.type == "RetryableError" and fails["retry"].error.details == {
        "upstream": "x"
    }
    assert not fails["perm"].retryable and fails["perm"].error.type == "Validation"
    assert fails["boom"].retryable and fails["boom"].error.type == "KeyError"
    assert "Traceback" in fails["boom"].error.details["traceback"]
    assert not fails["typed"].retryable and fails["typed"].error.type == "PayloadDecodeError"
    assert '"retry_after_ms"' not in tasks["perm"].reports[0]


async def test_unknown_errors_can_be_permanent_and_missing_handler_is_retryable(
    fake: FakeOrbit,
) -> None:
    worker = make_worker(fake, retry_unknown_errors=False)

    @worker.task("q", "boom")
    async def boom(ctx: TaskContext, payload: Any) -> None:
        raise ValueError("x")

    t_boom = fake.submit("boom")
    t_unknown = fake.submit("never-registered")
    await worker.run(until_idle=True, idle_timeout=0.3, install_signal_handlers=False)
    boom_fail = WORKER_DECODER.decode(t_boom.reports[0])
    unknown_fail = WORKER_DECODER.decode(t_unknown.reports[0])
    assert isinstance(boom_fail, Fail) and not boom_fail.retryable
    assert isinstance(unknown_fail, Fail) and unknown_fail.retryable
    assert unknown_fail.error.type == "HandlerNotFound"


async def test_cancel_frame_cancels_handler_and_reports_cancelled(fake: FakeOrbit) -> None:
    worker = make_worker(fake)
    entered, saw_cancel = asyncio.Event(), []

    @worker.task("q", "slow")
    async def slow(ctx: TaskContext, payload: Any) -> None:
        entered.set()
        try:
            await asyncio.sleep(30)
        finally:
            saw_cancel.append(ctx.cancel_requested)

    task = fake.submit("slow")
    runner = run_in_background(worker, until_idle=True, idle_timeout=0.3)
    await asyncio.wait_for(entered.wait(), 5)
    await fake.cancel(fake.attempt_of(task))
    stats = await asyncio.wait_for(runner, 10)
    assert task.state == "CANCELLED" and saw_cancel == [True]
    report = WORKER_DECODER.decode(task.reports[0])
    assert isinstance(report, Cancelled) and report.execution_token == fake.attempt_of(task).token
    assert stats.outcomes == {"cancelled": 1}


async def test_cancel_after_work_finished_anyway_reports_complete(fake: FakeOrbit) -> None:
    worker = make_worker(fake)
    entered = asyncio.Event()

    @worker.task("q", "stubborn")
    async def stubborn(ctx: TaskContext, payload: Any) -> str:
        entered.set()
        try:
            await asyncio.sleep(30)
        except asyncio.CancelledError:
            return "finished anyway"  # the work was done; the result stands
        return "unreachable"

    task = fake.submit("stubborn")
    runner = run_in_background(worker, until_idle=True, idle_timeout=0.3)
    await asyncio.wait_for(entered.wait(), 5)
    await fake.cancel(fake.attempt_of(task))
    await asyncio.wait_for(runner, 10)
    report = WORKER_DECODER.decode(task.reports[0])
    assert isinstance(report, Complete) and msgspec.json.decode(report.result) == "finished anyway"


async def test_cancel_requested_in_heartbeat_also_cancels(fake: FakeOrbit) -> None:
    worker = make_worker(fake)
    entered = asyncio.Event()

    @worker.task("q", "slow")
    async def slow(ctx: TaskContext, payload: Any) -> None:
        entered.set()
        await asyncio.sleep(30)

    task = fake.submit("slow")
    runner = run_in_background(worker, until_idle=True, idle_timeout=0.3)
    await asyncio.wait_for(entered.wait(), 5)
    fake.attempt_of(task).cancel_requested = True  # the cancel frame itself was lost
    await asyncio.wait_for(runner, 10)
    assert task.state == "CANCELLED"


async def test_effect_runs_once_across_attempts_and_uncertain_raises(fake: FakeOrbit) -> None:
    worker = make_worker(fake)
    calls: list[str] = []
    results: list[Any] = []

    @worker.task("q", "pay")
    async def pay(ctx: TaskContext, payload: Any) -> Any:
        async def charge() -> dict[str, Any]:
            calls.append(ctx.attempt_id)
            return {"charge": "ch_1", "amount": 1.5}

        value = await ctx.effect("charge", charge)
        results.append(value)
        if ctx.generation == 1:
            raise RetryableError("crash after the effect")
        return value

    fake.requeue_retryable = True
    task = fake.submit("pay")
    await worker.run(until_idle=True, idle_timeout=0.3, install_signal_handlers=False)
    # generation 1 ran the effect and failed (retryable); generation 2 found it committed
    assert task.state == "SUCCEEDED" and task.generation == 2
    assert len(calls) == 1, "a committed effect must not run again"
    assert results == [{"charge": "ch_1", "amount": 1.5}] * 2

    # A begun-but-uncommitted effect is uncertain.
    worker2 = make_worker(fake)

    @worker2.task("q", "mail")
    async def mail(ctx: TaskContext, payload: Any) -> None:
        await ctx.effect("mail", lambda: calls.append("mail"))

    t_mail = fake.submit("mail")
    fake.effects[(t_mail.id, "mail")] = ("begun", b"null")
    await worker2.run(until_idle=True, idle_timeout=0.3, install_signal_handlers=False)
    report = WORKER_DECODER.decode(t_mail.reports[0])
    assert isinstance(report, Fail) and not report.retryable
    assert report.error.type == "EffectUncertain" and report.error.details == {"key": "mail"}
    assert "mail" not in calls


async def test_effect_uncertain_can_be_handled_by_the_handler(fake: FakeOrbit) -> None:
    worker = make_worker(fake)

    @worker.task("q", "careful")
    async def careful(ctx: TaskContext, payload: Any) -> str:
        try:
            await ctx.effect("x", lambda: 1)
        except EffectUncertain as exc:
            return f"checked {exc.key} by hand"
        return "ran"

    task = fake.submit("careful")
    fake.effects[(task.id, "x")] = ("begun", b"null")
    await worker.run(until_idle=True, idle_timeout=0.3, install_signal_handlers=False)
    assert msgspec.json.decode(WORKER_DECODER.decode(task.reports[0]).result) == "checked x by hand"


async def test_report_is_resent_identically_after_connection_drop(fake: FakeOrbit) -> None:
    worker = make_worker(fake)

    @worker.task("q", "one")
    async def one(ctx: TaskContext, payload: Any) -> dict[str, float]:
        return {"x": 0.1}

    fake.drop_after = {"complete"}
    task = fake.submit("one")
    stats = await worker.run(until_idle=True, idle_timeout=0.5, install_signal_handlers=False)
    completes = [f for f in fake.frames if '"type":"complete"' in f]
    assert len(completes) == 2 and completes[0] == completes[1], "re-send must be byte-identical"
    assert len(task.reports) == 1 and task.state == "SUCCEEDED"
    assert stats.connects == 2 and stats.sessions == 1 and stats.resent_requests >= 1
    assert stats.succeeded == 1


async def test_start_is_resent_on_the_same_session(fake: FakeOrbit) -> None:
    worker = make_worker(fake)
    ran: list[int] = []

    @worker.task("q", "one")
    async def one(ctx: TaskContext, payload: Any) -> None:
        ran.append(ctx.generation)

    fake.drop_after = {"start"}
    task = fake.submit("one")
    stats = await worker.run(until_idle=True, idle_timeout=0.5, install_signal_handlers=False)
    assert ran == [1] and task.state == "SUCCEEDED" and stats.connects == 2


async def test_expired_session_gets_a_new_one_and_stale_handler_stops(fake: FakeOrbit) -> None:
    worker = make_worker(fake)
    entered = asyncio.Event()
    stopped: list[str] = []

    @worker.task("q", "slow")
    async def slow(ctx: TaskContext, payload: Any) -> str:
        if ctx.generation == 1:
            entered.set()
            try:
                await asyncio.sleep(30)
            except asyncio.CancelledError:
                stopped.append(ctx.attempt_id)
                raise
        return "second try"

    task = fake.submit("slow")
    runner = run_in_background(worker, until_idle=True, idle_timeout=0.5)
    await asyncio.wait_for(entered.wait(), 5)
    first_attempt = fake.attempt_of(task)
    await fake.expire(next(iter(fake.sessions.values())))
    stats = await asyncio.wait_for(runner, 10)
    assert stopped == [first_attempt.id], "the handler of the lost session must be cancelled"
    assert task.state == "SUCCEEDED" and task.generation == 2
    assert stats.sessions == 2 and stats.outcomes.get("lease_lost") == 1
    assert all(WORKER_DECODER.decode(r).attempt_id != first_attempt.id for r in task.reports)
    first, second = fake.sessions.values()
    assert second.body.instance.id == first.instance_id, "the instance id survives a new session"


async def test_a_gone_session_is_replaced_at_once_whatever_the_backoff(fake: FakeOrbit) -> None:
    """The stream drops, the reconnect hears "session gone": the server has just answered,
    so the new session is opened at once — not after the backoff's next, grown delay."""
    worker = make_worker(fake, backoff=Backoff(initial=1.0, maximum=60, multiplier=30, jitter=0))

    @worker.task("q", "k")
    async def handler(ctx: TaskContext, payload: Any) -> str:
        return "ok"

    runner = run_in_background(worker)
    try:
        await eventually(lambda: len(fake.sessions) == 1 and fake.sessions_connected() == 1)
        loop = asyncio.get_running_loop()
        began = loop.time()
        await fake.expire(next(iter(fake.sessions.values())), code=1001)  # not 4401: a drop
        # Reconnect after ≤ 1 s (the first delay), hears 404 "gone": a new session at once
        # (the grown delay would be 30 s).
        await eventually(lambda: len(fake.sessions) == 2 and fake.sessions_connected() == 2, 10)
        assert loop.time() - began < 10
    finally:
        worker.drain()
        await asyncio.wait_for(runner, 10)


async def test_a_busy_server_is_asked_again_within_the_busy_bound(fake: FakeOrbit) -> None:
    """Session creation answered 503 (busy, no Retry-After) again and again: the delay grows
    from the initial one (so a crowd of workers turned away does not hammer the node) but
    stays within BUSY_MAX_S, instead of backing off as from an unreachable server (0.05,
    0.5, 5, 50 s...)."""
    fake.session_status = 503
    worker = make_worker(fake, backoff=Backoff(initial=0.05, maximum=60, multiplier=10, jitter=0))

    @worker.task("q", "k")
    async def handler(ctx: TaskContext, payload: Any) -> str:
        return "ok"

    runner = run_in_background(worker)
    try:
        # 0.05 + 0.5 + 2 + 2 s: the unreachable-server schedule would be past 5 s by the 4th
        await eventually(lambda: fake.session_requests >= 5, 8)
        fake.session_status = None
        await eventually(lambda: fake.sessions_connected() == 1, 4)
    finally:
        worker.drain()
        await asyncio.wait_for(runner, 10)


async def test_heartbeat_lease_lost_cancels_handler_without_report(fake: FakeOrbit) -> None:
    worker = make_worker(fake)
    entered = asyncio.Event()

    @worker.task("q", "slow")
    async def slow(ctx: TaskContext, payload: Any) -> None:
        entered.set()
        await asyncio.sleep(30)

    task = fake.submit("slow")
    runner = run_in_background(worker, until_idle=True, idle_timeout=0.3)
    await asyncio.wait_for(entered.wait(), 5)
    fake.heartbeat_mode = "lost"
    stats = await asyncio.wait_for(runner, 10)
    assert task.reports == [] and stats.outcomes == {"lease_lost": 1}


async def test_unanswered_heartbeats_let_the_local_lease_expire(
    caplog: pytest.LogCaptureFixture,
) -> None:
    async with serve(FakeOrbit(heartbeat_ms=50, lease_ms=400)) as fake:
        worker = make_worker(fake)
        entered = asyncio.Event()

        @worker.task("q", "slow")
        async def slow(ctx: TaskContext, payload: Any) -> None:
            entered.set()
            await asyncio.sleep(30)

        task = fake.submit("slow")
        runner = run_in_background(worker, until_idle=True, idle_timeout=0.2)
        await asyncio.wait_for(entered.wait(), 5)
        fake.heartbeat_mode = "ignore"
        loop = asyncio.get_running_loop()
        t0 = loop.time()
        with caplog.at_level(logging.WARNING, logger="orbit_sdk"):
            stats = await asyncio.wait_for(runner, 10)
        elapsed = loop.time() - t0
        assert stats.outcomes == {"lease_lost": 1} and task.reports == []
        assert elapsed < 0.4 + 0.2 + 0.5  # lease (≤ 400 ms from the last ok) + idle + slack
        assert any("lease not extended" in r.getMessage() for r in caplog.records)


async def test_heartbeats_keep_session_alive_and_list_running_attempts(fake: FakeOrbit) -> None:
    worker = make_worker(fake)
    entered = asyncio.Event()
    release = asyncio.Event()

    @worker.task("q", "slow")
    async def slow(ctx: TaskContext, payload: Any) -> None:
        entered.set()
        await release.wait()

    runner = run_in_background(worker)
    await eventually(lambda: any(len(s.heartbeats) >= 2 for s in fake.sessions.values()))
    session = next(iter(fake.sessions.values()))
    assert all(hb.attempt_ids == [] for hb in session.heartbeats)
    task = fake.submit("slow")
    await fake.dispatch()
    await asyncio.wait_for(entered.wait(), 5)
    aid = fake.attempt_of(task).id
    await eventually(lambda: any(hb.attempt_ids == [aid] for hb in session.heartbeats))
    release.set()
    await eventually(lambda: task.state == "SUCCEEDED")
    worker.drain()
    await asyncio.wait_for(runner, 10)


async def test_drain_lets_running_handlers_finish_and_ignores_new_offers(fake: FakeOrbit) -> None:
    worker = make_worker(fake, max_concurrency=2, drain_timeout=5)
    entered = asyncio.Event()

    @worker.task("q", "slowish")
    async def slowish(ctx: TaskContext, payload: Any) -> str:
        entered.set()
        await asyncio.sleep(0.3)
        return "done"

    first = fake.submit("slowish")
    runner = run_in_background(worker)
    await asyncio.wait_for(entered.wait(), 5)
    worker.drain()
    late = fake.submit("slowish")
    await fake.dispatch()  # offered, but the draining worker does not start it
    stats = await asyncio.wait_for(runner, 10)
    assert first.state == "SUCCEEDED"
    assert late.reports == [] and fake.attempt_of(late).state == "offered"
    assert stats.succeeded == 1 and stats.ignored_offers == 1


async def test_drain_timeout_cancels_and_gives_back_as_drained(fake: FakeOrbit) -> None:
    worker = make_worker(fake, drain_timeout=0.2)
    entered = asyncio.Event()

    @worker.task("q", "forever")
    async def forever(ctx: TaskContext, payload: Any) -> None:
        entered.set()
        await asyncio.sleep(30)

    task = fake.submit("forever")
    runner = run_in_background(worker)
    await asyncio.wait_for(entered.wait(), 5)
    worker.drain()
    stats = await asyncio.wait_for(runner, 10)
    report = WORKER_DECODER.decode(task.reports[0])
    assert isinstance(report, Fail) and report.retryable and report.error.type == "Drained"
    assert stats.outcomes == {"drained": 1}


async def test_sigterm_drains_the_worker(fake: FakeOrbit) -> None:
    worker = make_worker(fake, drain_timeout=5)
    entered = asyncio.Event()

    @worker.task("q", "slowish")
    async def slowish(ctx: TaskContext, payload: Any) -> str:
        entered.set()
        await asyncio.sleep(0.2)
        return "ok"

    task = fake.submit("slowish")
    before = signal.getsignal(signal.SIGTERM)
    runner = asyncio.create_task(worker.run())
    await asyncio.wait_for(entered.wait(), 5)
    handler = signal.getsignal(signal.SIGTERM)
    assert handler not in (signal.SIG_DFL, signal.SIG_IGN, None, before), "worker must own SIGTERM"
    os.kill(os.getpid(), signal.SIGTERM)
    stats = await asyncio.wait_for(runner, 10)
    assert task.state == "SUCCEEDED" and stats.succeeded == 1
    assert signal.getsignal(signal.SIGTERM) == before


async def test_start_denied_does_not_run_the_handler(fake: FakeOrbit) -> None:
    worker = make_worker(fake)
    ran: list[str] = []

    @worker.task("q", "x")
    async def x(ctx: TaskContext, payload: Any) -> None:
        ran.append(ctx.task_id)

    fake.deny_start = True
    fake.submit("x")
    stats = await worker.run(until_idle=True, idle_timeout=0.3, install_signal_handlers=False)
    assert ran == [] and stats.outcomes == {"start_denied": 1}


async def test_max_tasks_limits_session_concurrency_and_stops(fake: FakeOrbit) -> None:
    worker = make_worker(fake, max_concurrency=10)

    @worker.task("q", "x")
    async def x(ctx: TaskContext, payload: Any) -> int:
        return 1

    tasks = [fake.submit("x") for _ in range(5)]
    stats = await worker.run(max_tasks=2, install_signal_handlers=False)
    assert stats.succeeded == 2
    assert next(iter(fake.sessions.values())).body.max_concurrency == 2
    assert sum(t.state == "SUCCEEDED" for t in tasks) == 2


async def test_bad_api_key_is_fatal(fake: FakeOrbit) -> None:
    worker = Worker(fake.url, "wrong", namespace=NS)

    @worker.task("q", "x")
    async def x(ctx: TaskContext, payload: Any) -> None:
        return None

    with pytest.raises(Unauthenticated):
        await asyncio.wait_for(worker.run(install_signal_handlers=False), 5)


async def test_session_create_retries_on_not_ready(fake: FakeOrbit) -> None:
    worker = make_worker(fake)

    @worker.task("q", "x")
    async def x(ctx: TaskContext, payload: Any) -> int:
        return 7

    fake.session_status = 503
    task = fake.submit("x")
    runner = run_in_background(worker, until_idle=True, idle_timeout=0.3)
    await asyncio.sleep(0.2)
    assert not fake.sessions
    fake.session_status = None
    await asyncio.wait_for(runner, 10)
    assert task.state == "SUCCEEDED"


async def test_secrets_never_reach_the_logs(
    fake: FakeOrbit, caplog: pytest.LogCaptureFixture
) -> None:
    worker = make_worker(fake)

    @worker.task("q", "eff")
    async def eff(ctx: TaskContext, payload: Any) -> None:
        await ctx.effect("k", lambda: 1)
        ctx.logger.info("context is %r", ctx)

    fake.drop_after = {"complete"}
    task = fake.submit("eff")
    with caplog.at_level(logging.DEBUG):
        await worker.run(until_idle=True, idle_timeout=0.3, install_signal_handlers=False)
    assert task.state == "SUCCEEDED"
    session = next(iter(fake.sessions.values()))
    text = "\n".join(r.getMessage() for r in caplog.records)
    assert "orbit_sdk.websockets" in {r.name for r in caplog.records}  # frames were logged ...
    for secret in (KEY, session.token, fake.attempt_of(task).token):
        assert secret not in text  # ... but never a secret


async def test_report_survives_session_expiry_and_is_resent_on_the_new_session(
    fake: FakeOrbit,
) -> None:
    worker = make_worker(fake)

    @worker.task("q", "one")
    async def one(ctx: TaskContext, payload: Any) -> str:
        return "result"

    fake.expire_on = {"complete"}  # error `unauthenticated` + close 4401, like the server
    task = fake.submit("one")
    stats = await worker.run(until_idle=True, idle_timeout=0.5, install_signal_handlers=False)
    completes = [f for f in fake.frames if '"type":"complete"' in f]
    assert len(completes) == 2 and completes[0] == completes[1]
    assert task.state == "SUCCEEDED" and len(task.reports) == 1
    assert stats.sessions == 2 and stats.succeeded == 1


async def test_close_code_4401_means_a_new_session_at_once(fake: FakeOrbit) -> None:
    worker = make_worker(fake, backoff=Backoff(initial=0.05, maximum=0.05))

    @worker.task("q", "x")
    async def x(ctx: TaskContext, payload: Any) -> int:
        return 1

    runner = run_in_background(worker)
    await eventually(lambda: any(s.ws is not None for s in fake.sessions.values()))
    first = next(iter(fake.sessions.values()))
    await fake.expire(first, code=4401)
    await eventually(lambda: len(fake.sessions) == 2)
    task = fake.submit("x")
    await fake.dispatch()
    await eventually(lambda: task.state == "SUCCEEDED")
    worker.drain()
    stats = await asyncio.wait_for(runner, 10)
    assert first.handshakes == 1, "no reconnect to a session the server said is gone"
    assert stats.sessions == 2


async def test_attempt_lease_shorter_than_the_session_lease_is_respected() -> None:
    fake = FakeOrbit(heartbeat_ms=100, lease_ms=30_000, attempt_lease_ms=500)
    async with serve(fake):
        worker = make_worker(fake)
        entered = asyncio.Event()

        @worker.task("q", "slow")
        async def slow(ctx: TaskContext, payload: Any) -> None:
            entered.set()
            await asyncio.sleep(30)

        task = fake.submit("slow")
        runner = run_in_background(worker, until_idle=True, idle_timeout=0.1)
        await asyncio.wait_for(entered.wait(), 5)
        fake.heartbeat_mode = "ignore"
        stats = await asyncio.wait_for(runner, 3)  # far less than the 30 s session lease
        assert stats.outcomes == {"lease_lost": 1} and task.reports == []


def test_busy_wait_grows_to_its_bound_and_honours_retry_after() -> None:
    from orbit_sdk._connection import BUSY_MAX_S, RETRY_AFTER_SPREAD, busy_wait

    assert busy_wait(0.1, None, 0.9) == 0.1
    assert busy_wait(50.0, None, 0.9) == BUSY_MAX_S  # never the unreachable-server ceiling
    assert busy_wait(0.1, 3.0, 0.0) == 3.0  # the server's Retry-After, at least
    assert busy_wait(0.1, 3.0, 0.5) == 3.0 * (1 + RETRY_AFTER_SPREAD * 0.5)  # spread out
    assert busy_wait(50.0, 1.0, 0.0) == BUSY_MAX_S


def test_retry_after_header_in_seconds_only() -> None:
    from orbit_sdk._connection import _retry_after_header

    assert _retry_after_header("2") == 2.0
    assert _retry_after_header(" 1.5 ") == 1.5
    assert _retry_after_header(None) is None
    assert _retry_after_header("Wed, 21 Oct 2015 07:28:00 GMT") is None
    assert _retry_after_header("-1") is None
