"""``/openapi.json`` describes what a real ``orbit-server`` enforces.

Schemathesis generates requests from the served document, in two modes, for every
operation (path parameters pinned to the fuzzing tenant so requests reach validation):

* **positive** (schema-valid requests): a 400 ``invalid_request`` or a 422 other than
  ``idempotency_mismatch`` is a mismatch — the server refused a request the document says
  is well formed, so the document misses a constraint the server enforces. The only 400s
  allowed are the ones no JSON Schema can state (:data:`SEMANTIC_FIELDS`: opaque cursors,
  cron expressions, workflow definitions, relations between fields, stored state), each
  judged by the ``details.field`` and message of the refusal.
* **negative** (requests that break the schema): the answer is a 4xx; a 2xx is judged by
  schemathesis's ``negative_data_rejection`` (which discards mutations that become valid
  once serialized, e.g. a number in a query string). The server ignores query parameters
  it does not know and takes an empty one as absent: a 2xx to such a request is accepted
  when the request without them gets the same answer.

In both modes every status answered must be one the operation documents, and every answer
with a documented body (successes and the error body) must match its schema
(schemathesis's ``response_schema_conformance``). Bounded by
``ORBIT_FUZZ_EXAMPLES`` (examples per operation and mode; default 6).
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import httpx
import pytest
from hypothesis import HealthCheck, Phase, given, settings
from hypothesis import strategies as st
from reliability_support import CliTenant, OrbitServer, record_figures
from reliability_support import fuzz_tenant as fuzz_tenant
from reliability_support import log_dir as log_dir
from reliability_support import server as server  # fixtures

pytestmark = pytest.mark.process

EXAMPLES = int(os.environ.get("ORBIT_FUZZ_EXAMPLES", "6"))

#: ``details.field`` of 400s a schema-valid request may still get: values whose validity a
#: JSON Schema cannot express (their grammar or meaning lives in the server), or that
#: depend on other fields or on stored state.
SEMANTIC_FIELDS: dict[str, tuple[str, ...]] = {
    # field: what the refusal message says ("" for any). Grammars the server owns:
    "cursor": ("",),  # an opaque token the server issued, bound to the filters of its list
    "cron": ("",),  # a cron expression (docs/api/schedules.md)
    "timezone": ("",),  # an IANA zone name of the server's tz database
    "definition": ("",),  # a workflow definition, checked by its own validator
    # relations between fields:
    "from": ("",),  # a backfill window: `from` before `to`, at most 1,000 fire times
    "to": ("",),
    "until": ("after since",),
    "end_at": ("after start_at",),
    "finished_before": ("after finished_after",),
    "audit_days": ("events_days",),
    "retry": ("at least backoff_initial_ms",),
    "retry_bounds": ("at least min_delay_ms",),
    "available_at": ("not both", "before 1970"),  # the epoch once its offset is applied
    # stored state and the clock:
    "namespaces": ("no namespace",),
    "expires_at": ("in the past",),
}


def _integers_as_integers(value: Any) -> Any:
    """JSON Schema's ``integer`` admits ``3.0``; Orbit reads integers written as integers
    (``3``) and refuses ``3.0`` as a wrong type (docs/security.md). Positive cases are sent
    with integral floats written as integers."""
    if isinstance(value, float) and value.is_integer():
        return int(value)
    if isinstance(value, list):
        return [_integers_as_integers(v) for v in value]
    if isinstance(value, dict):
        return {k: _integers_as_integers(v) for k, v in value.items()}
    return value


@dataclass
class Conformance:
    requests: int = 0
    by_mode: dict[str, dict[int, int]] = field(default_factory=dict)
    mismatches: list[str] = field(default_factory=list)

    def add(self, mode: str, where: str, status: int) -> None:
        self.requests += 1
        counts = self.by_mode.setdefault(mode, {})
        counts[status] = counts.get(status, 0) + 1

    def mismatch(self, text: str) -> None:
        if text not in self.mismatches:
            self.mismatches.append(text)


def _error(r: Any) -> tuple[str, str, str]:
    """(code, field, message) of an error answer ("" when absent)."""
    try:
        err = r.json()["error"]
        details = err.get("details") or {}
        return str(err.get("code", "")), str(details.get("field", "")), str(err.get("message", ""))
    except (ValueError, KeyError, TypeError, AttributeError):
        return "", "", r.text[:120]


def _root_field(name: str) -> str:
    return name.split(".")[0].split("[")[0]


def _query_valid(case: Any, params: dict[str, dict[str, Any]]) -> bool:
    """Whether every query value of ``case`` is valid for its parameter as the document states
    it (integers within their bounds, empty where ``allowEmptyValue``, enum members); any
    other kind of parameter is not judged here (False)."""
    for name, value in (case.query or {}).items():
        param = params.get(name)
        if param is None:
            return False
        schema = param.get("schema", {})
        if schema.get("type") == "integer":
            if value == "" and param.get("allowEmptyValue"):
                continue
            text = str(value)
            if isinstance(value, bool) or not (text.isascii() and text.isdigit()):
                return False
            if not schema.get("minimum", 0) <= int(text) <= schema.get("maximum", int(text)):
                return False
        elif "enum" in schema:
            if value not in schema["enum"]:
                return False
        else:
            return False
    return True


#: What schemathesis reports as invalid but is not, for this test: the Authorization header
#: it dropped (``send`` always adds the key back) and a value that violates one branch of an
#: ``anyOf`` (an integer that may be empty is ``anyOf: [integer, ""]``), which the other
#: branch may accept — such a case counts only if its query really breaks the document.
_NOT_INVALID = ("header: violates `required` (was Authorization)", "/anyOf/")


def _judge(case: Any, r: Any, positive: bool, documented: set[str], log: Conformance,
           negative_check: Any, response_check: Any, send: Callable[[Any], Any],
           params: dict[str, dict[str, Any]] | None = None) -> None:  # fmt: skip
    status = r.status_code
    label = f"{case.method.upper()} {case.operation.path}"
    log.add("positive" if positive else "negative", label, status)
    code, fld, message = _error(r)
    if str(status) not in documented and "default" not in documented:
        log.mismatch(f"{label}: answered {status} ({code}: {message}), not documented")
    try:
        case.validate_response(r, checks=[response_check])
    except (Exception, BaseExceptionGroup) as e:  # schemathesis's failure types
        lines = [x.strip() for x in str(e).splitlines() if x.strip()]
        log.mismatch(f"{label}: answer {status} does not match its schema: "
                     + " | ".join(lines[1:6])[:500])  # fmt: skip
    if positive:
        refused = status == 400 or (status == 422 and code != "idempotency_mismatch")
        semantic = SEMANTIC_FIELDS.get(_root_field(fld))
        if refused and not (semantic and any(part in message for part in semantic)):
            log.mismatch(f"{label}: schema-valid request refused {status} {code} "
                         f"field={fld!r}: {message}")  # fmt: skip
    elif not 400 <= status < 500:
        declared = {p.name for p in case.operation.query}
        ignored = {k for k, v in (case.query or {}).items() if v == "" or k not in declared}
        if ignored:  # an empty or unknown query parameter is ignored: same answer without it
            case.query = {k: v for k, v in case.query.items() if k not in ignored}
            if send(case).status_code == status:
                return
        try:
            case.validate_response(r, checks=[negative_check])
        except (Exception, BaseExceptionGroup) as e:  # schemathesis's failure types
            lines = [x.strip() for x in str(e).splitlines() if x.strip()]
            parts = [x for x in lines if x.startswith("- ")]
            if (parts and case.body is None and params is not None and _query_valid(case, params)
                    and all(any(n in x for n in _NOT_INVALID) for x in parts)):  # fmt: skip
                return
            log.mismatch(f"{label}: schema-invalid request answered {status}: "
                         + " | ".join(lines[2:8])[:500])  # fmt: skip


def test_document_matches_server(server: OrbitServer, fuzz_tenant: CliTenant) -> None:
    schemathesis = pytest.importorskip(
        "schemathesis", reason="schemathesis is not installed: scripts/install dev"
    )
    from schemathesis import GenerationMode
    from schemathesis.specs.openapi.checks import (
        negative_data_rejection,
        response_schema_conformance,
    )

    doc = httpx.get(server.url + "/openapi.json").json()
    schema = schemathesis.openapi.from_dict(doc)
    log = Conformance()
    fixed = {"ns": fuzz_tenant.namespace, "app_id": fuzz_tenant.application_id}
    started = time.monotonic()
    operations = 0

    def send(case: Any) -> Any:
        headers = {**(case.headers or {}), **fuzz_tenant.auth}
        return case.call(base_url=server.url, headers=headers, timeout=30)

    def _runner(documented: set[str], params: dict[str, dict[str, Any]]) -> Any:
        def run(item: tuple[Any, bool]) -> None:
            case, positive = item
            if positive and case.body is not None:
                case.body = _integers_as_integers(case.body)
            r = send(case)
            _judge(case, r, positive, documented, log, negative_data_rejection,
                   response_schema_conformance, send, params)  # fmt: skip

        return run

    for result in schema.get_all_operations():
        op = result.ok()
        if doc["paths"][op.path][op.method.lower()].get("x-websocket"):
            continue
        documented = set(doc["paths"][op.path][op.method.lower()]["responses"])
        params = {p["name"]: p for p in doc["paths"][op.path][op.method.lower()].get("parameters", [])
                  if p.get("in") == "query"}  # fmt: skip
        pinned = {k: v for k, v in fixed.items() if any(p.name == k for p in op.path_parameters)}
        strategies = []
        for mode in (GenerationMode.POSITIVE, GenerationMode.NEGATIVE):
            try:
                strategies.append(op.as_strategy(mode, path_parameters=pinned)
                                  .map(lambda c, m=mode: (c, m.is_positive)))  # fmt: skip
            except Exception:
                continue
        operations += 1

        settings(max_examples=EXAMPLES * len(strategies), deadline=None, database=None,
                 suppress_health_check=list(HealthCheck), phases=[Phase.generate])(
            given(item=st.one_of(*strategies))(_runner(documented, params))
        )()  # fmt: skip
    record_figures("openapi_conformance", operations=operations, requests=log.requests,
                   by_mode=log.by_mode, mismatches=len(log.mismatches),
                   seconds=round(time.monotonic() - started, 1))  # fmt: skip
    assert server.alive()
    assert not log.mismatches, f"{len(log.mismatches)} mismatches:\n" + "\n".join(log.mismatches)
    assert log.by_mode.get("positive") and log.by_mode.get("negative")
