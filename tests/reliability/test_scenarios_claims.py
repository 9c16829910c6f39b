"""Targeted scenarios on the worker side's transactions, against the real database.

Each test's docstring states the expected behaviour. They drive the real services
(``pulse.dispatch.Dispatcher``, ``pulse.attempts``, ``pulse.tasks``, ``pulse.recovery``) in
process, and inject faults with a ``Tx`` subclass (a pause at a chosen statement) plus
``KILL CONNECTION`` from a separate connection — the database does the rest.
"""

from __future__ import annotations

import asyncio
import contextvars
import random
import sys
from datetime import timedelta
from typing import Any

import msgspec
import pytest
from reliability_support import ROOT, query, record_figures

import orbit.storage.db as storage_db
from orbit.errors import Conflict, StaleToken
from orbit.ids import parse_id
from orbit.storage import DSN, Database
from pulse import attempts, tasks, wire
from pulse.attempts import Report
from pulse.dispatch import Dispatcher
from pulse.hub import Hub
from pulse.recovery import recover_attempt

sys.path.insert(0, str(ROOT / "tests" / "integration"))
from pulse_worker_support import (
    check_invariants,
    connect,
    open_session,
    task_row,
)

#: Set in the task whose transaction should pause (other transactions are untouched).
PAUSE_AFTER: contextvars.ContextVar[tuple[str, asyncio.Event, asyncio.Event, list[int]] | None] = (
    contextvars.ContextVar("PAUSE_AFTER", default=None)
)


class PausingTx(storage_db.Tx):
    """A Tx that, when ``PAUSE_AFTER`` is set in the running task, records its connection id
    and waits after the first statement containing the marker (the transaction stays open,
    its row locks held)."""

    async def _maybe_pause(self, sql: str) -> None:
        plan = PAUSE_AFTER.get()
        if plan is None or plan[0] not in sql:
            return
        _marker, paused, resume, conn_ids = plan
        PAUSE_AFTER.set(None)
        conn_ids.append(self._conn.thread_id())
        paused.set()
        await resume.wait()

    async def execute(self, sql: str, args: Any = None) -> int:
        n = await super().execute(sql, args)
        await self._maybe_pause(sql)
        return n

    async def executemany(self, sql: str, args: Any) -> int:
        n = await super().executemany(sql, args)
        await self._maybe_pause(sql)
        return n


async def test_claimer_killed_inside_the_claim_transaction(
    dsn: DSN, db: Database, tenant: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The dispatcher's claim (lease) transaction has updated the task WAITING → LEASED and
    inserted the OFFERED attempt, and its connection is killed (``KILL CONNECTION`` from
    another connection) before COMMIT — as when the claiming process dies. Expected: the
    database rolls the transaction back: the task row is exactly as before (state,
    revision, attempts, lease columns), no attempt row exists, the usage counters equal a
    recount, and the task is claimable at once by another dispatcher (no lock left)."""
    monkeypatch.setattr(storage_db, "Tx", PausingTx)
    t = await tenant()
    task = await t.submit()
    before = await task_row(db, t, task["id"])
    victim = await Database.connect(dsn, maxsize=1, max_retries=0)
    hub_a, hub_b = Hub("victim-node"), Hub("survivor-node")
    info_a, _ = await open_session(db, t)
    conn_a = await connect(db, hub_a, info_a)
    paused, resume, conn_ids = asyncio.Event(), asyncio.Event(), []

    async def claim() -> BaseException | int:
        PAUSE_AFTER.set(("INSERT INTO pulse_attempts", paused, resume, conn_ids))
        try:
            return await Dispatcher(victim, hub_a).dispatch_to(conn_a)
        except Exception as exc:
            return exc

    claimer = asyncio.create_task(claim())
    await asyncio.wait_for(paused.wait(), 10)
    # Mid-transaction, from outside: the task is locked, uncommitted, invisible to others.
    assert query(dsn, "SELECT state FROM pulse_tasks WHERE namespace_id = %s AND id = %s",
                 (t.namespace_id, bytes.fromhex(task["id"])))[0][0] == "WAITING"  # fmt: skip
    query(dsn, f"KILL CONNECTION {int(conn_ids[0])}")
    loop = asyncio.get_running_loop()
    killed_at = loop.time()
    # Claimable at once by another node's dispatcher (SKIP LOCKED would skip a held row).
    info_b, _ = await open_session(db, t)
    conn_b = await connect(db, hub_b, info_b)
    after_kill = await task_row(db, t, task["id"])
    claimed = await Dispatcher(db, hub_b).dispatch_to(conn_b)
    claim_delay = loop.time() - killed_at
    resume.set()
    outcome = await asyncio.wait_for(claimer, 10)
    await victim.close()
    record_figures("claim_killed", claim_delay_s=round(claim_delay, 3), claimer_outcome=repr(outcome)[:80])
    assert isinstance(outcome, Exception), outcome  # the killed claim never committed
    keys = ("state", "revision", "attempts", "current_attempt_id", "session_id",
            "lease_expires_at", "state_version")  # fmt: skip
    assert {k: after_kill[k] for k in keys} == {k: before[k] for k in keys}
    assert claimed == 1 and claim_delay < 2.0
    (offer,) = conn_b.take_offers()
    assert offer.task.id == task["id"] and offer.task.generation == 1
    n_attempts = query(dsn, "SELECT COUNT(*) FROM pulse_attempts WHERE namespace_id = %s AND task_id = %s",
                       (t.namespace_id, bytes.fromhex(task["id"])))[0][0]  # fmt: skip
    assert n_attempts == 1  # only the survivor's offer
    await check_invariants(db, t.namespace_id)


# --- cancel vs complete vs fail vs heartbeat vs recovery --------------------------------------

ROUNDS = 12


async def _running(db: Database, hub: Hub, t: Any) -> tuple[dict[str, Any], Any, bytes, wire.Started]:
    task = await t.submit()
    info, _ = await open_session(db, t)
    conn = await connect(db, hub, info)
    assert await Dispatcher(db, hub).dispatch_to(conn) == 1
    (offer,) = conn.take_offers()
    aid = parse_id(offer.attempt_id)
    assert aid is not None
    started = await attempts.start(db, t.namespace_id, info.session_id, aid)
    assert isinstance(started, wire.Started), started
    return task, info, aid, started


async def test_cancel_complete_fail_heartbeat_and_recovery_race(db: Database, tenant: Any) -> None:
    """A RUNNING task with a cancel request gets, at the same moment, ``complete``,
    ``cancelled`` and ``fail`` reports with the right token, a heartbeat, a second cancel
    and a recovery round that judges the lease as passed. Expected, every round: exactly
    one of the three reports or the recovery wins; the task's final state is the winner's
    (SUCCEEDED / CANCELLED / FAILED / NEEDS_REVIEW); exactly one applied receipt (none when
    recovery won) and exactly one result event for the task; the losers get ``conflict``
    (another report was applied) or ``stale_token`` (recorded as evidence); the worker-side
    invariants hold."""
    hub = Hub("race-node")
    wins: dict[str, int] = {}
    for round_ in range(ROUNDS):
        t = await tenant()
        task, info, aid, started = await _running(db, hub, t)
        ns = t.namespace_id
        assert (await tasks.cancel_task(db, ns, task["id"])).status == 202
        token = started.execution_token
        lease = (await task_row(db, t, task["id"]))["lease_expires_at"]
        contenders = {
            "complete": attempts.report(db, ns, Report(op="complete", attempt_id=aid, execution_token=token,
                                                       result=msgspec.Raw(b'{"done": true}'))),
            "cancelled": attempts.report(db, ns, Report(op="cancelled", attempt_id=aid, execution_token=token)),
            "fail": attempts.report(db, ns, Report(op="fail", attempt_id=aid, execution_token=token,
                                                   error=wire.FailError(type="boom"))),
            "heartbeat": attempts.heartbeat(db, ns, info.session_id, [started.attempt_id]),
            "cancel": tasks.cancel_task(db, ns, task["id"]),
            "recovery": recover_attempt(db, ns, aid, reason="lease_expired",
                                        now=lease + timedelta(seconds=1)),
        }  # fmt: skip
        names = list(contenders)
        random.shuffle(names)
        results = dict(zip(names, await asyncio.gather(*(contenders[n] for n in names),
                                                       return_exceptions=True), strict=True))  # fmt: skip
        applied = [n for n in ("complete", "cancelled", "fail")
                   if isinstance(results[n], wire.Receipt) and results[n].outcome == "applied"]  # fmt: skip
        recovered = results["recovery"] == "lost"
        assert len(applied) + int(recovered) == 1, (round_, results)
        winner = applied[0] if applied else "recovery"
        wins[winner] = wins.get(winner, 0) + 1
        for n in ("complete", "cancelled", "fail"):
            if n not in applied:
                assert isinstance(results[n], Conflict | StaleToken), (n, results[n])
        assert not isinstance(results["heartbeat"], BaseException) or isinstance(
            results["heartbeat"], attempts.SessionGone
        ), results["heartbeat"]
        cancel_result = results["cancel"]
        assert not isinstance(cancel_result, BaseException) or isinstance(cancel_result, Conflict), cancel_result
        final = await task_row(db, t, task["id"])
        want = {"complete": "SUCCEEDED", "cancelled": "CANCELLED", "fail": "FAILED",
                "recovery": "NEEDS_REVIEW"}[winner]  # fmt: skip
        assert final["state"] == want, (winner, final["state"])
        receipts = query(db.dsn, "SELECT COUNT(*) FROM pulse_attempts WHERE namespace_id = %s AND receipt_id IS NOT NULL", (ns,))
        events = query(db.dsn, "SELECT state FROM orbit_result_events WHERE namespace_id = %s AND task_id = %s",
                       (ns, bytes.fromhex(task["id"])))  # fmt: skip
        assert receipts == [(0 if winner == "recovery" else 1,)]
        assert events == [(want,)]
        await check_invariants(db, ns)
    record_figures("cancel_complete_race", rounds=ROUNDS, wins=wins, anomalies=0)


# --- empty-queue pollers vs producers ---------------------------------------------------------


async def test_empty_queue_pollers_racing_producers_cause_no_lock_errors(
    dsn: DSN, db: Database, tenant: Any
) -> None:
    """Four dispatchers (separate pools, as separate nodes) poll an empty queue in a tight
    loop while four producers submit tasks one by one into it. Expected (docs/mysql-notes.md,
    READ COMMITTED + SKIP LOCKED): no 1205 and no 1213 anywhere — ``db.stats.retries`` of
    every pool stays empty — every task is offered exactly once, and the invariants hold."""
    t = await tenant()
    pools = [await Database.connect(dsn, maxsize=4) for _ in range(5)]
    producer_db, poller_dbs = pools[0], pools[1:]
    hubs = [Hub(f"poller-{i}") for i in range(len(poller_dbs))]
    conns = []
    for pdb, hub in zip(poller_dbs, hubs, strict=True):
        info, _ = await open_session(pdb, t, max_concurrency=10_000)
        conns.append(await connect(pdb, hub, info))
    stop = asyncio.Event()
    polls = 0

    async def poll(pdb: Database, hub: Hub, conn: Any) -> None:
        nonlocal polls
        d = Dispatcher(pdb, hub)
        while not stop.is_set():
            await d.dispatch_to(conn)
            polls += 1

    from pulse import submit as submit_service
    from pulse.types import TaskSubmit

    async def produce(n: int) -> None:
        for i in range(n):
            body = msgspec.json.decode(msgspec.json.encode({"queue": t.queue, "kind": "k", "payload": i}),
                                       type=TaskSubmit)  # fmt: skip
            await submit_service.submit_one(producer_db, t.namespace_id, t.application_id, body)

    pollers = [asyncio.create_task(poll(p, h, c)) for p, h, c in zip(poller_dbs, hubs, conns, strict=True)]
    try:
        await asyncio.gather(*(produce(40) for _ in range(4)))
        for _ in range(100):
            if sum(len(c.offers()) for c in conns) >= 160:
                break
            await asyncio.sleep(0.05)
    finally:
        stop.set()
        await asyncio.gather(*pollers)
    offered = [o.task.id for c in conns for o in c.offers()]
    retries = {code: n for p in pools for code, n in p.stats.retries.items()}
    for p in pools:
        await p.close()
    record_figures("empty_pollers_vs_producers", polls=polls, tasks=160, offered=len(offered),
                   retries=retries)  # fmt: skip
    assert retries == {}, retries
    assert len(offered) == 160 and len(set(offered)) == 160
    await check_invariants(db, t.namespace_id)
