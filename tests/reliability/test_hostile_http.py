"""Hostile HTTP input against a real ``orbit-server``: every operation of ``/openapi.json``.

Expected behaviour, for every request a fuzzer can make with a valid key:

* never a 5xx other than ``503 not_ready`` (which must carry ``Retry-After``);
* every error is ``{"error": {"code", "message", "details"}}`` with a snake_case code;
* a rejected request (4xx) changes no row of any Orbit table (row counts and revision sums
  of every table compared before/after, scoped to the fuzzing tenant's application and
  namespaces so other tenants' background recovery cannot interfere), except the audit
  log, which records denials and conflicts by design.

Two generators: schemathesis (schema-aware, positive and negative cases) when it is
installed, and a small Hypothesis generator over the OpenAPI document (random JSON bodies,
query strings and path segments) that always runs. Bounded by ``ORBIT_FUZZ_EXAMPLES``
(examples per operation; default 6 for schemathesis, 3 for the raw generator).
"""

from __future__ import annotations

import json
import os
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import quote

import httpx
import pytest
from hypothesis import HealthCheck, Phase, given, settings
from hypothesis import strategies as st
from reliability_support import (
    CliTenant,
    Fingerprint,
    OrbitServer,
    diff,
    error_body_problem,
    record_figures,
)
from reliability_support import fuzz_tenant as fuzz_tenant
from reliability_support import log_dir as log_dir
from reliability_support import server as server  # fixtures

from orbit.storage import DSN

pytestmark = pytest.mark.process

EXAMPLES = int(os.environ.get("ORBIT_FUZZ_EXAMPLES", "6"))
RAW_EXAMPLES = max(3, EXAMPLES // 2)
#: Tables a rejected request may legitimately write (denials and conflicts are audited).
REJECTION_MAY_WRITE = ("orbit_audit_events",)


@dataclass
class FuzzLog:
    requests: int = 0
    rejected: int = 0
    by_status: dict[int, int] = field(default_factory=dict)
    problems: list[str] = field(default_factory=list)
    #: Accepted requests whose change the fingerprint saw (proves it can see one).
    changed_on_success: int = 0

    def check(self, method: str, path: str, status: int, body: bytes, ctype: str | None,
              headers: Any, before: dict[str, Any], after: dict[str, Any]) -> None:  # fmt: skip
        self.requests += 1
        self.by_status[status] = self.by_status.get(status, 0) + 1
        where = f"{method.upper()} {path} -> {status}"
        if status >= 500 and not (status == 503 and headers.get("retry-after")):
            self.problems.append(f"{where}: server error {body[:300]!r}")
        problem = error_body_problem(status, body, ctype)
        if problem:
            self.problems.append(f"{where}: malformed error body ({problem}) {body[:200]!r}")
        if status < 300 and diff(before, after):
            self.changed_on_success += 1
        if 400 <= status < 500:
            self.rejected += 1
            changed = diff(before, after)
            if changed:
                self.problems.append(f"{where}: rejected but changed {changed} {body[:200]!r}")


def _fixed_params(t: CliTenant) -> dict[str, str]:
    """Path parameters pinned to the fuzz tenant so requests reach validation, not the 404
    of an unknown namespace (the cross-tenant probe covers foreign names and ids)."""
    return {"ns": t.namespace, "app_id": t.application_id}


def test_schemathesis_every_operation(server: OrbitServer, fuzz_tenant: CliTenant,
                                      dsn: DSN) -> None:  # fmt: skip
    schemathesis = pytest.importorskip("schemathesis", reason="schemathesis is not installed: scripts/install dev")
    from schemathesis import GenerationMode

    doc = httpx.get(server.url + "/openapi.json").json()
    schema = schemathesis.openapi.from_dict(doc)
    fp = Fingerprint(dsn, exclude=REJECTION_MAY_WRITE, application_id=fuzz_tenant.application_id)
    log = FuzzLog()
    started = time.monotonic()
    operations = 0
    try:
        for result in schema.get_all_operations():
            op = result.ok()
            pinned = {k: v for k, v in _fixed_params(fuzz_tenant).items()
                      if any(p.name == k for p in op.path_parameters)}  # fmt: skip
            strategies = []
            for mode in (GenerationMode.POSITIVE, GenerationMode.NEGATIVE):
                try:
                    strategies.append(op.as_strategy(mode, path_parameters=pinned))
                except Exception:
                    continue
            operations += 1

            @settings(max_examples=EXAMPLES, deadline=None, database=None,
                      suppress_health_check=list(HealthCheck), phases=[Phase.generate])  # fmt: skip
            @given(case=st.one_of(*strategies))
            def run(case: Any) -> None:
                headers = {**(case.headers or {}), **fuzz_tenant.auth}
                before = fp.take()
                r = case.call(base_url=server.url, headers=headers, timeout=30)
                after = fp.take()
                if 400 <= r.status_code < 500 and diff(before, after):
                    # Background work of an earlier accepted request may have moved the
                    # reading: judge the (rejected, so repeatable) request again on a quiet
                    # database.
                    before = fp.take_quiet()
                    r = case.call(base_url=server.url, headers=headers, timeout=30)
                    after = fp.take()
                log.check(case.method, case.formatted_path, r.status_code, r.content,
                          r.headers.get("content-type"), r.headers, before, after)  # fmt: skip

            run()
    finally:
        fp.close()
    record_figures("hostile_http_schemathesis", operations=operations, requests=log.requests,
                   rejected=log.rejected, changed_on_success=log.changed_on_success, by_status=log.by_status, anomalies=len(log.problems),
                   seconds=round(time.monotonic() - started, 1))  # fmt: skip
    assert server.alive()
    assert not log.problems, "\n".join(log.problems[:30])
    assert operations == sum(len(v) for v in doc["paths"].values())
    assert log.changed_on_success > 0  # the fingerprint does see writes


# --- a schema-blind generator over the same document (no extra dependency) -------------------

JSON_VALUES = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False)
    | st.text(max_size=40),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=10), inner, max_size=4),
    max_leaves=12,
)  # fmt: skip
SEGMENTS = st.one_of(
    st.text(min_size=1, max_size=70),
    st.sampled_from(["0" * 32, "f" * 32, "..", "%2e%2e", "a" * 300, "-1", "null", "%00", "ü"]),
)


def _body_for(op: dict[str, Any]) -> st.SearchStrategy[bytes | None]:
    raw_json = JSON_VALUES.map(lambda v: json.dumps(v).encode())
    garbage = st.binary(max_size=200)
    deep = st.integers(30, 200).map(lambda n: ("[" * n + "]" * n).encode())
    if "requestBody" in op:
        return st.one_of(raw_json, garbage, deep, st.none())
    return st.one_of(st.none(), raw_json)


def test_schema_blind_fuzz_every_operation(server: OrbitServer, fuzz_tenant: CliTenant,
                                           dsn: DSN) -> None:  # fmt: skip
    """Random JSON, bytes, over-deep arrays, odd path segments and query strings on every
    operation of the document: the same three expectations as above."""
    doc = httpx.get(server.url + "/openapi.json").json()
    fp = Fingerprint(dsn, exclude=REJECTION_MAY_WRITE, application_id=fuzz_tenant.application_id)
    log = FuzzLog()
    fixed = _fixed_params(fuzz_tenant)
    client = httpx.Client(base_url=server.url, timeout=30)

    def _one_request(path: str, method: str) -> Callable[..., None]:
        def run_one(segments: dict[str, str], query: dict[str, str], body: bytes | None,
                    pin_ns: bool) -> None:  # fmt: skip
            values = dict(segments)
            if pin_ns:
                values.update({k: v for k, v in fixed.items() if k in segments})
            url = path
            for n, v in values.items():
                url = url.replace("{" + n + "}", quote(v, safe="") or "x")
            headers = dict(fuzz_tenant.auth)
            if body is not None:
                headers["content-type"] = "application/json"
            before = fp.take()
            try:
                r = client.request(method, url, params=query, content=body, headers=headers)
            except httpx.InvalidURL:
                return
            after = fp.take()
            if 400 <= r.status_code < 500 and diff(before, after):
                before = fp.take_quiet()  # as in the schemathesis test above
                r = client.request(method, url, params=query, content=body, headers=headers)
                after = fp.take()
            log.check(method, url, r.status_code, r.content, r.headers.get("content-type"),
                      r.headers, before, after)  # fmt: skip

        return run_one

    try:
        for path, ops in doc["paths"].items():
            for method, op in ops.items():
                names = [p["name"] for p in op.get("parameters", []) if p.get("in") == "path"]
                query_names = [p["name"] for p in op.get("parameters", []) if p.get("in") == "query"]
                seg = st.fixed_dictionaries({n: SEGMENTS for n in names})
                qs = st.dictionaries(st.sampled_from(query_names or ["x"]),
                                     st.text(max_size=30), max_size=3)  # fmt: skip
                pin = st.booleans()

                runner: Callable[..., None] = settings(
                    max_examples=RAW_EXAMPLES, deadline=None, database=None,
                    suppress_health_check=list(HealthCheck), phases=[Phase.generate],
                )(given(seg, qs, _body_for(op), pin)(_one_request(path, method)))  # fmt: skip
                runner()
    finally:
        client.close()
        fp.close()
    record_figures("hostile_http_raw", requests=log.requests, rejected=log.rejected,
                   by_status=log.by_status, anomalies=len(log.problems))  # fmt: skip
    assert server.alive()
    assert not log.problems, "\n".join(log.problems[:30])
    assert log.requests >= RAW_EXAMPLES * 10


# --- regressions found by the fuzzers ---------------------------------------------------------


def test_non_ascii_digits_are_400_not_500(server: OrbitServer, fuzz_tenant: CliTenant) -> None:
    """``"²".isdigit()`` is true but ``int("²")`` raises: found by the schema-blind fuzzer as
    a 500 on ``?limit=²`` (orbit/pagination.py). The same guard now covers Content-Length
    (orbit/http/middleware.py) and If-Match tags (orbit/preconditions.py)."""
    ns = f"{server.url}/v1/namespaces/{fuzz_tenant.namespace}"
    for url in (f"{ns}/events?limit=%C2%B2", f"{ns}/tasks?limit=%D9%A3", f"{ns}/queues?limit=%C2%B2"):
        r = httpx.get(url, headers=fuzz_tenant.auth)
        assert r.status_code == 400 and r.json()["error"]["details"]["field"] == "limit", r.text
    r = httpx.put(f"{ns}/queues/default", json={},
                  headers={**fuzz_tenant.auth, "If-Match": '"²"'.encode("latin-1")})  # fmt: skip
    assert r.status_code == 412, r.text
    import socket

    with socket.create_connection(("127.0.0.1", server.port), timeout=10) as s:
        s.sendall(b"POST /v1/namespaces/x/tasks HTTP/1.1\r\nHost: x\r\nContent-Length: \xb2\r\n\r\n")
        head = s.recv(200)
    assert not head.startswith(b"HTTP/1.1 500"), head


def test_non_ascii_workflow_version_is_404(server: OrbitServer, fuzz_tenant: CliTenant) -> None:
    r = httpx.get(f"{server.url}/v1/namespaces/{fuzz_tenant.namespace}/workflows/wf/versions/%C2%B2",
                  headers=fuzz_tenant.auth)  # fmt: skip
    assert r.status_code == 404, r.text


def test_integer_query_parameters_take_ascii_digits_only(server: OrbitServer,
                                                         fuzz_tenant: CliTenant) -> None:  # fmt: skip
    """``int()`` reads `` 1``, ``+1`` and ``1_0``; the document's ``integer`` does not: found
    by the conformance test as a 200 to a schema-invalid ``after_seq``."""
    ns = f"{server.url}/v1/namespaces/{fuzz_tenant.namespace}"
    for raw in (" 1", "+1", "1_0", "%D9%A3"):
        r = httpx.get(f"{ns}/events?after_seq={quote(raw) if '%' not in raw else raw}",
                      headers=fuzz_tenant.auth)  # fmt: skip
        assert r.status_code == 400 and r.json()["error"]["details"]["field"] == "after_seq", r.text
    assert httpx.get(f"{ns}/events?after_seq=1", headers=fuzz_tenant.auth).status_code == 200
