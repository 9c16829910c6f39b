"""Contract between the SDK's HTTP types and the real server (tests/sdk_server.py).

* The server's actual JSON (read with plain httpx, not the SDK) decodes into each SDK type,
  and each SDK type declares every key the server sends (nothing silently dropped).
* The server's strict request types (unknown fields forbidden) decode the bodies the SDK
  encodes, to the same values.
"""

from __future__ import annotations

from typing import Any

import msgspec
from msgspec import inspect as mi
from orbit_sdk import (
    AckResult,
    DeliveryInfo,
    Event,
    EventPage,
    History,
    Instance,
    Occurrence,
    Page,
    PulledDelivery,
    Schedule,
    ScheduleTaskSpec,
    Signal,
    Subscription,
    SubscriptionFilter,
    WorkflowInfo,
    WorkflowSummary,
    WorkflowVersion,
    _schedules,
    _subscriptions,
    _workflows,
)
from sdk_server import (  # noqa: F401 - env_fixture, server_fixture: fixtures
    Env,
    env_fixture,
    eventually,
    finished_task_events,
    server_fixture,
    signal_workflow,
    unique,
)

from orbit.subscriptions import SubscriptionPut
from pulse.schedules import SchedulePut
from weave.types import SignalBody, StartBody

# ----------------------------------------------------------------------------- contract


def _check_keys(doc: Any, t: mi.Type, path: str) -> None:
    """Every key of every JSON object in ``doc`` is a field of the SDK type at that place."""
    if isinstance(t, mi.StructType):
        assert isinstance(doc, dict), f"{path}: expected an object"
        fields = {f.encode_name: f.type for f in t.fields}
        unknown = set(doc) - set(fields)
        assert not unknown, f"{path}: {t.cls.__name__} lacks {sorted(unknown)}"
        for k, v in doc.items():
            _check_keys(v, fields[k], f"{path}.{k}")
    elif isinstance(t, mi.ListType):
        for n, item in enumerate(doc):
            _check_keys(item, t.item_type, f"{path}[{n}]")
    elif isinstance(t, mi.UnionType) and isinstance(doc, dict):
        for member in t.types:
            if isinstance(member, mi.StructType):
                _check_keys(doc, member, path)


def decodes(content: bytes, sdk_type: Any) -> Any:
    """Decode the server's bytes as ``sdk_type`` after checking it declares every key."""
    _check_keys(msgspec.json.decode(content), mi.type_info(sdk_type), "$")
    return msgspec.json.decode(content, type=sdk_type)


async def test_contract_sdk_types_decode_the_servers_json(env: Env) -> None:

    queue = unique("q")
    await env.orbit.queues.put(queue)
    ns = f"/v1/namespaces/{env.ns}"
    async with env.http() as http:

        async def ok(method: str, path: str, json: Any = None) -> bytes:
            r = await http.request(method, f"{ns}{path}", json=json)
            assert r.status_code in (200, 201), r.text
            return r.content

        await env.orbit.queues.put("ticks")  # not the worker's queue
        sched = {"queue": "ticks", "every_ms": 1000, "task": {"kind": "k", "payload": {"a": 1}}}
        decodes(await ok("PUT", "/schedules/c1", sched), Schedule)
        decodes(await ok("POST", "/schedules/c1/pause"), Schedule)
        decodes(await ok("POST", "/schedules/c1/resume"), Schedule)
        decodes(await ok("GET", "/schedules"), Page[Schedule])

        async def fired() -> Any:
            return (await env.orbit.schedules.occurrences("c1")).items

        await eventually(fired)
        occ = decodes(await ok("GET", "/schedules/c1/occurrences"), Page[Occurrence])
        assert occ.items

        doc = {"definition": signal_workflow().to_dict()}
        decodes(await ok("POST", "/workflows/c1/versions", doc), WorkflowVersion)
        decodes(await ok("GET", "/workflows/c1"), WorkflowInfo)
        assert bytes(decodes(await ok("GET", "/workflows/c1/versions/1"),
                             WorkflowVersion).definition)  # fmt: skip
        decodes(await ok("GET", "/workflows"), Page[WorkflowSummary])
        inst = decodes(await ok("POST", "/workflows/c1/instances",
                                {"input": {"order": "c", "amount": 1}}), Instance)  # fmt: skip
        decodes(await ok("GET", f"/instances/{inst.id}"), Instance)
        decodes(await ok("POST", f"/instances/{inst.id}/pause"), Instance)
        decodes(await ok("POST", f"/instances/{inst.id}/resume"), Instance)
        decodes(await ok("GET", "/instances"), Page[Instance])
        sig = {"signal_id": "c", "payload": {"x": 1}, "correlation_key": "c"}
        decodes(await ok("POST", f"/instances/{inst.id}/signals/shipped", sig), Signal)
        await env.orbit.instances.wait(inst.id, timeout=30, interval=0.05)
        hist = decodes(await ok("GET", f"/instances/{inst.id}/history"), History)
        assert {e.entry for e in hist.items} == {"step", "activation", "wait"}
        other = await env.orbit.instances.start("c1", {"order": "d", "amount": 1})
        decodes(await ok("POST", f"/instances/{other.id}/cancel"), Instance)

        sub = {"filter": {"queues": [queue]}, "start": "earliest", "max_deliveries": 1}
        decodes(await ok("PUT", "/subscriptions/c1", sub), Subscription)
        await finished_task_events(env, queue)
        got: list[PulledDelivery] = []

        async def pulled() -> bool:
            content = await ok("POST", "/subscriptions/c1/pull", {"max": 10, "wait_ms": 200})
            for item in msgspec.json.decode(content)["deliveries"]:
                _check_keys(item["event"], mi.type_info(Event), "$.event")
            got.extend(decodes(content, _subscriptions._Pulled).deliveries)
            return len(got) >= 3

        await eventually(pulled)
        a, b = got[0], got[1]
        decodes(await ok("POST", f"/deliveries/{a.delivery_id}/ack", {"proof": a.proof}),
                AckResult)  # fmt: skip
        decodes(await ok("POST", f"/deliveries/{b.delivery_id}/nack", {"proof": b.proof}),
                DeliveryInfo)  # fmt: skip
        decodes(await ok("POST", f"/deliveries/{b.delivery_id}/budget", {"add": 1}),
                DeliveryInfo)  # fmt: skip
        decodes(await ok("GET", "/subscriptions/c1"), Subscription)
        decodes(await ok("GET", "/subscriptions/c1/deliveries"), Page[DeliveryInfo])
        decodes(await ok("GET", "/events?after_seq=0"), EventPage)


def test_contract_server_accepts_the_sdks_request_bodies() -> None:
    """The server's strict request types (unknown fields forbidden) decode what the SDK's
    bodies encode, to the same values."""
    put = _schedules._SchedulePut(
        queue="q", timezone="Europe/Paris", cron="0 9 * * *", catchup_window_ms=5,
        grace_ms=6, start_at="2026-01-01T00:00:00.000000Z",
        task=ScheduleTaskSpec(kind="k", payload=msgspec.Raw(b"[1.10]"), priority=2,
                              pipeline_version="v1", dedup_key="{fire_at}", max_attempts=3,
                              retry_safe=True, deadline_ms=10),
    )  # fmt: skip
    server_put = msgspec.json.decode(msgspec.json.encode(put), type=SchedulePut)
    assert server_put.task.dedup_key == "{fire_at}" and bytes(server_put.task.payload) == b"[1.10]"
    assert server_put.start_at == "2026-01-01T00:00:00.000000Z" and server_put.grace_ms == 6
    minimal = _schedules._SchedulePut(queue="q", task=ScheduleTaskSpec(kind="k"), every_ms=1000)
    assert msgspec.json.decode(msgspec.json.encode(minimal), type=SchedulePut).every_ms == 1000

    start = _workflows._Start(input=msgspec.Raw(b'{"a": 1.0}'), version=2, business_key="b")
    server_start = msgspec.json.decode(msgspec.json.encode(start), type=StartBody)
    assert bytes(server_start.input) == b'{"a": 1.0}' and server_start.version == 2
    sig = _workflows._SignalBody(signal_id="s", payload=msgspec.Raw(b"2.50"), correlation_key="c")
    server_sig = msgspec.json.decode(msgspec.json.encode(sig), type=SignalBody)
    assert bytes(server_sig.payload) == b"2.50" and server_sig.correlation_key == "c"

    body = _subscriptions._SubscriptionPut(
        filter=SubscriptionFilter(queues=["q"], states=["FAILED"]),
        start=_subscriptions._start(7), ack_timeout_ms=100, max_deliveries=2, max_in_flight=3,
    )  # fmt: skip
    server_sub = msgspec.json.decode(msgspec.json.encode(body), type=SubscriptionPut)
    assert server_sub.filter.queues == ["q"] and server_sub.filter.kinds is None  # type: ignore[union-attr]
    assert server_sub.start.after_seq == 7 and server_sub.max_in_flight == 3  # type: ignore[union-attr]
    assert msgspec.json.encode(_subscriptions._SubscriptionPut()) == b"{}"
