"""Which tenant a request's database work is for (orbit/storage/fairness.py shares the pool
by tenant).

A request starts as the tenant its bearer token *probably* belongs to: the application this
node last saw authenticate with the very same API key or session token (remembered by a
digest of the whole token, so a made-up token that copies another's prefix is not taken for
it), else "unknown" — all requests with a token this node has not seen authenticate share
one bucket, so a flood of bad or new tokens competes with itself. Once
the key or session token is verified, the request works for its application
(:func:`enter_application`), and the hint is remembered for the next request. The hints are
only hints (bounded memory, node-local); authorization never relies on them.
"""

from __future__ import annotations

import hashlib
from collections import OrderedDict

from starlette.types import Scope

from orbit.storage.fairness import enter_tenant

#: The tenant of requests whose token this node has not seen authenticate.
UNKNOWN = ("unknown",)
#: Token digests remembered at most.
MAX_HINTS = 100_000


class TenantHints:
    """This node's token digest → application hints (bounded, least recently seen dropped
    first); one per process, on :attr:`orbit.context.AppContext.tenant_hints`."""

    __slots__ = ("_hints",)

    def __init__(self) -> None:
        self._hints: OrderedDict[bytes, bytes] = OrderedDict()

    def get(self, token_id: bytes) -> bytes | None:
        return self._hints.get(token_id)

    def remember(self, token_id: bytes, application_id: bytes) -> None:
        self._hints[token_id] = application_id
        self._hints.move_to_end(token_id)
        if len(self._hints) > MAX_HINTS:
            self._hints.popitem(last=False)


def application_tenant(application_id: bytes) -> tuple[str, bytes]:
    """The fairness key of an application."""
    return ("app", application_id)


def _token_id(token: str) -> bytes | None:
    """A digest of an ``orb_<credential id>_…`` or ``pws_<namespace id>_…`` token (no check
    of the token itself); None for anything else."""
    prefix, _, rest = token.partition("_")
    if prefix not in ("orb", "pws") or len(rest) < 33 or rest[32] != "_":
        return None
    return hashlib.blake2b(token.encode(), digest_size=16).digest()


def _bearer(scope: Scope) -> str | None:
    for k, v in scope.get("headers", ()):
        if k == b"authorization":
            scheme, _, token = v.decode("latin-1").partition(" ")
            return token.strip() if scheme.lower() == "bearer" else None
    return None


def enter_provisional(scope: Scope, hints: TenantHints) -> None:
    """Set the running task's tenant from the request's bearer token (see the docstring)."""
    token = _bearer(scope)
    token_id = _token_id(token) if token else None
    app = hints.get(token_id) if token_id else None
    enter_tenant(application_tenant(app) if app is not None else UNKNOWN)


def enter_application(hints: TenantHints, application_id: bytes, token: str | None = None) -> None:
    """The request's key or session token was verified: its work is for ``application_id``
    from now on; remember the token's id → application hint."""
    enter_tenant(application_tenant(application_id))
    token_id = _token_id(token) if token else None
    if token_id is None:
        return
    hints.remember(token_id, application_id)
