"""Refusing a WebSocket upgrade with its HTTP error, logged once at info with the reason.

A refused upgrade is a normal event (a worker presenting the token of a session that expired
or was closed, a wrong key): :func:`refuse` answers it with the real HTTP error (the ASGI
denial-response extension) and logs one line, ``websocket <path> refused: <status> <code>:
<message>``, at info.

uvicorn's WebSocket protocol logs every denial response three times on ``uvicorn.error``: the
status line, ``connection rejected (…)`` and ``ASGI callable returned without completing
handshake.`` at *error* level (it counts a denial as an unfinished handshake). Those records
are logged in the connection's own task, after :func:`refuse` marked its context, so
:class:`QuietRefusals` drops exactly them; every other record of that logger passes.
"""

from __future__ import annotations

import logging
from contextvars import ContextVar

from starlette.responses import Response
from starlette.websockets import WebSocket

from orbit.errors import OrbitError

log = logging.getLogger("orbit.http.websocket")

#: Set in the task of a connection whose upgrade :func:`refuse` answered.
_refused: ContextVar[bool] = ContextVar("orbit_ws_refused", default=False)

#: What uvicorn (and the ``websockets`` protocol it drives) log about a denial response.
_DENIAL_RECORDS = (
    '%s - "WebSocket %s" %d',
    "connection rejected (%d %s)",
    "ASGI callable returned without completing handshake.",
)


class QuietRefusals(logging.Filter):
    """Drops uvicorn's records of a denial response that :func:`refuse` already logged."""

    def filter(self, record: logging.LogRecord) -> bool:
        return not (_refused.get() and record.msg in _DENIAL_RECORDS)


_FILTER = QuietRefusals()
logging.getLogger("uvicorn.error").addFilter(_FILTER)  # the same object is added only once


async def refuse(ws: WebSocket, exc: OrbitError, response: Response) -> None:
    """Answer ``ws``'s upgrade with ``response`` (the HTTP error of ``exc``) and log it once
    at info."""
    _refused.set(True)
    if exc.status < 500:  # a 5xx is logged as a warning by the error handler
        log.info("websocket %s refused: %d %s: %s", ws.url.path, exc.status, exc.code, exc.message)
    await ws.send_denial_response(response)
