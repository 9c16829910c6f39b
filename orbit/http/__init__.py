"""Reusable HTTP pieces for every package's routes.

* :func:`orbit.http.app.build_app` — the application (middleware, error handlers, ops routes)
* :func:`orbit.http.auth.authorize` / ``authorize_admin`` / ``Principal`` — authn/authz
* :func:`orbit.http.body.decode_body` — size/depth-limited msgspec decoding (400 names field)
* :mod:`orbit.http.etag` — ``etag()``, ``preconditions()``, ``not_modified()``
* :mod:`orbit.http.responses` — ``json_response``, ``reply_response``, ``idem_request``
* :func:`orbit.http.auditing.audit_intent` — audit failed state-changing calls
* :func:`orbit.http.openapi.api` — OpenAPI metadata for ``/openapi.json``
"""
