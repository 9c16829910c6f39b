"""The SDK's base URLs and when a request moves to the next node (orbit_sdk._endpoints,
orbit_sdk._http), against small local TCP servers that fail the way a node can: nothing
listening, a connection dropped after the request was read, a 503."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Awaitable, Callable

import pytest
from orbit_sdk._endpoints import Endpoints, ws_url
from orbit_sdk._http import HttpTransport
from orbit_sdk.errors import NotReady, OrbitConnectionError

Handler = Callable[[asyncio.StreamReader, asyncio.StreamWriter], Awaitable[None]]


def test_endpoints_parse_stick_and_rotate() -> None:
    e = Endpoints(" http://a:1/ , http://b:2,http://a:1,")
    assert e.urls == ["http://a:1", "http://b:2"] and e.current == "http://a:1"
    assert list(e.round()) == ["http://a:1", "http://b:2"]
    assert e.failed("http://b:2") and e.current == "http://a:1"  # not the one in use
    assert e.failed("http://a:1") and e.current == "http://b:2" and e.failovers == 1
    assert list(e.round()) == ["http://b:2", "http://a:1"]
    one = Endpoints(["http://only"])
    assert not one.failed("http://only") and one.current == "http://only"
    with pytest.raises(ValueError):
        Endpoints(" , ")
    assert ws_url("https://h") == "wss://h" and ws_url("http://h:8") == "ws://h:8"


class Node:
    """A local TCP server with a handler; counts the requests it read."""

    def __init__(self, handler: Handler) -> None:
        self.handler = handler
        self.requests: list[bytes] = []
        self.server: asyncio.Server | None = None

    async def __aenter__(self) -> Node:
        async def serve(r: asyncio.StreamReader, w: asyncio.StreamWriter) -> None:
            head = await r.readuntil(b"\r\n\r\n")
            length = 0
            for line in head.split(b"\r\n"):
                if line.lower().startswith(b"content-length:"):
                    length = int(line.split(b":")[1])
            body = await r.readexactly(length) if length else b""
            self.requests.append(head.split(b"\r\n")[0] + b" " + body)
            await self.handler(r, w)

        self.server = await asyncio.start_server(serve, "127.0.0.1", 0)
        return self

    async def __aexit__(self, *exc: object) -> None:
        assert self.server is not None
        self.server.close()

    @property
    def url(self) -> str:
        assert self.server is not None
        return f"http://127.0.0.1:{self.server.sockets[0].getsockname()[1]}"


async def _drop(r: asyncio.StreamReader, w: asyncio.StreamWriter) -> None:
    w.close()  # the request was read: it may have been applied


def _answer(status: int, body: bytes) -> Handler:
    async def send(r: asyncio.StreamReader, w: asyncio.StreamWriter) -> None:
        w.write(b"HTTP/1.1 %d X\r\nContent-Type: application/json\r\nContent-Length: %d\r\n"
                b"Connection: close\r\n\r\n%s" % (status, len(body), body))  # fmt: skip
        await w.drain()
        w.close()

    return send


@pytest.fixture
async def cluster() -> AsyncIterator[tuple[Node, Node, Node]]:
    async with (
        Node(_drop) as drops,
        Node(_answer(503, b'{"error": {"code": "not_ready", "message": "x"}}')) as busy,
        Node(_answer(200, b'{"ok": true}')) as ok,
    ):
        yield drops, busy, ok


async def test_a_refused_connection_moves_any_request_on() -> None:
    async with Node(_answer(200, b'{"ok": 1}')) as ok:
        dead = "http://127.0.0.1:9"  # discard port: nothing listens
        http = HttpTransport([dead, ok.url], "key")
        try:
            r = await http.request("POST", "/v1/x", body={"a": 1})
            assert r.status_code == 200 and http.base_url == ok.url
            assert http.endpoints.failovers == 1 and len(ok.requests) == 1
        finally:
            await http.aclose()


async def test_a_dropped_request_is_repeated_only_when_it_is_idempotent(
    cluster: tuple[Node, Node, Node],
) -> None:
    drops, _, ok = cluster
    http = HttpTransport([drops.url, ok.url], "key")
    try:
        with pytest.raises(OrbitConnectionError):
            await http.request("POST", "/v1/tasks", body={"a": 1})  # might have been applied
        assert ok.requests == [] and http.base_url == drops.url
        r = await http.request("GET", "/v1/tasks/1")
        assert r.status_code == 200 and http.base_url == ok.url
        http.endpoints._index = 0  # back to the dropping node
        keyed = await http.request(
            "POST", "/v1/tasks", body={"a": 2}, headers={"Idempotency-Key": "k-1"}
        )
        assert keyed.status_code == 200 and len(ok.requests) == 2
    finally:
        await http.aclose()


async def test_a_503_moves_on_and_the_last_answer_is_raised(
    cluster: tuple[Node, Node, Node],
) -> None:
    _, busy, ok = cluster
    http = HttpTransport([busy.url, ok.url], "key")
    try:
        r = await http.request("POST", "/v1/tasks", body={})
        assert r.status_code == 200 and http.base_url == ok.url
    finally:
        await http.aclose()
    alone = HttpTransport([busy.url], "key")
    try:
        with pytest.raises(NotReady):
            await alone.request("GET", "/v1/x")
    finally:
        await alone.aclose()
