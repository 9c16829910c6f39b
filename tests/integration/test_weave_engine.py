"""The Weave engine against the real database, driven through its services: every step type,
signals (early, duplicate, correlation keys), durable timers (also across a restart), polls
(round, attempt and deadline budgets), parallel branches and choices. Tasks run through
Pulse's worker-side services (dispatch → start → report), so every completion reaches Weave
through the real terminal hook, in the task's own transaction."""

from __future__ import annotations

from datetime import timedelta
from typing import Any

import pytest
from weave_engine_support import Fail, Flow, Hold, ok

from orbit.storage import Database
from weave.advancer import Advancer
from weave.timers import TimerLoop


def task(id: str, queue: str = "q", kind: str = "k", **extra: Any) -> dict[str, Any]:
    return {"id": id, "type": "task", "queue": queue, "kind": kind, **extra}


def states(inst: dict[str, Any]) -> dict[str, str]:
    return {s["step"]: s["state"] for s in inst["steps"]}


# ----------------------------------------------------------------------------- task


async def test_task_steps_run_in_order_and_the_instance_succeeds(db: Database, tenant) -> None:
    flow = await Flow.create(db, await tenant())
    doc = {
        "input_schema": {"object": {"n": "number"}},
        "steps": [
            task("a", payload={"n": {"$": "$.input.n"}}),
            task("b", payload={"prev": {"$": "$.steps.a.output"}}),
            {"id": "done", "type": "succeed", "output": {"b": {"$": "$.steps.b.output"}}},
        ],
    }
    inst = await flow.start(doc, raw_input=b'{"n": 1.50}')
    assert inst["state"] == "RUNNING" and [s["step"] for s in inst["steps"]] == ["a"]
    # The first task exists as soon as start returns (same transaction).
    (first,) = await flow.tasks_of(inst["id"])
    assert first["state"] == "WAITING" and first["payload"] == '{"n":1.50}'
    await flow.settle()
    got = await flow.instance(inst["id"])
    assert got["state"] == "SUCCEEDED", got
    assert got["output"] == {"b": {"echo": {"prev": {"echo": {"n": 1.50}}}}}
    assert [(s["step"], s["state"], s["next_step"]) for s in got["steps"]] == [
        ("a", "SUCCEEDED", "b"), ("b", "SUCCEEDED", "done"), ("done", "SUCCEEDED", None),
    ]  # fmt: skip
    tasks = await flow.tasks_of(inst["id"])
    assert [t["state"] for t in tasks] == ["SUCCEEDED", "SUCCEEDED"]
    assert all(t["owner_id"] == flow.t.application_id for t in tasks)
    assert all(t["source_kind"] == "workflow" for t in tasks)
    inbox = await flow.inbox_of(inst["id"])
    assert [(e["kind"], e["outcome"]) for e in inbox] == [("task_finished", "applied")] * 2


async def test_reaching_the_end_of_the_top_level_succeeds_with_null(db: Database, tenant) -> None:
    flow = await Flow.create(db, await tenant())
    inst = await flow.start({"steps": [task("only")]})
    await flow.settle()
    got = await flow.instance(inst["id"])
    assert got["state"] == "SUCCEEDED" and got["output"] is None and got["finished_at"]


async def test_task_failure_takes_on_failure_to_the_compensation(db: Database, tenant) -> None:
    flow = await Flow.create(db, await tenant(), queues=["pay", "refunds"])
    doc = {
        "steps": [
            task("charge", queue="pay", kind="charge", retry={"max_attempts": 1},
                 on_failure="compensate"),
            {"id": "ok", "type": "succeed"},
            task("compensate", queue="refunds", kind="refund",
                 payload={"why": {"$": "$.steps.charge.error.code"}}),
            {"id": "failed", "type": "fail", "error": "charge_failed",
             "message": {"$": {"op": "concat", "args": ["charge: ", "$.steps.charge.error.code"]}}},
        ]
    }  # fmt: skip

    def handler(kind: str, payload: Any) -> Any:
        return Fail("card declined") if kind == "charge" else ok(kind, payload)

    inst = await flow.start(doc)
    await flow.settle(handler)
    got = await flow.instance(inst["id"])
    assert got["state"] == "FAILED"
    assert got["error"] == {"code": "charge_failed", "message": "charge: task_failed",
                            "step": "failed"}  # fmt: skip
    assert states(got) == {"charge": "FAILED", "compensate": "SUCCEEDED", "failed": "FAILED"}
    charge = next(s for s in got["steps"] if s["step"] == "charge")
    assert charge["next_step"] == "compensate"
    assert charge["error"]["task_error"]["message"] == "card declined"
    assert ("refund", {"why": "task_failed"}) in flow.seen


async def test_task_failure_without_on_failure_fails_the_instance(db: Database, tenant) -> None:
    flow = await Flow.create(db, await tenant())
    inst = await flow.start({"steps": [task("a", retry={"max_attempts": 1}), task("b")]})
    await flow.settle(lambda k, p: Fail())
    got = await flow.instance(inst["id"])
    assert got["state"] == "FAILED" and got["output"] is None
    assert got["error"]["code"] == "task_failed" and got["error"]["step"] == "a"
    assert "b" not in states(got)


async def test_task_result_breaking_output_schema_fails_the_step(db: Database, tenant) -> None:
    flow = await Flow.create(db, await tenant())
    doc = {"steps": [task("a", output_schema={"object": {"status": "string"}}, on_failure="bad"),
                     {"id": "good", "type": "succeed"},
                     {"id": "bad", "type": "fail", "error": "bad_result"}]}  # fmt: skip
    inst = await flow.start(doc)
    await flow.settle(lambda k, p: {"status": 7})
    got = await flow.instance(inst["id"])
    assert got["state"] == "FAILED" and got["error"]["code"] == "bad_result"
    a = got["steps"][0]
    assert a["state"] == "FAILED" and a["error"]["code"] == "output_schema"


async def test_task_options_reach_pulse(db: Database, tenant) -> None:
    flow = await Flow.create(db, await tenant())
    doc = {"steps": [task("a", retry={"max_attempts": 7}, deadline_ms=60_000, priority=3,
                          payload={"x": [1, {"$": "$.input"}]})]}  # fmt: skip
    inst = await flow.start(doc, {"k": "v"})
    (t,) = await flow.tasks_of(inst["id"])
    assert t["max_attempts"] == 7 and t["deadline_at"] is not None
    assert t["payload"] == '{"x":[1,{"k":"v"}]}'


async def test_unknown_queue_fails_the_step_and_on_failure_applies(db: Database, tenant) -> None:
    flow = await Flow.create(db, await tenant())
    doc = {"steps": [task("a", queue="nope", on_failure="recover"),
                     {"id": "ok", "type": "succeed"},
                     {"id": "recover", "type": "succeed", "output": {"$": "$.steps.a.error"}}]}  # fmt: skip
    inst = await flow.start(doc)
    assert inst["state"] == "SUCCEEDED"
    assert inst["output"]["code"] == "not_found"


async def test_expression_error_while_entering_a_task_fails_it(db: Database, tenant) -> None:
    flow = await Flow.create(db, await tenant())
    doc = {"steps": [task("a", payload={"x": {"$": "$.input.missing"}})]}
    inst = await flow.start(doc, {})
    assert inst["state"] == "FAILED"
    assert inst["error"]["code"] == "task_failed"
    assert inst["steps"][0]["error"]["code"] == "path_not_found"


# ----------------------------------------------------------------------------- signals


WAIT_DOC = {
    "input_schema": {"object": {"order": "string"}},
    "steps": [
        {"id": "ship", "type": "wait_signal", "signal": "shipped",
         "correlation_key": "$.input.order", "output_schema": {"object": {"tracking": "string"}}},
        {"id": "done", "type": "succeed", "output": {"$": "$.steps.ship.output.tracking"}},
    ],
}  # fmt: skip


async def test_signal_completes_the_wait_with_its_payload(db: Database, tenant) -> None:
    flow = await Flow.create(db, await tenant())
    inst = await flow.start(WAIT_DOC, {"order": "o-1"})
    assert states(inst) == {"ship": "RUNNING"}
    # Another key or another name: kept, not matched.
    assert (await flow.signal(inst["id"], "shipped", {"tracking": "x"}, correlation_key="o-2"))[
        0
    ] == 201
    assert (await flow.signal(inst["id"], "other", {"tracking": "y"}))[0] == 201
    await flow.settle()
    assert (await flow.instance(inst["id"]))["state"] == "RUNNING"
    status, sig = await flow.signal(
        inst["id"], "shipped", {"tracking": "T-1"}, correlation_key="o-1"
    )
    assert status == 201 and sig["name"] == "shipped"
    await flow.settle()
    got = await flow.instance(inst["id"])
    assert got["state"] == "SUCCEEDED" and got["output"] == "T-1"
    hist = await flow.history(inst["id"])
    matched = [s for s in hist["signals"] if s["matched_wait_id"]]
    assert [s["signal_id"] for s in matched] == [sig["signal_id"]]
    assert len(hist["signals"]) == 3


async def test_signal_before_its_wait_is_kept_and_matched_later(db: Database, tenant) -> None:
    flow = await Flow.create(db, await tenant())
    doc = {"steps": [task("first"), *WAIT_DOC["steps"]]}
    inst = await flow.start(doc, {"order": "o-9"})
    status, _ = await flow.signal(
        inst["id"], "shipped", {"tracking": "EARLY"}, correlation_key="o-9"
    )
    assert status == 201
    await flow.advancer.run_once()  # the signal arrives while `first` still runs: kept
    assert states(await flow.instance(inst["id"])) == {"first": "RUNNING"}
    await flow.settle()  # `first` ends, the wait opens and takes the kept signal at once
    got = await flow.instance(inst["id"])
    assert got["state"] == "SUCCEEDED" and got["output"] == "EARLY"


async def test_duplicate_signal_ids_get_the_same_response(db: Database, tenant) -> None:
    flow = await Flow.create(db, await tenant())
    doc = {"steps": [{"id": "a", "type": "wait_signal", "signal": "go"},
                     {"id": "b", "type": "wait_signal", "signal": "go"},
                     {"id": "done", "type": "succeed",
                      "output": [{"$": "$.steps.a.output"}, {"$": "$.steps.b.output"}]}]}  # fmt: skip
    inst = await flow.start(doc)
    s1, first = await flow.signal(inst["id"], "go", {"n": 1}, signal_id="sig-1")
    s2, again = await flow.signal(inst["id"], "go", {"n": 1}, signal_id="sig-1")
    assert (s1, s2) == (201, 200) and first == again
    from weave.errors import SignalIdReused

    with pytest.raises(SignalIdReused):
        await flow.signal(inst["id"], "go", {"n": 2}, signal_id="sig-1")
    await flow.settle()
    # The duplicate did not satisfy the second wait.
    assert states(await flow.instance(inst["id"])) == {"a": "SUCCEEDED", "b": "RUNNING"}
    await flow.signal(inst["id"], "go", {"n": 3}, signal_id="sig-2")
    await flow.settle()
    got = await flow.instance(inst["id"])
    assert got["state"] == "SUCCEEDED" and got["output"] == [{"n": 1}, {"n": 3}]
    assert len((await flow.history(inst["id"]))["signals"]) == 2


async def test_signal_payload_breaking_output_schema_fails_the_step(db: Database, tenant) -> None:
    flow = await Flow.create(db, await tenant())
    inst = await flow.start(WAIT_DOC, {"order": "o"})
    await flow.signal(inst["id"], "shipped", {"tracking": 12}, correlation_key="o")
    await flow.settle()
    got = await flow.instance(inst["id"])
    assert got["state"] == "FAILED" and got["error"]["code"] == "step_failed"
    assert got["steps"][0]["error"]["code"] == "output_schema"


async def test_signal_to_an_ended_instance_is_a_conflict(db: Database, tenant) -> None:
    from weave.errors import InstanceStateConflict

    flow = await Flow.create(db, await tenant())
    inst = await flow.start({"steps": [{"id": "x", "type": "succeed"}]})
    assert inst["state"] == "SUCCEEDED"
    with pytest.raises(InstanceStateConflict) as exc:
        await flow.signal(inst["id"], "late", 1)
    assert exc.value.status == 409


# ----------------------------------------------------------------------------- timers


async def test_signal_timeout_takes_on_timeout(db: Database, tenant) -> None:
    flow = await Flow.create(db, await tenant())
    doc = {"steps": [{"id": "w", "type": "wait_signal", "signal": "s", "timeout_ms": 60_000,
                      "on_timeout": "late"},
                     {"id": "ok", "type": "succeed"},
                     {"id": "late", "type": "succeed", "output": "timed out"}]}  # fmt: skip
    inst = await flow.start(doc)
    await flow.settle()
    assert (await flow.instance(inst["id"]))["state"] == "RUNNING"  # not due yet
    later = await db.now() + timedelta(minutes=2)
    await flow.settle(now=later)
    got = await flow.instance(inst["id"])
    assert got["state"] == "SUCCEEDED" and got["output"] == "timed out"
    w = got["steps"][0]
    assert w["state"] == "TIMED_OUT" and w["error"]["code"] == "signal_timeout"
    # A signal after the timeout no longer matches anything.
    from weave.errors import InstanceStateConflict

    with pytest.raises(InstanceStateConflict):
        await flow.signal(inst["id"], "s", 1)


async def test_signal_timeout_without_on_timeout_fails(db: Database, tenant) -> None:
    flow = await Flow.create(db, await tenant())
    inst = await flow.start(
        {"steps": [{"id": "w", "type": "wait_signal", "signal": "s", "timeout_ms": 1000}]}
    )
    await flow.settle(now=await db.now() + timedelta(seconds=5))
    got = await flow.instance(inst["id"])
    assert got["state"] == "FAILED" and got["error"]["code"] == "signal_timeout"


async def test_a_signal_beats_a_timer_that_fires_later(db: Database, tenant) -> None:
    flow = await Flow.create(db, await tenant())
    doc = {"steps": [{"id": "w", "type": "wait_signal", "signal": "s", "timeout_ms": 1000}]}
    inst = await flow.start(doc)
    await flow.signal(inst["id"], "s", "in time")
    await flow.settle()
    await flow.settle(now=await db.now() + timedelta(seconds=5))
    got = await flow.instance(inst["id"])
    assert got["state"] == "SUCCEEDED"
    waits = [e for e in (await flow.history(inst["id"]))["items"] if e["entry"] == "wait"]
    assert [w["state"] for w in waits] == ["MATCHED"]


async def test_sleep_is_a_durable_timer(db: Database, tenant) -> None:
    flow = await Flow.create(db, await tenant())
    doc = {"steps": [{"id": "nap", "type": "sleep", "duration_ms": 3_600_000}, task("after")]}
    inst = await flow.start(doc)
    assert states(inst) == {"nap": "RUNNING"}
    assert await flow.timers.run_once() == 0  # not due
    later = await db.now() + timedelta(hours=2)
    assert await flow.timers.run_once(now=later) == 1
    assert await flow.timers.run_once(now=later) == 0  # written once
    await flow.advancer.run_once(now=later)
    got = await flow.instance(inst["id"])
    assert states(got) == {"nap": "SUCCEEDED", "after": "RUNNING"}


async def test_sleep_zero_and_past_until_complete_at_once(db: Database, tenant) -> None:
    flow = await Flow.create(db, await tenant())
    doc = {"input_schema": {"object": {"at": "string"}},
           "steps": [{"id": "zero", "type": "sleep", "duration_ms": 0},
                     {"id": "past", "type": "sleep", "until": "$.input.at"},
                     {"id": "done", "type": "succeed"}]}  # fmt: skip
    inst = await flow.start(doc, {"at": "2020-01-01T00:00:00Z"})
    assert inst["state"] == "SUCCEEDED"
    bad = await flow.start(doc, {"at": "not a time"})
    assert bad["state"] == "FAILED" and bad["steps"][1]["error"]["code"] == "invalid_time"


async def test_timer_survives_a_restart(db: Database, dsn, tenant) -> None:
    """The timer lives in the database: a new pool, advancer and timer loop (a restarted
    server) fire it."""
    flow = await Flow.create(db, await tenant())
    doc = {"steps": [{"id": "nap", "type": "sleep", "duration_ms": 600_000},
                     {"id": "done", "type": "succeed", "output": "woke"}]}  # fmt: skip
    inst = await flow.start(doc)
    await flow.settle()
    later = await db.now() + timedelta(minutes=11)
    fresh = await Database.connect(dsn, maxsize=2)
    try:
        assert await TimerLoop(fresh).run_once(now=later) == 1
        stats = await Advancer(fresh).run_once(now=later)
        assert stats.applied == 1
    finally:
        await fresh.close()
    got = await flow.instance(inst["id"])
    assert got["state"] == "SUCCEEDED" and got["output"] == "woke"


# ----------------------------------------------------------------------------- poll


def poll(id: str = "p", **extra: Any) -> dict[str, Any]:
    return {
        "id": id,
        "type": "poll",
        "task": {"queue": "q", "kind": "status", "output_schema": {"object": {"done": "bool"}},
                 "payload": {"order": "o"}},
        "until": "$.result.done",
        **extra,
    }  # fmt: skip


def rounds(results: list[Any]) -> Any:
    it = iter(results)

    def handler(kind: str, payload: Any) -> Any:
        return next(it)

    return handler


async def test_poll_repeats_rounds_until_the_condition_holds(db: Database, tenant) -> None:
    flow = await Flow.create(db, await tenant())
    doc = {"steps": [poll(max_rounds=5),
                     {"id": "done", "type": "succeed", "output": {"$": "$.steps.p.output"}}]}  # fmt: skip
    inst = await flow.start(doc)
    await flow.settle(rounds([{"done": False}, {"done": False}, {"done": True, "n": 3}]))
    got = await flow.instance(inst["id"])
    assert got["state"] == "SUCCEEDED" and got["output"] == {"done": True, "n": 3}
    p = got["steps"][0]
    assert p["state"] == "SUCCEEDED" and p["activations"] == 3
    rows = await flow.rows(
        "SELECT round_no, outcome FROM weave_poll_rounds WHERE namespace_id = %s"
        " AND instance_id = %s ORDER BY round_no",
        bytes.fromhex(inst["id"]),
    )
    assert [(r["round_no"], r["outcome"]) for r in rows] == [
        (1, "not_met"),
        (2, "not_met"),
        (3, "met"),
    ]
    acts = [e for e in (await flow.history(inst["id"]))["items"] if e["entry"] == "activation"]
    assert [a["condition_met"] for a in acts] == [False, False, True]


async def test_poll_round_budget_exhausts_to_on_exhausted(db: Database, tenant) -> None:
    flow = await Flow.create(db, await tenant())
    doc = {"steps": [poll(max_rounds=2, on_exhausted="gave_up"),
                     {"id": "ok", "type": "succeed"},
                     {"id": "gave_up", "type": "succeed", "output": {"$": "$.steps.p.error"}}]}  # fmt: skip
    inst = await flow.start(doc)
    await flow.settle(lambda k, p: {"done": False})
    got = await flow.instance(inst["id"])
    assert got["state"] == "SUCCEEDED"
    assert got["output"]["code"] == "poll_exhausted" and got["output"]["reason"] == "max_rounds"
    assert got["steps"][0]["state"] == "TIMED_OUT"
    assert len(await flow.tasks_of(inst["id"])) == 2


async def test_poll_exhaustion_without_on_exhausted_fails(db: Database, tenant) -> None:
    flow = await Flow.create(db, await tenant())
    inst = await flow.start({"steps": [poll(max_rounds=1)]})
    await flow.settle(lambda k, p: {"done": False})
    got = await flow.instance(inst["id"])
    assert got["state"] == "FAILED" and got["error"]["code"] == "poll_exhausted"


async def test_poll_each_round_has_its_own_attempt_budget(db: Database, tenant) -> None:
    retry = {"max_attempts": 9, "backoff_initial_ms": 0, "backoff_max_ms": 0}
    flow = await Flow.create(db, await tenant(), queue_config={"retry": retry})
    doc = {"steps": [poll(max_rounds=3, max_attempts=2, on_exhausted="gave_up"),
                     {"id": "ok", "type": "succeed", "output": "ok"},
                     {"id": "gave_up", "type": "succeed", "output": {"$": "$.steps.p.error"}}]}  # fmt: skip
    # round 1: fail once then succeed (within its 2 attempts) but not met;
    # round 2: fail twice (budget spent) -> the round fails -> exhausted.
    inst = await flow.start(doc)
    script = [Fail(retryable=True), {"done": False}, Fail(retryable=True), Fail(retryable=True)]
    await flow.settle(rounds(script))
    got = await flow.instance(inst["id"])
    assert got["output"]["reason"] == "round_failed", got
    tasks = await flow.tasks_of(inst["id"])
    assert [t["max_attempts"] for t in tasks] == [2, 2]
    assert [t["state"] for t in tasks] == ["SUCCEEDED", "FAILED"]


async def test_poll_deadline_stops_new_rounds(db: Database, tenant) -> None:
    flow = await Flow.create(db, await tenant())
    doc = {"steps": [poll(max_rounds=100, interval_ms=60_000, deadline_ms=90_000,
                          on_exhausted="late"),
                     {"id": "ok", "type": "succeed"},
                     {"id": "late", "type": "succeed", "output": {"$": "$.steps.p.error.reason"}}]}  # fmt: skip
    inst = await flow.start(doc)
    t0 = await db.now()
    await flow.settle(lambda k, p: {"done": False}, now=t0)
    # Round 1 ran; round 2 waits for its interval (a durable poll_interval timer).
    assert len(await flow.tasks_of(inst["id"])) == 1
    await flow.settle(lambda k, p: {"done": False}, now=t0 + timedelta(seconds=61))
    got = await flow.instance(inst["id"])
    # Round 2 ran at +61 s; round 3 would start at +121 s, past the 90 s deadline.
    assert got["state"] == "SUCCEEDED" and got["output"] == "deadline"
    assert len(await flow.tasks_of(inst["id"])) == 2
    t1, t2 = await flow.tasks_of(inst["id"])
    assert (
        t1["deadline_at"] == t2["deadline_at"] is not None
    )  # round tasks may not start after the deadline


# ----------------------------------------------------------------------------- parallel


FAN = {
    "steps": [
        {"id": "fan", "type": "parallel", "branches": [
            {"name": "mail", "steps": [task("mail", kind="mail")]},
            {"name": "ship", "steps": [task("label", kind="label"),
                                       {"id": "pickup", "type": "wait_signal", "signal": "picked"}]},
        ]},
        {"id": "joined", "type": "join", "parallel": "fan"},
        {"id": "done", "type": "succeed",
         "output": {"mail": {"$": "$.steps.mail.output"}, "pickup": {"$": "$.steps.pickup.output"}}},
    ]
}  # fmt: skip


async def test_parallel_branches_join_when_all_end(db: Database, tenant) -> None:
    flow = await Flow.create(db, await tenant())
    inst = await flow.start(FAN)
    assert states(inst) == {"fan": "RUNNING", "mail": "RUNNING", "label": "RUNNING"}
    await flow.settle()
    got = await flow.instance(inst["id"])
    assert states(got)["fan"] == "RUNNING" and states(got)["pickup"] == "RUNNING"
    await flow.signal(inst["id"], "picked", {"at": "dock"})
    await flow.settle()
    got = await flow.instance(inst["id"])
    assert got["state"] == "SUCCEEDED"
    assert got["output"] == {"mail": {"echo": {}}, "pickup": {"at": "dock"}}
    assert states(got) == {s: "SUCCEEDED" for s in
                           ["fan", "mail", "label", "pickup", "joined", "done"]}  # fmt: skip
    fan = next(s for s in got["steps"] if s["step"] == "fan")
    assert fan["next_step"] == "joined"


async def test_a_failing_branch_cancels_the_others_and_fails(db: Database, tenant) -> None:
    flow = await Flow.create(db, await tenant())
    doc = {
        "steps": [
            {"id": "fan", "type": "parallel", "branches": [
                {"steps": [task("slow", kind="slow")]},
                {"steps": [task("waiting", kind="never_started", queue="idle")]},
                {"steps": [task("boom", kind="boom", retry={"max_attempts": 1})]},
            ]},
            {"id": "j", "type": "join", "parallel": "fan"},
        ]
    }  # fmt: skip
    flow.queues = ["q"]  # the worker never serves queue "idle"
    await flow.t.add_queue("idle")

    def handler(kind: str, payload: Any) -> Any:
        return Hold() if kind == "slow" else Fail("exploded")

    inst = await flow.start(doc)
    await flow.settle(handler)
    got = await flow.instance(inst["id"])
    assert got["state"] == "FAILED" and got["error"]["step"] == "boom"
    assert states(got) == {"fan": "CANCELLED", "slow": "CANCELLED", "waiting": "CANCELLED",
                           "boom": "FAILED"}  # fmt: skip
    by_kind = {t["kind"]: t for t in await flow.tasks_of(inst["id"])}
    assert by_kind["never_started"]["state"] == "CANCELLED"  # WAITING: cancelled at once
    slow = await flow.rows(
        "SELECT state, cancel_requested FROM pulse_tasks WHERE namespace_id = %s AND id = %s",
        by_kind["slow"]["id"],
    )
    assert slow[0]["state"] == "RUNNING" and slow[0]["cancel_requested"]  # asked to stop
    # The held attempt finishes anyway: its event is ignored (the instance ended).
    (aid, token) = flow.held.pop()
    await flow.report(aid, token, {"late": True})
    await flow.settle()
    inbox = await flow.inbox_of(inst["id"])
    assert sorted(e["outcome"] for e in inbox) == ["applied", "ignored", "ignored"]


async def test_on_failure_inside_a_branch_keeps_the_instance_going(db: Database, tenant) -> None:
    flow = await Flow.create(db, await tenant())
    doc = {
        "steps": [
            {"id": "fan", "type": "parallel", "branches": [
                {"steps": [task("a", kind="fails", retry={"max_attempts": 1}, on_failure="a_fix"),
                           {"id": "skip", "type": "sleep", "duration_ms": 0},
                           task("a_fix", kind="fix")]},
                {"steps": [task("b")]},
            ]},
            {"id": "j", "type": "join", "parallel": "fan"},
            {"id": "done", "type": "succeed", "output": "fine"},
        ]
    }  # fmt: skip
    inst = await flow.start(doc)
    await flow.settle(lambda k, p: Fail() if k == "fails" else ok(k, p))
    got = await flow.instance(inst["id"])
    assert got["state"] == "SUCCEEDED" and got["output"] == "fine"
    assert "skip" not in states(got) and states(got)["a"] == "FAILED"


async def test_nested_parallels_join_inside_out(db: Database, tenant) -> None:
    flow = await Flow.create(db, await tenant())
    doc = {
        "steps": [
            {"id": "outer", "type": "parallel", "branches": [
                {"steps": [
                    {"id": "inner", "type": "parallel", "branches": [
                        {"steps": [task("x")]}, {"steps": [{"id": "z", "type": "sleep",
                                                            "duration_ms": 0}]}]},
                    {"id": "inner_j", "type": "join", "parallel": "inner"}]},
                {"steps": [task("y")]},
            ]},
            {"id": "outer_j", "type": "join", "parallel": "outer"},
        ]
    }  # fmt: skip
    inst = await flow.start(doc)
    await flow.settle()
    got = await flow.instance(inst["id"])
    assert got["state"] == "SUCCEEDED"
    order = [s["step"] for s in sorted(got["steps"], key=lambda s: s["seq"])]
    assert order.index("inner_j") < order.index("outer_j")


# ----------------------------------------------------------------------------- choice, fail


async def test_choice_routes_on_input_and_outputs(db: Database, tenant) -> None:
    flow = await Flow.create(db, await tenant())
    doc = {
        "input_schema": {"object": {"amount": "number"}},
        "steps": [
            {"id": "route", "type": "choice",
             "cases": [{"when": {"op": ">", "args": ["$.input.amount", 1000]}, "next": "big"}],
             "default": "small"},
            {"id": "big", "type": "succeed", "output": "big"},
            {"id": "small", "type": "succeed", "output": "small"},
        ],
    }  # fmt: skip
    name = await flow.publish(doc)
    assert (await flow.start_named(name, {"amount": 5000}))[1]["output"] == "big"
    _, small = await flow.start_named(name, {"amount": 5})
    assert small["output"] == "small"
    route = small["steps"][0]
    assert route["state"] == "SUCCEEDED" and route["next_step"] == "small"


async def test_choice_without_match_or_with_a_runtime_error_fails(db: Database, tenant) -> None:
    flow = await Flow.create(db, await tenant())
    doc = {"steps": [{"id": "c", "type": "choice",
                      "cases": [{"when": {"op": "<", "args": ["$.input.v", 3]}, "next": "x"}]},
                     {"id": "x", "type": "succeed"}]}  # fmt: skip
    name = await flow.publish(doc)
    _, none = await flow.start_named(name, {"v": 9})
    assert none["state"] == "FAILED" and none["error"]["code"] == "no_choice_matched"
    _, err = await flow.start_named(name, {"v": "text"})
    assert err["state"] == "FAILED" and err["error"]["code"] == "expression_error"


async def test_input_not_matching_input_schema_is_refused(db: Database, tenant) -> None:
    from orbit.errors import InvalidRequest

    flow = await Flow.create(db, await tenant())
    name = await flow.publish({"input_schema": {"object": {"n": "number"}},
                               "steps": [{"id": "x", "type": "succeed"}]})  # fmt: skip
    with pytest.raises(InvalidRequest) as exc:
        await flow.start_named(name, {"n": "one"})
    assert exc.value.field == "input"
    rows = await flow.rows("SELECT id FROM weave_instances WHERE namespace_id = %s")
    assert rows == []
