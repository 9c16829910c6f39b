"""Authentication and authorization of HTTP and WebSocket requests.

``Authorization: Bearer <api key>`` (key format in :mod:`orbit.credentials`).

* 401 ``unauthenticated``: header missing or malformed, key unknown, wrong, revoked, expired,
  or its application disabled. Nothing is audited (there is no actor), it is counted.
* 403 ``forbidden``: a valid key without the route's action, or with a queue list that does
  not include the route's queue. Audited (outcome ``denied``).
* 404 ``not_found``: ``{ns}`` is not a namespace of the key's application, or the key may
  not see it: the same body as an absent resource.

Order of checks: key → action → namespace → queue. Checking the action before the namespace
means a key without the action learns nothing about which namespaces exist.

For admin routes :func:`authorize_admin` requires ``admin`` and either a global admin key or
the key's own application; another application is the same 404 as an absent one.
"""

from __future__ import annotations

from starlette.requests import HTTPConnection

from orbit import audit
from orbit.audit import Outcome
from orbit.credentials import Principal, authenticate
from orbit.errors import Forbidden, NotFound, Unauthenticated
from orbit.http.auditing import request_id
from orbit.http.tenancy import enter_application
from orbit.types import ZERO_ID

__all__ = ["Principal", "authorize", "authorize_admin", "bearer_key", "principal_of"]


def bearer_key(conn: HTTPConnection) -> str | None:
    """The bearer token of the ``Authorization`` header, or None."""
    header = conn.headers.get("authorization")
    if not header:
        return None
    scheme, _, token = header.partition(" ")
    if scheme.lower() != "bearer" or not token.strip():
        return None
    return token.strip()


def _state(conn: HTTPConnection) -> dict[str, object]:
    return conn.scope.setdefault("state", {})  # type: ignore[no-any-return]


def principal_of(conn: HTTPConnection) -> Principal | None:
    """The principal authenticated on this request so far, if any."""
    p = _state(conn).get("principal")
    return p if isinstance(p, Principal) else None


async def _deny(
    conn: HTTPConnection,
    principal: Principal,
    action: str,
    resource_kind: str,
    resource_id: bytes | str | None,
    namespace_id: bytes,
    message: str,
) -> Forbidden:
    ctx = conn.app.state.ctx
    await audit.record_detached(
        ctx.db,
        actor=principal.actor,
        action=action,
        resource_kind=resource_kind,
        resource_id=resource_id,
        outcome=Outcome.DENIED,
        status_code=403,
        namespace_id=namespace_id,
        request_id=request_id(conn),
        details={"reason": message},
    )
    exc = Forbidden(message)
    exc.audited = True  # type: ignore[attr-defined]
    return exc


async def _authenticate(
    conn: HTTPConnection, namespace: str | None
) -> tuple[Principal, bytes | None]:
    ctx = conn.app.state.ctx
    try:
        principal, ns_id = await authenticate(ctx.db, bearer_key(conn), namespace)
    except Unauthenticated:
        ctx.metrics.counter("orbit_auth_failures_total", "Requests rejected with 401", ()).inc()
        raise
    _state(conn)["principal"] = principal
    enter_application(ctx.tenant_hints, principal.application_id, bearer_key(conn))
    return principal, ns_id


async def authorize(
    conn: HTTPConnection,
    action: str,
    namespace_name: str | None = None,
    queue: str | None = None,
) -> Principal:
    """Authenticate the key and check ``action`` (and ``{ns}``, and ``queue`` when given).

    Returns the principal with ``namespace_id``/``namespace_name`` set when a namespace was
    named. Raises 401 / 403 (audited) / 404 as described in the module docstring.
    """
    principal, ns_id = await _authenticate(conn, namespace_name)
    if not principal.may(action):
        raise await _deny(
            conn, principal, action, "namespace" if namespace_name else "action",
            namespace_name, ns_id or ZERO_ID, f"the key lacks the {action!r} action",
        )  # fmt: skip
    if namespace_name is None:
        return principal
    if ns_id is None or not principal.sees_namespace(ns_id):
        raise NotFound("namespace")
    principal = principal.in_namespace(ns_id, namespace_name)
    _state(conn)["principal"] = principal
    if queue is not None and not principal.may_use_queue(queue):
        raise await _deny(
            conn, principal, action, "queue", queue, ns_id,
            f"the key may not use queue {queue!r}",
        )  # fmt: skip
    return principal


def check_queue(principal: Principal, queue: str) -> None:
    """For routes that learn the queue only from the body: 403 when it is not allowed.

    (Not audited here; the route's audit intent covers it via the error handler.)
    """
    if not principal.may_use_queue(queue):
        raise Forbidden(f"the key may not use queue {queue!r}")


async def authorize_admin(conn: HTTPConnection, application_id: bytes | None) -> Principal:
    """Authorise an administrative call on ``application_id`` (None: a global operation such
    as creating an application, which needs a global admin key).

    403 (audited) for a key without ``admin`` or a non-global key on a global operation;
    404 for an application the key does not administer (same as absent).
    """
    principal, _ = await _authenticate(conn, None)
    if not principal.may("admin"):
        raise await _deny(
            conn, principal, "admin", "application", application_id, ZERO_ID,
            "the key lacks the 'admin' action",
        )  # fmt: skip
    if application_id is None:
        if not principal.global_admin:
            raise await _deny(
                conn, principal, "admin", "application", None, ZERO_ID,
                "only a global admin key may do this",
            )  # fmt: skip
        return principal
    if not principal.administers(application_id):
        raise NotFound("application")
    return principal


async def authenticated(conn: HTTPConnection) -> Principal:
    """Any valid key (no action needed), e.g. for ``GET /v1/whoami``."""
    principal, _ = await _authenticate(conn, None)
    return principal
