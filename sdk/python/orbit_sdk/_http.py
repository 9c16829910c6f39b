"""The HTTP transport shared by the client groups and the worker's session creation.

One ``httpx.AsyncClient`` per :class:`HttpTransport`; JSON bodies are encoded with msgspec
(so :class:`msgspec.Raw` payloads go out byte-exact) and every non-2xx answer is raised as
the :mod:`orbit_sdk.errors` class for its ``code``.

Given several base URLs (:mod:`orbit_sdk._endpoints`), a request that meets a failed node
goes to the next node at once — only when that cannot run it twice: the connection could
not be opened (nothing was sent), the node answered 503 (it did nothing), or the request is
idempotent (GET, HEAD, PUT, DELETE, or a POST with an ``Idempotency-Key``). Each node is
tried at most once per request. Nothing else is retried here: whether a retry is safe
depends on the call (use ``idempotency_key`` for creating calls).
"""

from __future__ import annotations

import logging
from collections.abc import Mapping, Sequence
from typing import Any, TypeVar
from urllib.parse import quote

import httpx

from . import _json
from ._endpoints import Endpoints
from ._version import USER_AGENT
from .errors import OrbitConnectionError, error_from_response

__all__ = ["HttpTransport", "seg"]

#: Methods a node failure may repeat on another node (the server applies them once).
_IDEMPOTENT = frozenset({"GET", "HEAD", "PUT", "DELETE", "OPTIONS"})
#: Transport errors raised before the request left the client.
_NOT_SENT = (httpx.ConnectError, httpx.ConnectTimeout)

T = TypeVar("T")
logger = logging.getLogger("orbit_sdk.http")
_ENCODER = _json.ENCODER


def seg(value: str) -> str:
    """Quote one path segment (names are restricted, but ids and names come from users)."""
    return quote(value, safe="")


class HttpTransport:
    """Sends authenticated JSON requests to one Orbit server.

    ``token`` is the bearer secret (API key or session token); it is sent only in the
    ``Authorization`` header and never logged.
    """

    def __init__(
        self,
        base_url: str | Sequence[str] | Endpoints,
        token: str,
        *,
        timeout: float = 30.0,
        http: httpx.AsyncClient | None = None,
    ) -> None:
        self.endpoints = base_url if isinstance(base_url, Endpoints) else Endpoints(base_url)
        self._token = token
        self._owns_http = http is None
        self._http = http or httpx.AsyncClient(timeout=timeout)

    def __repr__(self) -> str:
        return f"HttpTransport({self.base_url!r})"

    @property
    def base_url(self) -> str:
        """The base URL in use (of several, the node that last worked)."""
        return self.endpoints.current

    async def aclose(self) -> None:
        """Close the underlying client if this transport created it."""
        if self._owns_http:
            await self._http.aclose()

    async def request(
        self,
        method: str,
        path: str,
        *,
        body: Any = None,
        params: Mapping[str, Any] | None = None,
        headers: Mapping[str, str] | None = None,
        token: str | None = None,
    ) -> httpx.Response:
        """Send one request; return the 2xx response or raise the mapped OrbitError.

        ``body`` (when not None) is encoded as JSON with msgspec. ``params`` entries that are
        None are left out. ``token`` overrides the transport's bearer token for this call.
        """
        send_headers = {
            "Authorization": f"Bearer {token or self._token}",
            "Accept": "application/json",
            "User-Agent": USER_AGENT,
        }
        content: bytes | None = None
        if body is not None:
            content = _ENCODER.encode(body)
            send_headers["Content-Type"] = "application/json"
        if headers:
            send_headers.update(headers)
        query = {k: _param(v) for k, v in (params or {}).items() if v is not None}
        repeatable = method.upper() in _IDEMPOTENT or "Idempotency-Key" in send_headers
        nodes = list(self.endpoints.round())
        for i, base in enumerate(nodes):
            more = i + 1 < len(nodes)
            try:
                response = await self._http.request(
                    method, f"{base}{path}", content=content, params=query, headers=send_headers
                )
            except httpx.TransportError as exc:
                logger.debug("%s %s on %s failed: %s", method, path, base, type(exc).__name__)
                if more and (repeatable or isinstance(exc, _NOT_SENT)):
                    self.endpoints.failed(base)
                    continue
                raise OrbitConnectionError(
                    f"{method} {path}: {type(exc).__name__}: {exc}"
                ) from exc
            if response.status_code == 503 and more:  # not ready: it did nothing
                self.endpoints.failed(base)
                continue
            if response.status_code >= 400:
                raise error_from_response(
                    response.status_code, response.content, response.headers
                )
            return response
        raise AssertionError("unreachable: the last node answers or raises")  # pragma: no cover

    async def call(
        self,
        method: str,
        path: str,
        type: type[T],
        *,
        body: Any = None,
        params: Mapping[str, Any] | None = None,
        headers: Mapping[str, str] | None = None,
        token: str | None = None,
    ) -> T:
        """Like :meth:`request`, and decode the JSON body as ``type``."""
        response = await self.request(
            method, path, body=body, params=params, headers=headers, token=token
        )
        return decode(response, type)


def decode(response: httpx.Response, type: type[T]) -> T:
    """Decode a response body as ``type`` (an empty body decodes as ``null``)."""
    return _json.decode(response.content or b"null", type)


def _param(value: Any) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    return str(value)
