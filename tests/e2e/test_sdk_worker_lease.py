"""The SDK worker keeping (or losing) its lease, against the real server: uvicorn with the
Pulse routes and loops in the test's event loop, the SDK ``Worker`` talking to it through a
small TCP proxy the test controls (pass, hold every byte, or drop/cut at a ``started``
frame). docs/sdk.md "Leases and heartbeats".

* a healthy long task (several leases long) keeps its lease through heartbeats;
* a worker that cannot heartbeat (the network holds its bytes) cancels its handler itself
  *before* the server's lease expires, and reports nothing with that token;
* a lost ``started`` reply (dropped frame, or the connection cut right there) is recovered by
  re-sending ``start``: the server rotates the execution token and the task succeeds with
  its first attempt.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator
from datetime import UTC, datetime
from typing import Any

import pytest
from event_rows import raw_events
from orbit_sdk import TaskContext, Worker
from orbit_sdk._backoff import Backoff
from test_pulse_worker_ws import Live

from orbit.storage import Tx

STARTED = b'"type":"started"'


class Proxy:
    """TCP proxy 127.0.0.1:<port> → the server. ``hold()`` stops moving bytes (both ways,
    nothing is closed: a silent network); ``drop_started``/``cut_started`` remove the next
    ``started`` WebSocket frame from the server → worker direction (dropped alone, framing
    kept; or the connection cut instead of delivering it)."""

    def __init__(self, target_port: int) -> None:
        self.target_port = target_port
        self.flowing = asyncio.Event()
        self.flowing.set()
        self.drop_started = 0
        self.cut_started = 0
        self.dropped = 0
        self.cut = 0
        self.port = 0
        self._server: asyncio.Server | None = None
        self._tasks: set[asyncio.Task[None]] = set()
        self._writers: set[asyncio.StreamWriter] = set()

    async def start(self) -> None:
        self._server = await asyncio.start_server(self._accept, "127.0.0.1", 0)
        self.port = self._server.sockets[0].getsockname()[1]

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def hold(self) -> None:
        self.flowing.clear()

    def release(self) -> None:
        self.flowing.set()

    async def stop(self) -> None:
        self.release()
        assert self._server is not None
        self._server.close()
        for w in list(self._writers):
            w.close()
        for t in list(self._tasks):
            t.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)

    async def _accept(self, cr: asyncio.StreamReader, cw: asyncio.StreamWriter) -> None:
        try:
            sr, sw = await asyncio.open_connection("127.0.0.1", self.target_port)
        except OSError:
            cw.close()
            return
        self._writers |= {cw, sw}
        up = asyncio.create_task(self._pipe(cr, sw, None))
        down = asyncio.create_task(self._pipe(sr, cw, _Frames(self)))
        self._tasks |= {up, down}
        await asyncio.wait({up, down}, return_when=asyncio.FIRST_COMPLETED)
        for w in (cw, sw):
            w.close()
        for t in (up, down):
            t.cancel()
        await asyncio.gather(up, down, return_exceptions=True)
        self._tasks -= {up, down}
        self._writers -= {cw, sw}

    async def _pipe(
        self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter, frames: _Frames | None
    ) -> None:
        while True:
            await self.flowing.wait()
            data = await reader.read(65536)
            if not data:
                return
            await self.flowing.wait()  # a held network keeps what it read
            if frames is not None:
                data, cut = frames.feed(data)
                if cut:
                    return
            if data:
                writer.write(data)
                await writer.drain()


class _Frames:
    """Server → worker bytes: the HTTP response as is; after a ``101`` upgrade, whole
    WebSocket frames (server frames are unmasked), so one can be removed cleanly."""

    def __init__(self, proxy: Proxy) -> None:
        self.proxy = proxy
        self.buf = b""
        self.mode = "head"  # head → ws | raw

    def feed(self, data: bytes) -> tuple[bytes, bool]:
        if self.mode == "raw":
            return data, False
        self.buf += data
        out = b""
        if self.mode == "head":
            end = self.buf.find(b"\r\n\r\n")
            if end < 0:
                return b"", False
            head, self.buf = self.buf[: end + 4], self.buf[end + 4 :]
            out += head
            if not head.startswith(b"HTTP/1.1 101"):
                self.mode = "raw"
                out, self.buf = out + self.buf, b""
                return out, False
            self.mode = "ws"
        while True:
            frame = _one_frame(self.buf)
            if frame is None:
                return out, False
            raw, payload = frame
            self.buf = self.buf[len(raw) :]
            if raw[0] & 0x0F == 1 and STARTED in payload:
                if self.proxy.cut_started > 0:
                    self.proxy.cut_started -= 1
                    self.proxy.cut += 1
                    return out, True
                if self.proxy.drop_started > 0:
                    self.proxy.drop_started -= 1
                    self.proxy.dropped += 1
                    continue
            out += raw


def _one_frame(buf: bytes) -> tuple[bytes, bytes] | None:
    if len(buf) < 2:
        return None
    n, off = buf[1] & 0x7F, 2
    if n == 126:
        if len(buf) < 4:
            return None
        n, off = int.from_bytes(buf[2:4], "big"), 4
    elif n == 127:
        if len(buf) < 10:
            return None
        n, off = int.from_bytes(buf[2:10], "big"), 10
    if buf[1] & 0x80:
        off += 4
    if len(buf) < off + n:
        return None
    return buf[: off + n], buf[off : off + n]


@pytest.fixture
async def live(db) -> AsyncIterator[Live]:
    server = Live(db)
    await server.start()
    try:
        yield server
    finally:
        await server.stop()


@pytest.fixture
async def proxy(live) -> AsyncIterator[Proxy]:
    p = Proxy(live.port)
    await p.start()
    try:
        yield p
    finally:
        await p.stop()


def _worker(url: str, t: Any, **kwargs: Any) -> Worker:
    return Worker(
        url, t.key, namespace=t.namespace, max_concurrency=1, drain_timeout=2.0,
        report_timeout=2.0, backoff=Backoff(initial=0.05, maximum=0.2), **kwargs,
    )  # fmt: skip


async def _attempts(db, t, task_id: str) -> list[dict[str, Any]]:
    async def run(tx: Tx) -> list[dict[str, Any]]:
        return await tx.fetchall(
            "SELECT state, generation, lease_expires_at, started_at FROM pulse_attempts"
            " WHERE namespace_id = %s AND task_id = %s ORDER BY generation, offered_at",
            (t.namespace_id, bytes.fromhex(task_id)),
        )

    return await db.read(run)


async def _evidence_kinds(db, t, task_id: str) -> list[str]:
    async def run(tx: Tx) -> list[str]:
        rows = await tx.fetchall(
            "SELECT kind FROM pulse_attempt_evidence WHERE namespace_id = %s AND task_id = %s"
            " ORDER BY created_at",
            (t.namespace_id, bytes.fromhex(task_id)),
        )
        return [r["kind"] for r in rows]

    return await db.read(run)


async def _event_types(db, t, task_id: str) -> list[str]:
    async def run(tx: Tx) -> list[str]:
        rows = await raw_events(
            tx, t.namespace_id, subject_kind="task", subject_id=bytes.fromhex(task_id)
        )
        return [r["type"] for r in rows]

    return await db.read(run)


async def _task(db, t, task_id: str) -> dict[str, Any]:
    async def run(tx: Tx) -> dict[str, Any]:
        row = await tx.fetchone(
            "SELECT state, attempts, effect_uncertain FROM pulse_tasks"
            " WHERE namespace_id = %s AND id = %s",
            (t.namespace_id, bytes.fromhex(task_id)),
        )
        assert row is not None
        return row

    return await db.read(run)


async def _until_state(db, t, task_id: str, states: set[str], within: float = 20) -> dict:
    async with asyncio.timeout(within):
        while True:
            row = await _task(db, t, task_id)
            if row["state"] in states:
                return row
            await asyncio.sleep(0.05)


async def test_a_healthy_long_task_keeps_its_lease_through_heartbeats(live, db, tenant) -> None:
    t = await tenant(lease_ms=1500)  # heartbeat every 500 ms; the task runs ~3 leases
    worker = _worker(live.http, t)

    @worker.task(t.queue, "long")
    async def long(ctx: TaskContext, payload: Any) -> dict[str, Any]:
        await asyncio.sleep(4.5)
        return {"done": payload["n"]}

    task = await t.submit(kind="long", payload={"n": 7})
    stats = await asyncio.wait_for(worker.run(max_tasks=1, install_signal_handlers=False), 30)
    assert stats.outcomes == {"succeeded": 1}, stats
    row = await _task(db, t, task["id"])
    assert row["state"] == "SUCCEEDED" and row["attempts"] == 1
    (attempt,) = await _attempts(db, t, task["id"])
    assert attempt["state"] == "SUCCEEDED"
    assert await _evidence_kinds(db, t, task["id"]) == []  # never lost, nothing late

    # The drain at the end closed the session (it did not wait to expire).
    async def sessions(tx: Tx) -> list[dict[str, Any]]:
        return await tx.fetchall(
            "SELECT state, closed_at FROM pulse_worker_sessions WHERE namespace_id = %s",
            (t.namespace_id,),
        )

    (session,) = await db.read(sessions)
    assert session["state"] == "CLOSED" and session["closed_at"] is not None


async def test_a_worker_that_cannot_heartbeat_stops_before_its_lease_expires(
    live, proxy, db, tenant
) -> None:
    t = await tenant(lease_ms=3000)  # heartbeat every 1 s: the worker stops ~500 ms early
    worker = _worker(proxy.url, t)
    entered = asyncio.Event()
    stopped = asyncio.Event()
    times: dict[str, datetime] = {}

    @worker.task(t.queue, "stuck")
    async def stuck(ctx: TaskContext, payload: Any) -> None:
        entered.set()
        try:
            await asyncio.sleep(60)
        except asyncio.CancelledError:
            times["cancelled"] = datetime.now(UTC).replace(tzinfo=None)
            stopped.set()
            raise

    task = await t.submit(kind="stuck", payload={})
    runner = asyncio.create_task(worker.run(max_tasks=1, install_signal_handlers=False))
    try:
        await asyncio.wait_for(entered.wait(), 15)
        await asyncio.sleep(1.5)  # a heartbeat or two got through
        held_at = time.monotonic()
        proxy.hold()  # the network goes silent: no heartbeat reaches the server
        await asyncio.wait_for(stopped.wait(), 10)
        waited = time.monotonic() - held_at
        # The server still considers the attempt running, with the lease it last extended.
        (attempt,) = await _attempts(db, t, task["id"])
        assert attempt["state"] == "RUNNING", attempt
        assert times["cancelled"] < attempt["lease_expires_at"], (times, attempt)
        assert waited < 3.0 + 0.3, waited  # at most one lease after the last heartbeat
    finally:
        proxy.release()
        stats = await asyncio.wait_for(runner, 30)
    assert stats.outcomes == {"lease_lost": 1}, stats
    # Nothing was reported with that token: the attempt was lost (by recovery or by the
    # session close of the drain), never completed, no late report recorded as evidence.
    row = await _until_state(db, t, task["id"], {"NEEDS_REVIEW"})
    assert row["attempts"] == 1 and row["effect_uncertain"]
    assert await _evidence_kinds(db, t, task["id"]) == ["lost"]
    (attempt,) = await _attempts(db, t, task["id"])
    assert attempt["state"] == "LOST"


@pytest.mark.parametrize("how", ["drop", "cut"])
async def test_a_lost_started_reply_is_recovered_by_resending_start(
    live, proxy, db, tenant, how: str
) -> None:
    t = await tenant()
    if how == "drop":
        proxy.drop_started = 1  # the frame vanishes; the connection stays up
    else:
        proxy.cut_started = 1  # the connection dies instead of delivering it
    worker = _worker(proxy.url, t, start_timeout=0.5, start_retries=3)
    generations: list[int] = []

    @worker.task(t.queue, "once")
    async def once(ctx: TaskContext, payload: Any) -> dict[str, Any]:
        generations.append(ctx.generation)
        return {"ok": True}

    task = await t.submit(kind="once", payload={})
    stats = await asyncio.wait_for(worker.run(max_tasks=1, install_signal_handlers=False), 30)
    assert (proxy.dropped, proxy.cut) == ((1, 0) if how == "drop" else (0, 1))
    assert stats.outcomes == {"succeeded": 1}, stats
    assert generations == [1]  # the handler ran once, in generation 1
    row = await _task(db, t, task["id"])
    assert row["state"] == "SUCCEEDED" and row["attempts"] == 1, row
    (attempt,) = await _attempts(db, t, task["id"])
    assert attempt["state"] == "SUCCEEDED"
    assert "task.start_resent" in await _event_types(db, t, task["id"])
    assert await _evidence_kinds(db, t, task["id"]) == []
