"""JSON responses (msgspec) and idempotent replies."""

from __future__ import annotations

from typing import Any

import msgspec
from starlette.requests import Request
from starlette.responses import Response

from orbit.business_json import enc_hook
from orbit.idempotency import HEADER, IdemRequest, Reply, request_digest, validate_key

_ENC = msgspec.json.Encoder(enc_hook=enc_hook)  # business numbers as written
REPLAYED = "Idempotent-Replayed"


def json_response(obj: Any, status: int = 200, headers: dict[str, str] | None = None) -> Response:
    """Encode ``obj`` (Structs, dicts, ``msgspec.Raw``…) with msgspec."""
    return Response(
        _ENC.encode(obj), status_code=status, headers=headers, media_type="application/json"
    )


def reply_response(reply: Reply, headers: dict[str, str] | None = None) -> Response:
    """A service :class:`~orbit.idempotency.Reply`; replays carry ``Idempotent-Replayed: true``."""
    h = dict(headers or {})
    if reply.replayed:
        h[REPLAYED] = "true"
    return Response(reply.body, status_code=reply.status, headers=h, media_type="application/json")


async def idem_request(request: Request) -> IdemRequest | None:
    """The request's ``Idempotency-Key`` (validated, 400 otherwise) with its request digest
    over method, path and canonical body; None without the header."""
    key = request.headers.get(HEADER)
    if key is None:
        return None
    validate_key(key)
    body = await request.body()
    return IdemRequest(key, request_digest(request.method, request.url.path, body))
