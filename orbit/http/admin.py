"""Administration routes (docs/api/admin.md) plus the additive read routes the CLI uses.

Every route authenticates first (401), then authorises (403 audited / 404 for another
tenant), then decodes the body (400/413), then calls one service function.
"""

from __future__ import annotations

import msgspec
from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route

from orbit import applications, credentials, namespaces, resources
from orbit.context import AppContext
from orbit.errors import NotFound
from orbit.http.auditing import audit_intent, request_id
from orbit.http.auth import authenticated, authorize_admin
from orbit.http.body import decode_body
from orbit.http.etag import etag, not_modified, preconditions
from orbit.http.openapi import QueryParam, api
from orbit.http.responses import idem_request, json_response, reply_response
from orbit.ids import id_hex, parse_id
from orbit.pagination import decode_cursor, encode_cursor, parse_limit
from orbit.types import (
    ZERO_ID,
    ApplicationCreate,
    ApplicationOut,
    CredentialCreate,
    CredentialOut,
    NamespaceCreate,
    NamespaceOut,
    ResourcesOut,
    ResourcesPut,
    Whoami,
)

TAGS = ["administration"]
_PAGE = (
    QueryParam("limit", int, "page size, 1-500 (default 50)"),
    QueryParam("cursor", str, "next_cursor of the previous page"),
)


class ApplicationPage(msgspec.Struct, frozen=True):
    items: list[ApplicationOut]
    next_cursor: str | None


class NamespacePage(msgspec.Struct, frozen=True):
    items: list[NamespaceOut]
    next_cursor: str | None


class CredentialPage(msgspec.Struct, frozen=True):
    items: list[CredentialOut]
    next_cursor: str | None


def _ctx(request: Request) -> AppContext:
    return request.app.state.ctx  # type: ignore[no-any-return]


async def _admin_app(request: Request) -> tuple[credentials.Principal, bytes]:
    """Authorise admin on the path's ``{app_id}``; a malformed id is the same 404."""
    app_id = parse_id(request.path_params["app_id"])
    principal = await authorize_admin(request, app_id if app_id is not None else ZERO_ID)
    if app_id is None:
        raise NotFound("application")
    return principal, app_id


def _after_id(position: dict[str, object] | None) -> bytes:
    raw = position.get("after") if position else None
    parsed = parse_id(raw) if isinstance(raw, str) else None
    return parsed or ZERO_ID


@api(
    "Create an application (global admin)", body=ApplicationCreate,
    responses={201: ApplicationOut}, errors=[409, 422], action="admin (global)",
    idempotent=True, tags=TAGS,
)  # fmt: skip
async def create_application(request: Request) -> Response:
    principal = await authorize_admin(request, None)
    body = await decode_body(request, ApplicationCreate)
    audit_intent(request, applications.CREATE, "application", body.name)
    reply = await applications.create_application(
        _ctx(request).db, principal.actor, body.name,
        request_id=request_id(request), idem=await idem_request(request),
        retention_s=_ctx(request).settings.idempotency_retention_s,
    )  # fmt: skip
    return reply_response(reply)


@api(
    "List applications (a global admin sees all, an admin its own)",
    responses={200: ApplicationPage}, action="admin", query=_PAGE, tags=TAGS,
)  # fmt: skip
async def list_applications(request: Request) -> Response:
    principal = await authenticated(request)
    if not principal.may("admin"):
        await authorize_admin(request, principal.application_id)  # raises the audited 403
    limit = parse_limit(request.query_params.get("limit"))
    position = decode_cursor(request.query_params.get("cursor"))
    db = _ctx(request).db
    if principal.global_admin:
        rows = await applications.list_applications(db, _after_id(position), limit)
    else:
        own = await applications.get_application(db, principal.application_id)
        rows = [own] if own is not None and position is None else []
    nxt = encode_cursor({"after": id_hex(rows[-1].id)}) if len(rows) == limit else None
    return json_response(ApplicationPage([applications.application_out(r) for r in rows], nxt))


@api(
    "Read an application", responses={200: ApplicationOut}, errors=[404], action="admin", tags=TAGS
)
async def get_application(request: Request) -> Response:
    _, app_id = await _admin_app(request)
    row = await applications.get_application(_ctx(request).db, app_id)
    if row is None:
        raise NotFound("application")
    return json_response(applications.application_out(row), headers={"ETag": etag(row.revision)})


@api(
    "Create a namespace", body=NamespaceCreate, responses={201: NamespaceOut},
    errors=[404, 409, 422], action="admin", idempotent=True, tags=TAGS,
)  # fmt: skip
async def create_namespace(request: Request) -> Response:
    principal, app_id = await _admin_app(request)
    body = await decode_body(request, NamespaceCreate)
    audit_intent(request, namespaces.CREATE, "namespace", body.name)
    reply = await namespaces.create_namespace(
        _ctx(request).db, principal.actor, app_id, body.name,
        request_id=request_id(request), idem=await idem_request(request),
        retention_s=_ctx(request).settings.idempotency_retention_s,
    )  # fmt: skip
    return reply_response(reply)


@api(
    "List the namespaces of an application", responses={200: NamespacePage}, errors=[404],
    action="admin", query=_PAGE, tags=TAGS,
)  # fmt: skip
async def list_namespaces(request: Request) -> Response:
    _, app_id = await _admin_app(request)
    limit = parse_limit(request.query_params.get("limit"))
    filters = {"app": id_hex(app_id)}
    position = decode_cursor(request.query_params.get("cursor"), filters)
    db = _ctx(request).db
    if await applications.get_application(db, app_id) is None:
        raise NotFound("application")
    after = str(position.get("after", "")) if position else ""
    rows = await namespaces.list_namespaces(db, app_id, after, limit)
    nxt = encode_cursor({"after": rows[-1].name}, filters) if len(rows) == limit else None
    return json_response(NamespacePage([namespaces.namespace_out(r) for r in rows], nxt))


@api(
    "Create a credential (the key is shown once)", body=CredentialCreate,
    responses={201: CredentialOut}, errors=[404, 422], action="admin", idempotent=True,
    tags=TAGS,
)  # fmt: skip
async def create_credential(request: Request) -> Response:
    principal, app_id = await _admin_app(request)
    audit_intent(request, credentials.CREATE, "credential", None)
    body = await decode_body(request, CredentialCreate)
    db = _ctx(request).db
    if await applications.get_application(db, app_id) is None:
        raise NotFound("application")
    reply = await credentials.create_credential(
        db, principal, app_id, body,
        request_id=request_id(request), idem=await idem_request(request),
        retention_s=_ctx(request).settings.idempotency_retention_s,
    )  # fmt: skip
    return reply_response(reply, headers={"Cache-Control": "no-store"})


@api(
    "List the credentials of an application (never keys)", responses={200: CredentialPage},
    errors=[404], action="admin", query=_PAGE, tags=TAGS,
)  # fmt: skip
async def list_credentials(request: Request) -> Response:
    _, app_id = await _admin_app(request)
    limit = parse_limit(request.query_params.get("limit"))
    filters = {"app": id_hex(app_id)}
    position = decode_cursor(request.query_params.get("cursor"), filters)
    db = _ctx(request).db
    if await applications.get_application(db, app_id) is None:
        raise NotFound("application")
    items = await credentials.list_credentials(db, app_id, _after_id(position), limit)
    nxt = encode_cursor({"after": items[-1].id}, filters) if len(items) == limit else None
    return json_response(CredentialPage(items, nxt))


@api(
    "Revoke a credential (effective on its next request; revoking twice is a no-op)",
    responses={200: CredentialOut}, errors=[404], action="admin", tags=TAGS,
)  # fmt: skip
async def revoke_credential(request: Request) -> Response:
    cred_id = parse_id(request.path_params["cred_id"])
    principal = await authenticated(request)
    if not principal.may("admin"):
        await authorize_admin(request, principal.application_id)  # raises the audited 403
    if cred_id is None:
        raise NotFound("credential")
    audit_intent(request, credentials.REVOKE, "credential", cred_id)
    out = await credentials.revoke_credential(
        _ctx(request).db, principal, cred_id, request_id=request_id(request)
    )
    return json_response(out)


@api(
    "Read quotas and live usage", responses={200: ResourcesOut, 304: None}, errors=[404],
    action="admin", etag=True, tags=TAGS,
)  # fmt: skip
async def get_resources(request: Request) -> Response:
    _, app_id = await _admin_app(request)
    row = await resources.get_resources(_ctx(request).db, app_id)
    if row is None:
        raise NotFound("application")
    headers = {"ETag": etag(row.revision)}
    if not_modified(request, row.revision):
        return Response(status_code=304, headers=headers)
    return json_response(resources.resources_out(row), headers=headers)


@api(
    "Update quotas (omitted: unchanged, null: unlimited)", body=ResourcesPut,
    responses={200: ResourcesOut}, errors=[404, 412], action="admin", etag=True, tags=TAGS,
)  # fmt: skip
async def put_resources(request: Request) -> Response:
    principal, app_id = await _admin_app(request)
    audit_intent(request, resources.UPDATE, "resources", app_id)
    body = await decode_body(request, ResourcesPut)
    row, _changed = await resources.put_resources(
        _ctx(request).db, principal.actor, app_id, body,
        preconditions=preconditions(request), request_id=request_id(request),
    )  # fmt: skip
    return json_response(resources.resources_out(row), headers={"ETag": etag(row.revision)})


@api("What the presented key may do", responses={200: Whoami}, tags=TAGS)
async def whoami(request: Request) -> Response:
    principal = await authenticated(request)
    db = _ctx(request).db
    if principal.namespace_ids is None:
        names = ["*"]
    else:
        rows = await namespaces.list_namespaces(db, principal.application_id, "", 10_000)
        names = sorted(r.name for r in rows if r.id in principal.namespace_ids)
    return json_response(
        Whoami(
            application_id=id_hex(principal.application_id),
            credential_id=id_hex(principal.credential_id),
            namespaces=names,
            actions=sorted(principal.actions),
            queues=None if principal.queues is None else sorted(principal.queues),
            global_admin=principal.global_admin,
            admin_scope=_admin_scope(principal),
        )
    )


def _admin_scope(principal: credentials.Principal) -> str | None:
    if not principal.may("admin"):
        return None
    return "all_applications" if principal.global_admin else "application"


def routes() -> list[Route]:
    return [
        Route("/v1/whoami", whoami, methods=["GET"]),
        Route("/v1/applications", create_application, methods=["POST"]),
        Route("/v1/applications", list_applications, methods=["GET"]),
        Route("/v1/applications/{app_id}", get_application, methods=["GET"]),
        Route("/v1/applications/{app_id}/namespaces", create_namespace, methods=["POST"]),
        Route("/v1/applications/{app_id}/namespaces", list_namespaces, methods=["GET"]),
        Route("/v1/applications/{app_id}/credentials", create_credential, methods=["POST"]),
        Route("/v1/applications/{app_id}/credentials", list_credentials, methods=["GET"]),
        Route("/v1/credentials/{cred_id}", revoke_credential, methods=["DELETE"]),
        Route("/v1/applications/{app_id}/resources", get_resources, methods=["GET"]),
        Route("/v1/applications/{app_id}/resources", put_resources, methods=["PUT"]),
    ]
