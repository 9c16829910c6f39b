"""The outermost ASGI middleware: request ids, body size limit, request metrics, last-resort 500.

* ``X-Request-Id``: echoed when the client sends a sane one (1–64 of ``[A-Za-z0-9._:-]``),
  generated (32 hex) otherwise; stored in ``scope["state"]["request_id"]`` (so
  ``request.state.request_id``) and set on every HTTP response.
* Body limit: ``Content-Length`` above ``settings.max_body_bytes`` answers 413 before the body
  is read; a chunked body is counted while received and raises PayloadTooLarge (413) when it
  passes the limit.
* Metrics: ``orbit_http_requests_total{route,method,status}`` and
  ``orbit_http_request_duration_seconds{route}``, labelled by the route *template* (bounded
  cardinality); unmatched paths are labelled ``<unmatched>``.
* Anything that escapes the exception handlers becomes a logged JSON 500 ``internal``.
"""

from __future__ import annotations

import logging
import re
import time
from typing import Any

from starlette.types import ASGIApp, Message, Receive, Scope, Send

from orbit.context import AppContext
from orbit.errors import PayloadTooLarge
from orbit.http.errors import error_bytes
from orbit.http.tenancy import enter_provisional
from orbit.ids import id_hex, new_id
from orbit.metrics import HTTP_DURATION, HTTP_REQUESTS

log = logging.getLogger("orbit.http")
_REQUEST_ID = re.compile(r"[A-Za-z0-9._:\-]{1,64}")


def _header(scope: Scope, name: bytes) -> str | None:
    for k, v in scope.get("headers", ()):
        if k == name:
            return v.decode("latin-1")  # type: ignore[no-any-return]
    return None


def route_label(scope: Scope) -> str:
    route = scope.get("route")
    path = getattr(route, "path", None)
    return path if isinstance(path, str) else "<unmatched>"


class RequestContextMiddleware:
    """See the module docstring."""

    def __init__(self, app: ASGIApp, ctx: AppContext) -> None:
        self.app = app
        self.ctx = ctx
        self.requests = ctx.metrics.counter(
            HTTP_REQUESTS, "HTTP requests by route template, method and status",
            ("route", "method", "status"),
        )  # fmt: skip
        self.duration = ctx.metrics.histogram(
            HTTP_DURATION, "HTTP request duration by route template", ("route",)
        )

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] not in ("http", "websocket"):
            await self.app(scope, receive, send)
            return
        incoming = _header(scope, b"x-request-id")
        rid = incoming if incoming and _REQUEST_ID.fullmatch(incoming) else id_hex(new_id())
        scope.setdefault("state", {})["request_id"] = rid
        enter_provisional(scope, self.ctx.extras)  # fair share of the pool, by tenant
        if scope["type"] == "websocket":
            await self.app(scope, receive, send)
            return
        await self._http(scope, receive, send, rid)

    async def _http(self, scope: Scope, receive: Receive, send: Send, rid: str) -> None:
        started = time.perf_counter()
        limit = self.ctx.settings.max_body_bytes
        status = 500
        response_started = False
        rid_header = (b"x-request-id", rid.encode())

        async def send_wrapper(message: Message) -> None:
            nonlocal status, response_started
            if message["type"] == "http.response.start":
                response_started = True
                status = int(message["status"])
                headers = [h for h in message.get("headers", []) if h[0].lower() != b"x-request-id"]
                headers.append(rid_header)
                message = {**message, "headers": headers}
            await send(message)

        received = 0

        async def receive_wrapper() -> Message:
            nonlocal received
            message = await receive()
            if message["type"] == "http.request":
                received += len(message.get("body", b""))
                if received > limit:
                    raise PayloadTooLarge(f"request body exceeds {limit} bytes", max_bytes=limit)
            return message

        try:
            length = _header(scope, b"content-length")
            if length is not None and length.isascii() and length.isdigit() and int(length) > limit:
                await _send_json(
                    send_wrapper, 413,
                    error_bytes("payload_too_large", f"request body exceeds {limit} bytes", {"max_bytes": limit}),
                )  # fmt: skip
                return
            await self.app(scope, receive_wrapper, send_wrapper)
        except Exception:
            log.exception("unhandled error in request %s %s (request id %s)",
                          scope.get("method"), scope.get("path"), rid)  # fmt: skip
            if not response_started:
                await _send_json(
                    send_wrapper,
                    500,
                    error_bytes("internal", "internal error", {"request_id": rid}),
                )
            else:
                raise
        finally:
            route = route_label(scope)
            self.requests.inc(route=route, method=str(scope.get("method", "")), status=str(status))
            self.duration.observe(time.perf_counter() - started, route=route)


async def _send_json(send: Send, status: int, body: bytes) -> None:
    headers: list[Any] = [
        (b"content-type", b"application/json"),
        (b"content-length", str(len(body)).encode()),
    ]
    await send({"type": "http.response.start", "status": status, "headers": headers})
    await send({"type": "http.response.body", "body": body})
