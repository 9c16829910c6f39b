"""A lean HTTP/1.1 keep-alive client for the benchmark's load generators.

The scenarios' producers only POST pre-encoded JSON and read the status and body. httpx
spends about 3 ms of CPU a request here (measured: the bench process at 0.84 of a core for
240 single submits/s in S3), on the same 2-core box as the server it measures; this client
writes one pre-built request head and parses the status line and ``Content-Length`` (or a
chunked body), like ``wrk``/``hey`` do, so the load generator leaves the CPU to the server.
Setup calls (queues, subscriptions) keep using httpx.
"""

from __future__ import annotations

import asyncio
import contextlib
from dataclasses import dataclass
from typing import Any
from urllib.parse import urlsplit

import msgspec

_DEC = msgspec.json.Decoder()


@dataclass(frozen=True, slots=True)
class LeanResponse:
    status_code: int
    content: bytes

    def json(self) -> Any:
        return _DEC.decode(self.content)

    @property
    def text(self) -> str:
        return self.content.decode("utf-8", "replace")


class LeanClient:
    """Up to ``connections`` keep-alive connections to one ``http://host:port``."""

    def __init__(self, base_url: str, connections: int = 64, timeout: float = 60.0) -> None:
        parts = urlsplit(base_url)
        if parts.scheme != "http" or parts.hostname is None:
            raise ValueError(f"LeanClient speaks plain http only, not {base_url!r}")
        self._host = parts.hostname
        self._port = parts.port or 80
        self._host_header = parts.netloc.encode()
        self._origin = f"{parts.scheme}://{parts.netloc}"
        self._timeout = timeout
        self._idle: list[tuple[asyncio.StreamReader, asyncio.StreamWriter]] = []
        self._slots = asyncio.Semaphore(connections)

    async def __aenter__(self) -> LeanClient:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.aclose()

    async def aclose(self) -> None:
        idle, self._idle = self._idle, []
        for _, writer in idle:
            writer.close()
            with contextlib.suppress(Exception):
                await writer.wait_closed()

    async def post(self, url: str, headers: dict[str, str], content: bytes) -> LeanResponse:
        """POST ``content`` to ``url`` (on this client's origin) with ``headers``."""
        if not url.startswith(self._origin + "/"):
            raise ValueError(f"{url!r} is not on {self._origin}")
        path = url[len(self._origin) :]
        head = [b"POST ", path.encode(), b" HTTP/1.1\r\nHost: ", self._host_header,
                b"\r\nContent-Length: ", str(len(content)).encode(), b"\r\n"]  # fmt: skip
        for name, value in headers.items():
            head += [name.encode(), b": ", value.encode(), b"\r\n"]
        head.append(b"\r\n")
        request = b"".join(head) + content
        async with self._slots:
            conn = self._idle.pop() if self._idle else None
            if conn is None:
                conn = await asyncio.open_connection(self._host, self._port)
            reader, writer = conn
            try:
                writer.write(request)
                response, keep = await asyncio.wait_for(_read_response(reader), self._timeout)
            except BaseException:
                writer.close()
                raise
            if keep:
                self._idle.append(conn)
            else:
                writer.close()
            return response


async def _read_response(reader: asyncio.StreamReader) -> tuple[LeanResponse, bool]:
    head = await reader.readuntil(b"\r\n\r\n")
    lines = head.split(b"\r\n")
    status = int(lines[0].split(b" ", 2)[1])
    length: int | None = None
    chunked = False
    keep = True
    for line in lines[1:]:
        name, _, value = line.partition(b":")
        name = name.strip().lower()
        if name == b"content-length":
            length = int(value)
        elif name == b"transfer-encoding" and b"chunked" in value.lower():
            chunked = True
        elif name == b"connection" and value.strip().lower() == b"close":
            keep = False
    if chunked:
        parts: list[bytes] = []
        while True:
            size = int((await reader.readuntil(b"\r\n")).split(b";")[0], 16)
            if size == 0:
                await reader.readuntil(b"\r\n")  # no trailers are sent to these requests
                break
            parts.append(await reader.readexactly(size))
            await reader.readexactly(2)
        return LeanResponse(status, b"".join(parts)), keep
    if length is None:
        return LeanResponse(status, await reader.read()), False
    return LeanResponse(status, await reader.readexactly(length)), keep
