"""Instance lifecycle against the real database: pause during a running task then resume,
cancel (tasks cancelled in the same transaction, cancels pushed to the worker), idempotent
start, the inbox written in the task's own transaction and de-duplicated, a failed advance
retried with backoff, NEEDS_REVIEW waiting for the operator, and history order."""

from __future__ import annotations

import asyncio
from datetime import timedelta
from typing import Any

import msgspec
import pytest
from event_rows import raw_events
from weave_engine_support import Fail, Flow, Hold

from orbit.audit import Actor
from orbit.errors import PreconditionFailed
from orbit.idempotency import IdemRequest, request_digest
from orbit.ids import id_hex
from orbit.preconditions import Preconditions
from orbit.storage import Database, Tx
from pulse import tasks as pulse_tasks
from pulse.recovery import recover_attempt
from pulse.types import Resolve, ResolveAction
from weave import inbox, instances
from weave.errors import InstanceStateConflict
from weave.types import StartBody


def task(id: str, queue: str = "q", kind: str = "k", **extra: Any) -> dict[str, Any]:
    return {"id": id, "type": "task", "queue": queue, "kind": kind, **extra}


def states(inst: dict[str, Any]) -> dict[str, str]:
    return {s["step"]: s["state"] for s in inst["steps"]}


TWO = {"steps": [task("a"), task("b"), {"id": "done", "type": "succeed", "output": "done"}]}


# ----------------------------------------------------------------------------- pause / resume


async def test_pause_during_a_running_task_then_resume(db: Database, tenant) -> None:
    flow = await Flow.create(db, await tenant())
    inst = await flow.start(TWO)
    iid = inst["id"]
    ns = flow.t.namespace_id
    paused = await instances.pause_instance(db, ns, iid, actor=flow.actor)
    assert paused.paused and paused.control_revision == 2 and paused.state == "RUNNING"
    again = await instances.pause_instance(db, ns, iid)  # no-op
    assert again.control_revision == 2

    # The task keeps running while paused and completes; its event is deferred.
    assert await flow.work() == 1
    stats = await flow.advancer.run_once()
    assert stats.events == {"deferred": 1}
    got = await flow.instance(iid)
    assert got["paused"] and states(got) == {"a": "RUNNING"}
    pending = await flow.rows(
        "SELECT state, reason, control_revision FROM weave_pending_advances"
        " WHERE namespace_id = %s AND instance_id = %s",
        bytes.fromhex(iid),
    )
    assert [(p["state"], p["reason"], p["control_revision"]) for p in pending] == [
        ("PENDING", "paused", 2)
    ]
    await flow.settle()  # nothing moves while paused
    assert states(await flow.instance(iid)) == {"a": "RUNNING"}

    resumed = await instances.resume_instance(db, ns, iid, actor=flow.actor, hub=flow.hub)
    assert not resumed.paused and resumed.control_revision == 3
    # The resume applied the deferred completion in its own transaction: b exists already.
    assert [(s.step, s.state) for s in resumed.steps] == [("a", "SUCCEEDED"), ("b", "RUNNING")]
    pending = await flow.rows(
        "SELECT state FROM weave_pending_advances WHERE namespace_id = %s AND instance_id = %s",
        bytes.fromhex(iid),
    )
    assert [p["state"] for p in pending] == ["DONE"]
    await flow.settle()
    assert (await flow.instance(iid))["output"] == "done"
    events = await flow.db.read(
        lambda tx: raw_events(tx, flow.t.namespace_id, subject_id=bytes.fromhex(iid))
    )
    types = [e["type"] for e in events]
    for t in ("workflow.instance_started", "workflow.instance_paused",
              "workflow.instance_resumed", "workflow.instance_succeeded"):  # fmt: skip
        assert t in types


async def test_signals_and_timers_wait_for_resume_in_order(db: Database, tenant) -> None:
    flow = await Flow.create(db, await tenant())
    doc = {"steps": [{"id": "w1", "type": "wait_signal", "signal": "s"},
                     {"id": "w2", "type": "wait_signal", "signal": "s"},
                     {"id": "done", "type": "succeed",
                      "output": [{"$": "$.steps.w1.output"}, {"$": "$.steps.w2.output"}]}]}  # fmt: skip
    inst = await flow.start(doc)
    ns = flow.t.namespace_id
    await instances.pause_instance(db, ns, inst["id"])
    await flow.signal(inst["id"], "s", 1)
    await flow.signal(inst["id"], "s", 2)
    await flow.settle()
    assert states(await flow.instance(inst["id"])) == {"w1": "RUNNING"}
    out = await instances.resume_instance(db, ns, inst["id"])
    assert out.state == "SUCCEEDED"
    assert msgspec.json.decode(bytes(out.output)) == [1, 2]  # arrival order kept


async def test_control_preconditions_and_conflicts(db: Database, tenant) -> None:
    flow = await Flow.create(db, await tenant())
    inst = await flow.start(TWO)
    ns = flow.t.namespace_id
    with pytest.raises(PreconditionFailed):
        await instances.pause_instance(
            db, ns, inst["id"], preconditions=Preconditions(if_match=frozenset({7}))
        )
    out = await instances.pause_instance(
        db, ns, inst["id"], preconditions=Preconditions(if_match=frozenset({1}))
    )
    assert out.paused
    done = await flow.start({"steps": [{"id": "x", "type": "succeed"}]})
    for op in (instances.pause_instance, instances.resume_instance, instances.cancel_instance):
        with pytest.raises(InstanceStateConflict) as exc:
            await op(db, ns, done["id"])
        assert exc.value.status == 409 and exc.value.details["state"] == "SUCCEEDED"


# ----------------------------------------------------------------------------- cancel


async def test_cancel_stops_running_and_waiting_tasks(db: Database, tenant) -> None:
    flow = await Flow.create(db, await tenant())
    await flow.t.add_queue("idle")
    doc = {"steps": [{"id": "fan", "type": "parallel", "branches": [
        {"steps": [task("running", kind="slow")]},
        {"steps": [task("waiting", queue="idle")]},
        {"steps": [{"id": "w", "type": "wait_signal", "signal": "s", "timeout_ms": 60_000}]},
    ]}, {"id": "j", "type": "join", "parallel": "fan"}]}  # fmt: skip
    inst = await flow.start(doc)
    await flow.settle(lambda k, p: Hold())
    out = await instances.cancel_instance(
        db, flow.t.namespace_id, inst["id"], actor=flow.actor, hub=flow.hub, reason="customer"
    )
    assert out.state == "CANCELLED" and out.error == {"code": "cancelled", "message": "customer"}
    assert {s.step: s.state for s in out.steps} == {
        "fan": "CANCELLED", "running": "CANCELLED", "waiting": "CANCELLED", "w": "CANCELLED",
    }  # fmt: skip
    tasks = {t["kind"]: t for t in await flow.tasks_of(inst["id"])}
    assert tasks["k"]["state"] == "CANCELLED"  # the waiting one, at once
    rows = await flow.rows(
        "SELECT state, cancel_requested FROM pulse_tasks WHERE namespace_id = %s AND id = %s",
        tasks["slow"]["id"],
    )
    assert rows[0]["state"] == "RUNNING" and rows[0]["cancel_requested"]
    # The cancel was pushed to the worker holding the attempt (after commit).
    (aid, token) = flow.held.pop()
    assert [c.attempt_id for c in flow.conn.cancels()] == [id_hex(aid)]
    await flow.report(aid, token, "cancelled")
    await flow.settle()
    waits = await flow.rows(
        "SELECT state FROM weave_waits WHERE namespace_id = %s AND instance_id = %s",
        bytes.fromhex(inst["id"]),
    )
    assert [w["state"] for w in waits] == ["CANCELLED"]
    assert await flow.timers.run_once(now=await db.now() + timedelta(hours=1)) == 0
    # Cancelling again is a no-op; the late task events were ignored.
    again = await instances.cancel_instance(db, flow.t.namespace_id, inst["id"])
    assert again.state == "CANCELLED" and again.control_revision == out.control_revision
    assert {e["outcome"] for e in await flow.inbox_of(inst["id"])} == {"ignored"}


# ----------------------------------------------------------------------------- start


async def test_start_is_idempotent_by_business_key(db: Database, tenant) -> None:
    flow = await Flow.create(db, await tenant())
    name = await flow.publish(TWO)
    s1, first = await flow.start_named(name, {"x": 1}, business_key="order-1")
    s2, second = await flow.start_named(name, {"x": 1}, business_key="order-1")
    assert (s1, s2) == (201, 200)
    assert second["id"] == first["id"] and second["deduplicated"] and not first["deduplicated"]
    assert len(await flow.tasks_of(first["id"])) == 1
    # Concurrent starts with a new key: one instance.
    results = await asyncio.gather(
        *(flow.start_named(name, None, business_key="order-2") for _ in range(4))
    )
    assert sorted(s for s, _ in results) == [200, 200, 200, 201]
    assert len({o["id"] for _, o in results}) == 1
    n = await flow.rows(
        "SELECT COUNT(*) AS n FROM weave_instances WHERE namespace_id = %s AND business_key = %s",
        "order-2",
    )
    assert n[0]["n"] == 1


async def test_start_honours_idempotency_keys_and_versions(db: Database, tenant) -> None:
    flow = await Flow.create(db, await tenant())
    name = await flow.publish({"steps": [{"id": "v1", "type": "succeed", "output": 1}]})
    await flow.publish({"steps": [{"id": "v2", "type": "succeed", "output": 2}]}, name=name)
    body = StartBody(input=msgspec.Raw(b"{}"))
    idem = IdemRequest("key-1", request_digest("POST", f"/x/{name}", b"{}"))
    actor = Actor(flow.t.credential_id, flow.t.application_id)
    r1 = await instances.start_instance(db, actor, flow.t.namespace_id, name, body, idem=idem)
    r2 = await instances.start_instance(db, actor, flow.t.namespace_id, name, body, idem=idem)
    assert r1.status == 201 and r2.replayed and r2.body == r1.body
    assert msgspec.json.decode(r1.body)["output"] == 2  # latest version by default
    _, old = await flow.start_named(name, None, version=1)
    assert old["version"] == 1 and old["output"] == 1


# ----------------------------------------------------------------------------- inbox


async def test_task_completion_writes_the_inbox_event_in_its_own_transaction(
    db: Database, tenant
) -> None:
    flow = await Flow.create(db, await tenant())
    inst = await flow.start(TWO)
    assert await flow.inbox_of(inst["id"]) == []
    await flow.work()  # completes task a; the advancer has not run
    (ev,) = await flow.inbox_of(inst["id"])
    (a,) = await flow.tasks_of(inst["id"])
    assert ev["kind"] == "task_finished" and ev["source_event_id"] == a["id"]
    assert ev["processed_at"] is None

    # The hook is idempotent per task: a second terminal record adds nothing.
    async def again(tx: Tx) -> None:
        row = await tx.fetchone(
            "SELECT * FROM pulse_tasks WHERE namespace_id = %s AND id = %s",
            (flow.t.namespace_id, a["id"]),
        )
        assert row is not None
        await inbox.on_task_result(tx, flow.t.namespace_id, row)

    await db.transaction(again)
    assert len(await flow.inbox_of(inst["id"])) == 1
    await flow.settle()
    assert (await flow.instance(inst["id"]))["state"] == "SUCCEEDED"


async def test_a_failed_advance_is_retried_with_backoff(db: Database, tenant) -> None:
    flow = await Flow.create(db, await tenant())
    await flow.t.add_queue("tight", max_unfinished_tasks=1)
    inst = await flow.start({"steps": [task("a"), task("b", queue="tight")]})
    blocker = await flow.t.submit(queue="tight")  # fills the tight queue
    await flow.work()  # a completes; creating b will hit the quota
    stats = await flow.advancer.run_once()
    assert stats.failed == 1 and stats.processed == 0
    (ev,) = await flow.inbox_of(inst["id"])
    assert ev["attempts"] == 1 and ev["processed_at"] is None
    assert states(await flow.instance(inst["id"])) == {"a": "RUNNING"}  # rolled back
    err = await flow.rows(
        "SELECT last_error, available_at > UTC_TIMESTAMP(6) AS later FROM weave_inbox"
        " WHERE namespace_id = %s AND instance_id = %s",
        bytes.fromhex(inst["id"]),
    )
    assert msgspec.json.decode(err[0]["last_error"])["code"] == "quota_exceeded"
    assert err[0]["later"] == 1
    assert (await flow.advancer.run_once()).processed == 0  # backing off
    await pulse_tasks.cancel_task(db, flow.t.namespace_id, blocker["id"])
    await asyncio.sleep(0.1)
    stats = await flow.advancer.run_once()
    assert stats.applied == 1
    assert states(await flow.instance(inst["id"])) == {"a": "SUCCEEDED", "b": "RUNNING"}


async def test_needs_review_waits_for_the_operator(db: Database, tenant) -> None:
    flow = await Flow.create(db, await tenant())
    inst = await flow.start({"steps": [task("a"), {"id": "done", "type": "succeed",
                                                   "output": {"$": "$.steps.a.output"}}]})  # fmt: skip
    await flow.work(lambda k, p: Hold())
    (aid, _token) = flow.held.pop()
    later = await db.now() + timedelta(hours=1)
    assert await recover_attempt(db, flow.t.namespace_id, aid, reason="test", now=later) == "lost"
    (t,) = await flow.tasks_of(inst["id"])
    assert t["state"] == "NEEDS_REVIEW"
    await flow.settle()
    assert await flow.inbox_of(inst["id"]) == []  # NEEDS_REVIEW is not an end for the step
    assert states(await flow.instance(inst["id"])) == {"a": "RUNNING"}
    await pulse_tasks.resolve_task(
        db, flow.t.namespace_id, id_hex(t["id"]),
        Resolve(action=ResolveAction.SUCCEED, note="checked by hand",
                result=msgspec.Raw(b'{"verified": true}')),
        actor=flow.actor,
    )  # fmt: skip
    await flow.settle()
    got = await flow.instance(inst["id"])
    assert got["state"] == "SUCCEEDED" and got["output"] == {"verified": True}


# ----------------------------------------------------------------------------- history


async def test_history_lists_everything_in_order(db: Database, tenant) -> None:
    flow = await Flow.create(db, await tenant())
    doc = {"steps": [task("a"),
                     {"id": "w", "type": "wait_signal", "signal": "go", "timeout_ms": 60_000},
                     {"id": "p", "type": "poll", "max_rounds": 3, "until": "$.result.ok",
                      "task": {"queue": "q", "kind": "probe",
                               "output_schema": {"object": {"ok": "bool"}}}},
                     {"id": "done", "type": "succeed"}]}  # fmt: skip
    inst = await flow.start(doc)
    await flow.settle()
    await flow.signal(inst["id"], "go", {"x": 1}, signal_id="s-1")
    answers = iter([{"ok": False}, {"ok": True}])
    await flow.settle(lambda k, p: next(answers))
    hist = await flow.history(inst["id"])
    assert hist["state"] == "SUCCEEDED"
    seqs = [e["seq"] for e in hist["items"]]
    assert seqs == sorted(seqs) and len(set(seqs)) == len(seqs) and seqs[0] == 1
    shape = [(e["entry"], e["step"], e.get("kind")) for e in hist["items"]]
    assert shape == [
        ("step", "a", None), ("activation", "a", "task"),
        ("step", "w", None), ("activation", "w", "signal"), ("wait", "w", "signal"),
        ("step", "p", None), ("activation", "p", "poll_round"), ("activation", "p", "poll_round"),
        ("step", "done", None),
    ]  # fmt: skip
    assert [(t["step"], t["to"]) for t in hist["transitions"]] == [
        ("a", "w"), ("w", "p"), ("p", "done"), ("done", None),
    ]  # fmt: skip
    assert [s["signal_id"] for s in hist["signals"]] == ["s-1"]
    page = await flow.history(inst["id"], limit=4)
    assert [e["seq"] for e in page["items"]] == seqs[:4] and page["next_cursor"]
    rest = await flow.history(inst["id"], after_seq=4, limit=100)
    assert [e["seq"] for e in rest["items"]] == seqs[4:] and rest["next_cursor"] is None


async def test_instances_are_namespace_scoped(db: Database, tenant) -> None:
    from weave.errors import InstanceNotFound

    flow = await Flow.create(db, await tenant())
    inst = await flow.start(TWO)
    other = await tenant()
    for bad in (inst["id"], "zz", "0" * 32):
        ns = other.namespace_id if bad == inst["id"] else flow.t.namespace_id
        with pytest.raises(InstanceNotFound):
            await instances.get_instance(db, ns, bad)
    with pytest.raises(InstanceNotFound):
        await instances.cancel_instance(db, other.namespace_id, inst["id"])
    # Nothing was touched.
    assert (await flow.instance(inst["id"]))["state"] == "RUNNING"
    await flow.settle(lambda k, p: Fail())
