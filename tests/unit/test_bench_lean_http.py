"""The benchmark's lean HTTP client (bench/lean_http.py) against a real socket server:
Content-Length and chunked bodies, keep-alive reuse, ``Connection: close``."""

from __future__ import annotations

import asyncio

import pytest

from bench.lean_http import LeanClient

RESPONSES = {
    b"/length": b'HTTP/1.1 201 Created\r\ncontent-length: 11\r\n\r\n{"id":"x1"}',
    b"/chunked": b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n"
    b'4\r\n{"a"\r\n3\r\n:1}\r\n0\r\n\r\n',
    b"/close": b"HTTP/1.1 400 Bad Request\r\nConnection: close\r\ncontent-length: 2\r\n\r\nno",
}


async def _serve(seen: list[bytes], conns: list[int]) -> asyncio.Server:
    async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        conns.append(1)
        try:
            while True:
                head = await reader.readuntil(b"\r\n\r\n")
                length = 0
                for line in head.split(b"\r\n"):
                    if line.lower().startswith(b"content-length:"):
                        length = int(line.split(b":")[1])
                body = await reader.readexactly(length)
                seen.append(head + body)
                path = head.split(b" ")[1]
                writer.write(RESPONSES[path])
                await writer.drain()
                if path == b"/close":
                    break
        except asyncio.IncompleteReadError:
            pass
        writer.close()

    return await asyncio.start_server(handle, "127.0.0.1", 0)


@pytest.mark.asyncio
async def test_bodies_keep_alive_and_close() -> None:
    seen: list[bytes] = []
    conns: list[int] = []
    server = await _serve(seen, conns)
    port = server.sockets[0].getsockname()[1]
    try:
        async with LeanClient(f"http://127.0.0.1:{port}", connections=1) as client:
            base = f"http://127.0.0.1:{port}"
            r = await client.post(base + "/length", {"Authorization": "Bearer k"}, b'{"q":1}')
            assert (r.status_code, r.json()) == (201, {"id": "x1"})
            r = await client.post(base + "/chunked", {}, b"")
            assert (r.status_code, r.json()) == (200, {"a": 1})
            assert len(conns) == 1  # the connection was kept and reused
            r = await client.post(base + "/close", {}, b"x")
            assert (r.status_code, r.text) == (400, "no")
            r = await client.post(base + "/length", {}, b"")
            assert r.status_code == 201 and len(conns) == 2  # a new one after the close
            with pytest.raises(ValueError):
                await client.post("http://elsewhere:1/length", {}, b"")
    finally:
        server.close()
        await server.wait_closed()
    assert seen[0].startswith(b"POST /length HTTP/1.1\r\nHost: 127.0.0.1:")
    assert b"\r\nAuthorization: Bearer k\r\n" in seen[0] and seen[0].endswith(b'\r\n\r\n{"q":1}')
    assert b"Content-Length: 7\r\n" in seen[0]
