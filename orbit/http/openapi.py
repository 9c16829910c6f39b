"""``/openapi.json`` generated from the registered routes and their msgspec types.

Endpoints describe themselves with the :func:`api` decorator::

    @api("Create a namespace", body=NamespaceCreate, responses={201: NamespaceOut},
         action="admin", idempotent=True)
    async def create_namespace(request): ...

The generator walks the app's routes (including mounted routers), takes path parameters
from the route templates, and builds component schemas with
``msgspec.json.schema_components``. Routes without the decorator still appear, with a
generic description, so the document always lists every path.

The document states the constraints the server enforces, taken from the same definitions
the validators use, so they cannot drift apart:

* request bodies: the msgspec Structs the handlers decode into (their ``Meta`` bounds,
  patterns and ``extra_json_schema``), with ``additionalProperties: false``;
* path parameters: names (``ns``, ``queue``, ``name``, ``signal``) carry the name pattern
  of :data:`orbit.types.Name`; ids stay plain strings (a malformed id is a 404);
* query parameters: ``limit`` is 1..:data:`orbit.pagination.MAX_LIMIT` unless the route
  gives its own type, other integers 0..2^63 - 1 (:func:`orbit.http.body.query_int`),
  ``enum`` lists the accepted values, and a :class:`QueryParam` type may be any type msgspec
  describes (e.g. :data:`orbit.times.Time`);
* statuses: every status an operation can answer, including the body rules of the
  middleware (408, 413, 415), 400 wherever input is validated, 404 on every path with a
  parameter and 503 ``not_ready`` on every operation that needs the database.

tests/reliability/test_openapi_conformance.py checks the document against a real server.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any, TypeVar

import msgspec
from starlette.routing import BaseRoute, Mount, Route, WebSocketRoute

from orbit.http.body import MAX_QUERY_INT
from orbit.http.errors import ErrorBody
from orbit.idempotency import MAX_KEY_LENGTH
from orbit.pagination import MAX_LIMIT
from orbit.types import Name

F = TypeVar("F", bound=Callable[..., Any])
ATTR = "__orbit_api__"

_STATUS_TEXT = {
    200: "OK", 201: "Created", 202: "Accepted", 204: "No Content", 304: "Not Modified",
    400: "Invalid request", 401: "Unauthenticated", 403: "Forbidden", 404: "Not found",
    408: "Request body too slow", 409: "Conflict", 412: "Precondition failed",
    413: "Payload too large", 415: "Body is not JSON",
    422: "Idempotency mismatch", 429: "Quota exceeded / rate limited", 503: "Not ready",
}  # fmt: skip

#: Path parameters that are names (docs/api/conventions.md#names): a name that breaks the
#: pattern is a 400 naming it.
#: ``Idempotency-Key``: 1-128 printable ASCII characters (:func:`orbit.idempotency.validate_key`).
IDEMPOTENCY_KEY_PATTERN = f"^[ -~]{{1,{MAX_KEY_LENGTH}}}$"
NAME_PARAMETERS = frozenset({"ns", "queue", "name", "signal"})
_NAME_SCHEMA: dict[str, Any] = msgspec.json.schema(Name)


@dataclass(frozen=True)
class QueryParam:
    """A documented query parameter."""

    name: str
    #: ``int``, ``str`` or any type msgspec can describe (``Annotated`` bounds, ``Literal``).
    type: Any = str
    description: str = ""
    required: bool = False
    #: The accepted values, when the parameter takes one of a fixed set.
    enum: tuple[str, ...] = ()


@dataclass(frozen=True)
class ApiDoc:
    """OpenAPI metadata of one endpoint (per HTTP method when a function serves several)."""

    summary: str
    body: type | None = None
    responses: dict[int, type | None] = field(default_factory=dict)
    errors: tuple[int, ...] = ()
    action: str | None = None
    open: bool = False
    idempotent: bool = False
    etag: bool = False
    query: tuple[QueryParam, ...] = ()
    tags: tuple[str, ...] = ()
    methods: tuple[str, ...] = ()


def api(
    summary: str,
    *,
    body: type | None = None,
    responses: dict[int, type | None] | None = None,
    errors: Sequence[int] = (),
    action: str | None = None,
    open: bool = False,
    idempotent: bool = False,
    etag: bool = False,
    query: Sequence[QueryParam] = (),
    tags: Sequence[str] = (),
    methods: Sequence[str] = (),
) -> Callable[[F], F]:
    """Attach OpenAPI metadata to an endpoint (stackable: one per method via ``methods``)."""

    doc = ApiDoc(
        summary=summary, body=body, responses=dict(responses or {200: None}),
        errors=tuple(errors), action=action, open=open, idempotent=idempotent, etag=etag,
        query=tuple(query), tags=tuple(tags), methods=tuple(m.upper() for m in methods),
    )  # fmt: skip

    def decorate(fn: F) -> F:
        docs = list(getattr(fn, ATTR, ()))
        docs.append(doc)
        setattr(fn, ATTR, docs)
        return fn

    return decorate


def _walk(routes: Iterable[BaseRoute], prefix: str = "") -> Iterable[tuple[str, BaseRoute]]:
    for r in routes:
        if isinstance(r, Mount):
            yield from _walk(r.routes, prefix + r.path)
        elif isinstance(r, (Route, WebSocketRoute)):
            yield prefix + r.path, r


def _path_params(path: str) -> list[dict[str, Any]]:
    out = []
    for part in path.split("{")[1:]:
        name = part.split("}")[0].split(":")[0]
        schema = dict(_NAME_SCHEMA) if name in NAME_PARAMETERS else {"type": "string"}
        out.append({"name": name, "in": "path", "required": True, "schema": schema})
    return out


def _query_param(q: QueryParam) -> dict[str, Any]:
    """The OpenAPI parameter of ``q``: integers are bounded as the parsers bound them
    (:func:`orbit.pagination.parse_limit`, :func:`orbit.http.body.query_int`), and an empty
    integer (``?limit=``) is taken as absent."""
    schema: dict[str, Any]
    if q.type is int:
        low, high = (1, MAX_LIMIT) if q.name == "limit" else (0, MAX_QUERY_INT)
        schema = {"type": "integer", "minimum": low, "maximum": high}
    elif q.type is str:
        schema = {"type": "string"}
    else:
        try:
            schema = msgspec.json.schema(q.type)
        except (TypeError, ValueError):
            schema = {"type": "string"}
    if q.enum:
        schema = {"type": "string", "enum": list(q.enum)}
    out: dict[str, Any] = {
        "name": q.name, "in": "query", "required": q.required, "description": q.description,
        "schema": schema,
    }  # fmt: skip
    if schema.get("type") == "integer" and not q.required:
        out["allowEmptyValue"] = True
    return out


def _clean_path(path: str) -> str:
    parts = path.split("{")
    return parts[0] + "".join(
        "{" + p.split("}")[0].split(":")[0] + "}" + p.split("}", 1)[1] for p in parts[1:]
    )


def _any_schema(_type: type) -> dict[str, Any]:
    """Types msgspec cannot describe (``object``, custom classes) are "any JSON value"."""
    return {"description": "any JSON value"}


def _schemas(types: list[Any]) -> tuple[dict[Any, dict[str, Any]], dict[str, Any]]:
    """Schema (or $ref) per type plus the components; a type msgspec cannot describe (e.g. a
    field default it cannot encode) degrades to "any JSON value" instead of failing."""
    template = "#/components/schemas/{name}"
    try:
        schemas, components = msgspec.json.schema_components(
            types, schema_hook=_any_schema, ref_template=template
        )
        return dict(zip(types, schemas, strict=True)), components
    except (TypeError, ValueError):
        pass
    ref: dict[Any, dict[str, Any]] = {}
    components = {}
    for t in types:
        try:
            (schema,), comps = msgspec.json.schema_components(
                [t], schema_hook=_any_schema, ref_template=template
            )
        except (TypeError, ValueError):
            schema, comps = {"description": f"{getattr(t, '__name__', t)} (schema unavailable)"}, {}
        ref[t] = schema
        components.update(comps)
    return ref, components


def _endpoint(route: BaseRoute) -> Any:
    """The route's handler function, unwrapping the ``functools.partial`` a package's
    ``routes(runtime)`` binds its runtime with."""
    endpoint = getattr(route, "endpoint", None)
    while isinstance(endpoint, functools.partial):
        endpoint = endpoint.func
    return endpoint


def openapi_document(
    routes: Iterable[BaseRoute], *, title: str = "Orbit", version: str = "1"
) -> dict[str, Any]:
    """The OpenAPI 3.1 document of ``routes``."""
    types: list[Any] = [ErrorBody]
    ops: list[tuple[str, str, ApiDoc | None, BaseRoute]] = []
    for path, route in _walk(routes):
        docs: list[ApiDoc] = list(getattr(_endpoint(route), ATTR, ()))
        if isinstance(route, WebSocketRoute):
            ops.append((_clean_path(path), "get", docs[0] if docs else None, route))
            continue
        methods = (
            sorted((route.methods or {"GET"}) - {"HEAD"}) if isinstance(route, Route) else ["GET"]
        )
        for method in methods:
            doc = next((d for d in docs if not d.methods or method in d.methods), None)
            ops.append((_clean_path(path), method.lower(), doc, route))
        for d in docs:
            types.extend(t for t in (d.body, *d.responses.values()) if t is not None)
    ref, components = _schemas(list(dict.fromkeys(types)))
    paths: dict[str, dict[str, Any]] = {}
    for path, method, doc, route in ops:
        op: dict[str, Any] = {"parameters": _path_params(path)}
        if doc is None:
            op["summary"] = getattr(_endpoint(route), "__doc__", None) or path
            op["summary"] = op["summary"].strip().splitlines()[0]
            op["responses"] = {"default": {"description": "see docs/api"}}
        else:
            op["summary"] = doc.summary
            if doc.tags:
                op["tags"] = list(doc.tags)
            if doc.action:
                op["x-orbit-action"] = doc.action
            if doc.open:
                op["security"] = []
            for q in doc.query:
                op["parameters"].append(_query_param(q))
            if doc.idempotent:
                op["parameters"].append({
                    "name": "Idempotency-Key", "in": "header", "required": False,
                    "schema": {"type": "string", "pattern": IDEMPOTENCY_KEY_PATTERN},
                })  # fmt: skip
            if doc.etag:
                for h in ("If-Match", "If-None-Match"):
                    op["parameters"].append(
                        {"name": h, "in": "header", "required": False, "schema": {"type": "string"}}
                    )
            if doc.body is not None:
                op["requestBody"] = {
                    "required": True,
                    "content": {"application/json": {"schema": ref[doc.body]}},
                }
            responses: dict[str, Any] = {}
            for status, t in doc.responses.items():
                entry: dict[str, Any] = {"description": _STATUS_TEXT.get(status, "OK")}
                if t is not None:
                    entry["content"] = {"application/json": {"schema": ref[t]}}
                responses[str(status)] = entry
            error_codes = set(doc.errors)
            validated = doc.body is not None or doc.query or doc.idempotent
            if validated or any(p["name"] in NAME_PARAMETERS for p in op["parameters"]):
                error_codes.add(400)
            if method in ("post", "put", "patch"):  # the middleware's body rules
                error_codes |= {408, 413, 415}
            if not doc.open:  # the key is checked against the database
                error_codes |= {401, 403, 503}
            if any(p["in"] == "path" for p in op["parameters"]):  # absent or not visible
                error_codes.add(404)
            for status in sorted(error_codes):
                responses[str(status)] = {
                    "description": _STATUS_TEXT.get(status, "Error"),
                    "content": {"application/json": {"schema": ref[ErrorBody]}},
                }
            op["responses"] = responses
        if isinstance(route, WebSocketRoute):
            op["x-websocket"] = True
        paths.setdefault(path, {})[method] = op
    return {
        "openapi": "3.1.0",
        "info": {"title": title, "version": version},
        "paths": paths,
        "components": {
            "schemas": components,
            "securitySchemes": {"bearer": {"type": "http", "scheme": "bearer"}},
        },
        "security": [{"bearer": []}],
    }
