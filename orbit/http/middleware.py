"""The outermost ASGI middleware: request ids, body size limit, request metrics, last-resort 500.

* ``X-Request-Id``: echoed when the client sends a sane one (1–64 of ``[A-Za-z0-9._:-]``),
  generated (32 hex) otherwise; stored in ``scope["state"]["request_id"]`` (so
  ``request.state.request_id``) and set on every HTTP response.
* Body limit: ``Content-Length`` above ``settings.max_body_bytes`` answers 413 before the body
  is read; a chunked body is counted while received and raises PayloadTooLarge (413) when it
  passes the limit.
* Body type: a body sent with a ``Content-Type`` that is not JSON (``application/json`` or
  ``application/*+json``, any parameters) answers 415 before it is read; no Content-Type is
  taken as JSON.
* Body deadline: the whole body must arrive within ``settings.body_timeout_s`` of the start
  of the request, else RequestTimeout (408) and the connection closes. A client that goes
  away mid-body is logged at info level and counted with status 499, not as an error.
* Fair share: with the body checks passed, the request takes a slot of the node's HTTP
  request share for its (provisional) tenant before anything else is done
  (orbit/request_share.py); over its share it waits in its tenant's queue, and a full queue
  or a wait past the limit answers 429 ``rate_limited`` with ``Retry-After`` (details
  ``reason: request_share``) before the body is read or the key checked.
* Metrics: ``orbit_http_requests_total{route,method,status}`` and
  ``orbit_http_request_duration_seconds{route}``, labelled by the route *template* (bounded
  cardinality); unmatched paths are labelled ``<unmatched>``.
* Anything that escapes the exception handlers becomes a logged JSON 500 ``internal``.
"""

from __future__ import annotations

import asyncio
import logging
import re
import time
from typing import Any

from starlette.requests import ClientDisconnect
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from orbit.context import AppContext
from orbit.errors import PayloadTooLarge, RequestTimeout
from orbit.http.errors import error_bytes
from orbit.http.tenancy import enter_provisional
from orbit.ids import id_hex, new_id
from orbit.metrics import HTTP_DURATION, HTTP_REQUESTS
from orbit.request_share import QueueFull, RequestShare
from orbit.storage.fairness import current_tenant

log = logging.getLogger("orbit.http")
_REQUEST_ID = re.compile(r"[A-Za-z0-9._:\-]{1,64}")


def _header(scope: Scope, name: bytes) -> str | None:
    for k, v in scope.get("headers", ()):
        if k == name:
            return v.decode("latin-1")  # type: ignore[no-any-return]
    return None


#: The status a request is counted with when its client went away before the answer.
CLIENT_CLOSED = 499


def is_json_type(content_type: str) -> bool:
    """``application/json`` or ``application/<anything>+json``, with any parameters."""
    media = content_type.split(";", 1)[0].strip().lower()
    return media == "application/json" or (
        media.startswith("application/") and media.endswith("+json")
    )


def _has_body(scope: Scope) -> bool:
    length = _header(scope, b"content-length")
    if length is not None:
        return length.strip() not in ("", "0")
    return _header(scope, b"transfer-encoding") is not None


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
        enter_provisional(scope, self.ctx.tenant_hints)  # fair share of the pool, by tenant
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
        body_done = False
        body_deadline = started + self.ctx.settings.body_timeout_s

        async def receive_wrapper() -> Message:
            nonlocal received, body_done
            if body_done:  # after the body: waits for a disconnect, no deadline
                return await receive()
            try:
                async with asyncio.timeout(max(0.0, body_deadline - time.perf_counter())):
                    message = await receive()
            except TimeoutError:
                raise RequestTimeout(
                    "the request body did not arrive in time",
                    timeout_s=self.ctx.settings.body_timeout_s,
                ) from None
            if message["type"] == "http.request":
                received += len(message.get("body", b""))
                if received > limit:
                    raise PayloadTooLarge(f"request body exceeds {limit} bytes", max_bytes=limit)
                body_done = not message.get("more_body", False)
            return message

        try:
            length = _header(scope, b"content-length")
            if length is not None and length.isascii() and length.isdigit() and int(length) > limit:
                await _send_json(
                    send_wrapper, 413,
                    error_bytes("payload_too_large", f"request body exceeds {limit} bytes", {"max_bytes": limit}),
                )  # fmt: skip
                return
            content_type = _header(scope, b"content-type")
            if content_type is not None and not is_json_type(content_type) and _has_body(scope):
                await _send_json(
                    send_wrapper, 415,
                    error_bytes("unsupported_media_type", "request bodies are JSON: send Content-Type: application/json", {"content_type": content_type[:100]}),
                )  # fmt: skip
                return
            share = self.ctx.request_share
            tenant = current_tenant.get()
            if share is None:
                await self.app(scope, receive_wrapper, send_wrapper)
            elif await _take_slot(share, tenant):
                await _in_slot(share, tenant, self.app(scope, receive_wrapper, send_wrapper))
            else:
                await _send_json(send_wrapper, 429, _SHARE_REFUSAL, retry_after=True)
        except ClientDisconnect:
            log.info("client went away before its request %s %s was read (request id %s)",
                     scope.get("method"), scope.get("path"), rid)  # fmt: skip
            if not response_started:
                status = CLIENT_CLOSED
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


_SHARE_REFUSAL = error_bytes(
    "rate_limited",
    "this application has more requests in progress on this node than its fair share: "
    "retry after Retry-After or send fewer requests at once",
    {"reason": "request_share"},
)


async def _take_slot(share: RequestShare, tenant: Any) -> bool:
    """Take a slot of the node's request share for ``tenant``, waiting in its queue if it is
    over its share; False when it may not (queue full, or no slot in time)."""
    if share.try_enter(tenant):
        return True
    try:
        future = share.enqueue(tenant)
    except QueueFull:
        return False
    try:
        await asyncio.wait_for(asyncio.shield(future), share.settings.wait_s)
    except TimeoutError:
        share.cancel(tenant, future)
        share.refused += 1
        return False
    except BaseException:
        share.cancel(tenant, future)
        raise
    return True


async def _in_slot(share: RequestShare, tenant: Any, work: Any) -> None:
    """Run ``work`` holding the slot taken for ``tenant``: given back when it ends, or after
    ``hold_s`` if it lasts longer (long polls, slow clients)."""
    held = True

    def give_back() -> None:
        nonlocal held
        if held:
            held = False
            share.release(tenant)

    timer = asyncio.get_running_loop().call_later(share.settings.hold_s, give_back)
    try:
        await work
    finally:
        timer.cancel()
        give_back()


async def _send_json(send: Send, status: int, body: bytes, *, retry_after: bool = False) -> None:
    headers: list[Any] = [
        (b"content-type", b"application/json"),
        (b"content-length", str(len(body)).encode()),
    ]
    if retry_after:
        headers.append((b"retry-after", b"1"))
    await send({"type": "http.response.start", "status": status, "headers": headers})
    await send({"type": "http.response.body", "body": body})
