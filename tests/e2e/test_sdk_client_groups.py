"""The SDK's schedule, workflow, instance, subscription and event groups against a real server.

The server is ``orbit-server``'s composition root on a free port (tests/sdk_server.py). Every
public method of the new groups, async and sync, is exercised on its happy path and with
one error the server answers, checking that the SDK raises the class for its ``code``. The
contract tests (the server's JSON against the SDK types) are in
tests/e2e/test_sdk_client_contract.py.
"""

from __future__ import annotations

import asyncio
import contextlib
from typing import Any

import msgspec
import pytest
from orbit_sdk import (
    Conflict,
    Forbidden,
    IdempotencyMismatch,
    InvalidRequest,
    NotFound,
    OrbitClient,
    PreconditionFailed,
    ScheduleTaskSpec,
    StaleProof,
    SyncOrbitClient,
    Unauthenticated,
)
from platform_fixtures import add_key
from sdk_server import (  # noqa: F401 - env_fixture, server_fixture: fixtures
    RAW_PAYLOAD,
    Env,
    collect,
    env_fixture,
    eventually,
    finished_task_events,
    server_fixture,
    signal_workflow,
    unique,
)

from orbit.storage import Database

# ----------------------------------------------------------------------------- schedules


async def test_schedules(env: Env) -> None:
    s = env.orbit.schedules
    queue = unique("q")
    await env.orbit.queues.put(queue)
    name = unique("every")
    task = ScheduleTaskSpec(kind="tick", payload=msgspec.Raw(RAW_PAYLOAD), priority=3)

    made = await s.put(name, queue=queue, every_ms=1000, task=task, grace_ms=30_000)
    assert made.created and made.version == 1 and made.etag == f'"{made.revision}"'
    assert made.every_ms == 1000 and made.cron is None and made.queue == queue
    assert bytes(made.task.payload) == RAW_PAYLOAD and made.task.priority == 3
    assert made.next_fire_at is not None and made.next_fire_at.microsecond == 0
    same = await s.put(name, queue=queue, every_ms=1000, task=task, grace_ms=30_000)
    assert not same.created and same.revision == made.revision and same.version == 1
    v2 = await s.put(
        name, queue=queue, every_ms=1000, task={"kind": "tick", "payload": {"n": 2}},
        if_match=made.etag,
    )  # fmt: skip
    assert not v2.created and v2.version == 2 and v2.grace_ms == 60_000  # default again
    with pytest.raises(PreconditionFailed):
        await s.put(name, queue=queue, every_ms=2000, task=task, if_match=made.etag)
    with pytest.raises(PreconditionFailed):
        await s.put(name, queue=queue, every_ms=1000, task=task, create_only=True)
    with pytest.raises(NotFound):
        await s.put(unique("s"), queue="no-such-queue", every_ms=1000, task=task)
    with pytest.raises(InvalidRequest) as bad:
        await s.put(unique("s"), queue=queue, cron="not a cron", task=task)
    assert bad.value.field is not None

    got = await s.get(name)
    assert got.version == 2 and got.etag == v2.etag and got.task.decode_payload() == {"n": 2}
    with pytest.raises(NotFound):
        await s.get("absent")

    others = [unique("c") for _ in range(2)]
    for other in others:
        await s.put(other, queue=queue, cron="0 9 * * 1-5", timezone="Europe/Paris", task=task)
    page = await s.list(limit=2)
    assert len(page.items) == 2 and page.next_cursor
    assert {x.name for x in await collect(s.iter(page_size=1))} == {name, *others}
    with pytest.raises(InvalidRequest):
        await s.list(cursor="garbage")

    # The scheduler fires the interval schedule; each occurrence names its task.
    async def created() -> Any:
        items = (await s.occurrences(name, outcome="created")).items
        return items if items and items[0].version == 2 else None

    fired = await eventually(created)
    assert fired[0].outcome == "created"
    assert fired[0].fire_at is not None and fired[0].fire_at.microsecond == 0
    ticked = await env.orbit.tasks.get(fired[0].task_id or "")
    assert ticked.kind == "tick" and bytes(ticked.payload) == b'{"n":2}'
    with pytest.raises(InvalidRequest) as bad:
        await s.occurrences(name, outcome="bogus")
    assert bad.value.field == "outcome"

    paused = await s.pause(name)
    assert paused.paused and paused.next_fire_at is None
    assert (await s.pause(name)).control_revision == paused.control_revision  # idempotent
    await asyncio.sleep(1.2)  # at least one fire time falls into the pause
    resumed = await s.resume(name)
    assert not resumed.paused and resumed.control_revision == paused.control_revision + 1
    skipped = (await s.occurrences(name, outcome="skipped")).items
    assert skipped and skipped[0].reason == "paused" and (skipped[0].skipped_count or 0) >= 1
    await s.pause(name)  # no new fire times while the two listings are compared
    every = await collect(s.iter_occurrences(name, page_size=1))
    assert [o.id for o in every] == [o.id for o in (await s.occurrences(name, limit=500)).items]
    for call in (s.pause, s.resume):
        with pytest.raises(NotFound):
            await call("absent")
    with pytest.raises(NotFound):
        await collect(s.iter_occurrences("absent"))
    with pytest.raises(InvalidRequest):
        await collect(s.iter(page_size=0))


# ----------------------------------------------------------------------------- workflows


async def test_workflows(env: Env, db: Database) -> None:
    w = env.orbit.workflows
    name = unique("wf")
    first = await w.publish(name, signal_workflow())
    assert first.created and not first.unchanged and first.version == 1 and first.step_count == 2
    again = await w.publish(name, signal_workflow().to_dict())  # a dict: same content
    assert not again.created and again.unchanged and again.version == 1
    raw = b'{"steps": [{"id": "done", "type": "succeed", "output": {"pi": 3.140}}]}'
    second = await w.publish(name, msgspec.Raw(raw))
    assert second.created and second.version == 2
    with pytest.raises(InvalidRequest) as bad:
        await w.publish(name, {"steps": [{"id": "x", "type": "task", "next": "nowhere"}]})
    assert "step" in bad.value.details and bad.value.details["errors"]
    with pytest.raises(TypeError):
        await w.publish(name, 42)

    key, other = unique("idem"), unique("wf")
    a = await w.publish(other, {"steps": [{"id": "ok", "type": "succeed"}]}, idempotency_key=key)
    replay = await w.publish(other, {"steps": [{"id": "ok", "type": "succeed"}]},
                             idempotency_key=key)  # fmt: skip
    assert a.created and replay.created and replay.version == a.version == 1  # the first answer
    with pytest.raises(IdempotencyMismatch):
        await w.publish(other, {"steps": [{"id": "no", "type": "succeed"}]}, idempotency_key=key)

    info = await w.get(name)
    assert info.name == name and info.latest_version == 2
    assert [v.version for v in info.versions] == [2, 1]
    assert [v.version for v in await collect(w.iter_versions(name, page_size=1))] == [2, 1]
    with pytest.raises(NotFound):
        await w.get("absent")
    with pytest.raises(NotFound):
        await collect(w.iter_versions("absent"))
    exact = await w.version(name, 2)
    assert bytes(exact.definition) == raw and exact.decode_definition()["steps"][0]["id"] == "done"
    assert (await w.version(name, 1)).decode_definition() == signal_workflow().to_dict()
    with pytest.raises(NotFound):
        await w.version(name, 9)

    listed = await w.list()
    assert name in {x.name for x in listed.items}
    assert {x.name for x in await collect(w.iter(page_size=1))} >= {name, a.name}
    _, reader = await add_key(db, env.tenant, ["tasks.read"])
    async with OrbitClient(env.server.url, reader, namespace=env.ns) as limited:
        with pytest.raises(Forbidden):
            await limited.workflows.list()
        with pytest.raises(Forbidden):
            await collect(limited.workflows.iter())


# ----------------------------------------------------------------------------- instances


async def test_instances(env: Env) -> None:
    name = unique("orders")
    await env.orbit.workflows.publish(name, signal_workflow())
    i = env.orbit.instances
    raw_input = b'{"order": "o-1", "amount": 19.90}'
    inst = await i.start(name, msgspec.Raw(raw_input))
    assert inst.created and inst.state == "RUNNING" and not inst.paused and inst.version == 1
    assert bytes(inst.input) == raw_input and inst.decode_input()["amount"] == 19.9
    assert [st.step for st in inst.steps] == ["ship"] and inst.owner_id == env.tenant.app_hex

    by_key = await i.start(name, {"order": "o-2", "amount": 1}, business_key="o-2")
    dup = await i.start(name, {"order": "o-2", "amount": 1}, business_key="o-2")
    assert by_key.created and dup.deduplicated and not dup.created and dup.id == by_key.id
    key = unique("idem")
    first = await i.start(name, {"order": "o-3", "amount": 1}, idempotency_key=key)
    replay = await i.start(name, {"order": "o-3", "amount": 1}, idempotency_key=key)
    assert replay.id == first.id
    with pytest.raises(IdempotencyMismatch):
        await i.start(name, {"order": "o-4", "amount": 1}, idempotency_key=key)
    with pytest.raises(NotFound):
        await i.start("absent", {})
    with pytest.raises(InvalidRequest) as bad:
        await i.start(name, {"order": 5})
    assert bad.value.field == "input"

    got = await i.get(inst.id)
    assert got.etag == '"1"' and got.control_revision == 1 and got.steps[0].type == "wait_signal"
    with pytest.raises(NotFound):
        await i.get("0" * 32)
    running = await i.list(workflow=name, state="RUNNING")
    assert {x.id for x in running.items} == {inst.id, by_key.id, first.id}
    assert [x.id for x in await collect(i.iter(workflow=name, page_size=1))] == [
        x.id for x in running.items
    ]
    with pytest.raises(InvalidRequest):
        await i.list(state="NOPE")
    with pytest.raises(InvalidRequest):
        await collect(i.iter(state="NOPE"))

    # Control with If-Match on the control revision.
    with pytest.raises(PreconditionFailed):
        await i.pause(inst.id, if_match='"9"')
    paused = await i.pause(inst.id, if_match=got.etag)
    assert paused.paused and paused.etag == '"2"'
    resumed = await i.resume(inst.id, if_match=2)
    assert not resumed.paused and resumed.control_revision == 3
    with pytest.raises(TimeoutError):
        await i.wait(inst.id, timeout=0.3)

    # Signals: exact payload bytes, duplicate replay, conflicting reuse.
    raw_payload = b'{"tracking": "T1", "weight": 1.50}'
    sig = await i.signal(inst.id, "shipped", msgspec.Raw(raw_payload), signal_id="wh-1",
                         correlation_key="o-1")  # fmt: skip
    assert not sig.duplicate and bytes(sig.payload) == raw_payload and sig.name == "shipped"
    dup_sig = await i.signal(inst.id, "shipped", msgspec.Raw(raw_payload), signal_id="wh-1",
                             correlation_key="o-1")  # fmt: skip
    assert dup_sig.duplicate and dup_sig.id == sig.id
    with pytest.raises(Conflict):
        await i.signal(inst.id, "shipped", {"tracking": "T2"}, signal_id="wh-1",
                       correlation_key="o-1")  # fmt: skip

    done = await i.wait(inst.id, timeout=30, interval=0.05)
    assert done.state == "SUCCEEDED" and done.finished_at is not None
    assert done.decode_output() == {"shipment": {"tracking": "T1", "weight": 1.5}}
    assert b"1.50" in bytes(done.output)  # the signal payload's digits survive
    with pytest.raises(Conflict):
        await i.signal(inst.id, "shipped", 1, signal_id="wh-late")
    with pytest.raises(Conflict) as conflict:
        await i.pause(inst.id)
    assert conflict.value.details.get("state") == "SUCCEEDED"
    with pytest.raises(Conflict):
        await i.resume(inst.id)
    with pytest.raises(Conflict):
        await i.cancel(inst.id)

    history = await i.history(inst.id)
    assert history.state == "SUCCEEDED" and history.instance_id == inst.id
    assert [s.signal_id for s in history.signals] == ["wh-1"]
    assert bytes(history.signals[0].payload) == raw_payload
    assert [t.step for t in history.transitions] == ["ship", "done"]
    entries = await collect(i.iter_history(inst.id, page_size=1))
    assert (
        [e.seq for e in entries]
        == [e.seq for e in history.items]
        == list(range(1, len(entries) + 1))
    )
    assert {e.entry for e in entries} == {"step", "activation", "wait"}
    with pytest.raises(NotFound):
        await i.history("f" * 32)
    with pytest.raises(NotFound):
        await collect(i.iter_history("f" * 32))
    with pytest.raises(NotFound):
        await i.wait("f" * 32, timeout=5)

    cancelled = await i.cancel(by_key.id, reason="customer changed mind")
    assert cancelled.state == "CANCELLED"
    assert cancelled.error == {"code": "cancelled", "message": "customer changed mind"}
    assert (await i.cancel(by_key.id)).control_revision == cancelled.control_revision
    assert (await i.wait(by_key.id, timeout=5)).state == "CANCELLED"
    with pytest.raises(NotFound):
        await i.cancel("e" * 32)


# ----------------------------------------------------------------------------- subscriptions


async def test_subscriptions(env: Env) -> None:
    subs = env.orbit.subscriptions
    queue = unique("q")
    await env.orbit.queues.put(queue)
    name = unique("sub")
    made = await subs.put(
        name, filter={"queues": [queue]}, start="earliest", ack_timeout_ms=60_000,
        max_deliveries=1, create_only=True,
    )  # fmt: skip
    assert made.created and made.revision == 1 and made.etag == '"1"'
    assert made.filter.queues == [queue] and made.start == "earliest" and made.max_deliveries == 1
    with pytest.raises(PreconditionFailed):
        await subs.put(name, create_only=True)
    with pytest.raises(PreconditionFailed):
        await subs.put(name, max_in_flight=5, if_match='"7"')
    with pytest.raises(Conflict):
        await subs.put(name, start="latest")
    with pytest.raises(InvalidRequest) as bad:
        await subs.put(name, filter={"states": ["NOPE"]})
    assert bad.value.field == "filter.states"
    updated = await subs.put(name, max_in_flight=50, start="earliest", if_match=made.etag)
    assert not updated.created and updated.revision == 2 and updated.max_in_flight == 50
    at_seq = await subs.put(unique("sub"), start=0)
    assert at_seq.start == {"after_seq": 0}

    succeeded, cancelled = await finished_task_events(env, queue)
    with pytest.raises(NotFound):
        await subs.get("absent")

    pulled: dict[str, Any] = {}

    async def pull_all() -> bool:
        for d in await subs.pull(name, max=10, wait_ms=500):
            pulled[d.decode_event().task_id] = d
        return len(pulled) == 3

    await eventually(pull_all)
    assert set(pulled) == {succeeded, *cancelled}
    ok = pulled[succeeded]
    assert ok.proof and ok.proof not in repr(ok) and "[redacted]" in repr(ok)
    assert ok.decode_event().type == "task.succeeded" and ok.attempt == 1
    assert bytes(ok.decode_event().result) == RAW_PAYLOAD
    with pytest.raises(NotFound):
        await subs.pull("absent")
    with pytest.raises(InvalidRequest):
        await subs.pull(name, max=0)

    acked = await subs.ack(ok.delivery_id, ok.proof)
    assert acked.outcome == "applied" and acked.delivery and acked.delivery.state == "ACKED"
    assert (await subs.ack(ok.delivery_id, ok.proof)).replayed
    with pytest.raises(StaleProof) as stale:
        await subs.ack(pulled[cancelled[0]].delivery_id, "wrong-proof")
    assert stale.value.code == "stale_proof" and isinstance(stale.value, Conflict)
    with pytest.raises(Conflict):
        await subs.nack(ok.delivery_id, ok.proof)

    given_back = pulled[cancelled[0]]
    exhausted = await subs.nack(given_back.delivery_id, given_back.proof, retry_after_ms=0)
    assert exhausted.state == "EXHAUSTED" and exhausted.attempts == 1  # budget was 1
    key = unique("budget")
    revived = await subs.add_budget(given_back.delivery_id, 2, idempotency_key=key)
    assert revived.state == "PENDING" and revived.budget == 3
    replay = await subs.add_budget(given_back.delivery_id, 2, idempotency_key=key)
    assert replay.budget == 3  # replayed, not added twice
    with pytest.raises(IdempotencyMismatch):
        await subs.add_budget(given_back.delivery_id, 1, idempotency_key=key)
    with pytest.raises(InvalidRequest):
        await subs.add_budget(given_back.delivery_id, 0)

    state = await subs.get(name)
    assert state.backlog is not None and state.backlog.acked == 1 and state.etag == '"2"'
    assert state.backlog.last_seq >= 3 and state.position >= 3
    history = await subs.deliveries(name)
    assert [d.seq for d in history.items] == sorted(d.seq for d in history.items)
    assert len(history.items) == 3 and history.next_cursor is None
    assert [d.delivery_id for d in (await subs.deliveries(name, state="ACKED")).items] == [
        ok.delivery_id
    ]
    paged = await collect(subs.iter_deliveries(name, page_size=1))
    assert [d.delivery_id for d in paged] == [d.delivery_id for d in history.items]
    with pytest.raises(NotFound):
        await subs.deliveries("absent")
    with pytest.raises(NotFound):
        await collect(subs.iter_deliveries("absent"))


# ----------------------------------------------------------------------------- events


async def test_events(env: Env, db: Database) -> None:
    queue = unique("q")
    await env.orbit.queues.put(queue)
    succeeded, cancelled = await finished_task_events(env, queue)
    page = await env.orbit.events.list()
    assert [e.task_id for e in page.items] == [succeeded, *cancelled]
    assert page.next_after_seq == page.items[-1].seq and page.next_cursor is None
    assert bytes(page.items[0].result) == RAW_PAYLOAD
    every = await collect(env.orbit.events.iter(page_size=1))
    assert [e.seq for e in every] == [e.seq for e in page.items]
    tail = await collect(env.orbit.events.iter(after_seq=page.items[0].seq))
    assert [e.task_id for e in tail] == cancelled

    # follow: waits for events committed after it started.
    seen: list[str] = []

    async def follow() -> None:
        events = env.orbit.events.iter(after_seq=every[-1].seq, follow=True, interval=0.05)
        async with contextlib.aclosing(events) as stream:
            async for event in stream:
                seen.append(event.task_id)
                return

    follower = asyncio.create_task(follow())
    await asyncio.sleep(0.2)
    late = await env.orbit.tasks.submit(queue, "later", None, delay_ms=3_600_000)
    await env.orbit.tasks.cancel(late.id)
    await asyncio.wait_for(follower, 10)
    assert seen == [late.id]

    _, no_events = await add_key(db, env.tenant, ["tasks.read"])
    async with OrbitClient(env.server.url, no_events, namespace=env.ns) as limited:
        with pytest.raises(Forbidden):
            await limited.events.list()
    async with OrbitClient(env.server.url, "orb_bad", namespace=env.ns) as anon:
        with pytest.raises(Unauthenticated):
            await collect(anon.events.iter())


# ----------------------------------------------------------------------------- sync facade


def _sync_tour(url: str, key: str, ns: str, queue: str) -> dict[str, Any]:
    """Every sync group once (runs in a thread: the server owns this process's loop)."""
    out: dict[str, Any] = {}
    with SyncOrbitClient(url, key, namespace=ns) as orbit:
        task = {"kind": "tick", "payload": msgspec.Raw(RAW_PAYLOAD)}
        made = orbit.schedules.put("sync-s", queue=queue, every_ms=1000, task=task)
        out["schedule"] = (made.created, orbit.schedules.get("sync-s").version)
        out["schedules"] = [x.name for x in orbit.schedules.iter()]
        out["schedule_page"] = len(orbit.schedules.list().items)
        out["paused"] = orbit.schedules.pause("sync-s").paused
        occ = orbit.schedules.occurrences("sync-s")
        out["occurrences"] = len(occ.items) == len(list(orbit.schedules.iter_occurrences("sync-s")))
        out["resumed"] = orbit.schedules.resume("sync-s").paused

        v = orbit.workflows.publish("sync-wf", signal_workflow())
        out["workflow"] = (v.version, orbit.workflows.get("sync-wf").latest_version,
                           orbit.workflows.version("sync-wf", 1).step_count,
                           [x.version for x in orbit.workflows.iter_versions("sync-wf")],
                           [x.name for x in orbit.workflows.iter()],
                           len(orbit.workflows.list().items))  # fmt: skip

        inst = orbit.instances.start("sync-wf", {"order": "s-1", "amount": 2.5})
        orbit.instances.pause(inst.id)
        orbit.instances.resume(inst.id)
        sig = orbit.instances.signal(inst.id, "shipped", {"t": 1}, signal_id="s-1",
                                     correlation_key="s-1")  # fmt: skip
        done = orbit.instances.wait(inst.id, timeout=30, interval=0.05)
        other = orbit.instances.start("sync-wf", {"order": "s-2", "amount": 1})
        out["instances"] = (sig.duplicate, done.state, orbit.instances.get(inst.id).state,
                            len(orbit.instances.list(workflow="sync-wf").items),
                            len(list(orbit.instances.iter(workflow="sync-wf"))),
                            orbit.instances.history(inst.id).state,
                            len(list(orbit.instances.iter_history(inst.id))) > 0,
                            orbit.instances.cancel(other.id).state)  # fmt: skip

        sub = orbit.subscriptions.put("sync-sub", start="earliest", max_deliveries=1)
        t1 = orbit.tasks.submit(queue, "k", None, delay_ms=3_600_000)
        t2 = orbit.tasks.submit(queue, "k", None, delay_ms=3_600_000)
        orbit.tasks.cancel(t1.id)
        orbit.tasks.cancel(t2.id)
        got: list[Any] = []
        for _ in range(100):
            got += orbit.subscriptions.pull("sync-sub", max=10, wait_ms=200)
            if len(got) >= 2:
                break
        first, second = got[:2]
        ack = orbit.subscriptions.ack(first.delivery_id, first.proof)
        nack = orbit.subscriptions.nack(second.delivery_id, second.proof)
        budget = orbit.subscriptions.add_budget(second.delivery_id, 1)
        out["subscriptions"] = (sub.created, orbit.subscriptions.get("sync-sub").revision,
                                ack.outcome, nack.state, budget.state,
                                len(orbit.subscriptions.deliveries("sync-sub").items),
                                len(list(orbit.subscriptions.iter_deliveries("sync-sub"))))  # fmt: skip
        out["events"] = (len(orbit.events.list().items), len(list(orbit.events.iter())))
        try:
            orbit.instances.get("0" * 32)
        except NotFound as exc:
            out["error"] = exc.code
    return out


async def test_sync_facade_covers_every_group(env: Env) -> None:
    queue = unique("q")
    await env.orbit.queues.put(queue)
    out = await asyncio.to_thread(_sync_tour, env.server.url, env.tenant.key, env.ns, queue)
    assert out["schedule"] == (True, 1) and out["schedules"] == ["sync-s"]
    assert out["schedule_page"] == 1 and out["paused"] is True and out["resumed"] is False
    assert out["occurrences"] is True
    assert out["workflow"] == (1, 1, 2, [1], ["sync-wf"], 1)
    assert out["instances"] == (False, "SUCCEEDED", "SUCCEEDED", 2, 2, "SUCCEEDED", True,
                                "CANCELLED")  # fmt: skip
    assert out["subscriptions"] == (True, 1, "applied", "EXHAUSTED", "PENDING", 2, 2)
    assert out["events"] == (2, 2) and out["error"] == "not_found"
