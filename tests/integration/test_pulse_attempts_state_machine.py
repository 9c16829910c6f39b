"""The task/attempt state machine as a Hypothesis RuleBasedStateMachine against the real
database: submit, lease (dispatch), start, heartbeat, complete, fail, cancelled, stale and
replayed reports, expire (the pinned clock moves, recovery runs), cancel, resolve — with the
invariants checked after every step (CHECKs hold, one current attempt, counters equal a
recount, flow control, no generation started twice)."""

from __future__ import annotations

import asyncio
import contextlib
from datetime import datetime, timedelta
from typing import Any

import msgspec
import pytest
from conftest import create_database, drop_database
from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, precondition, rule
from pulse_fixtures import Tenant, make_tenant
from pulse_worker_support import FakeConn, check_invariants, connect, open_session

from orbit import migrate
from orbit.audit import CLI_ACTOR
from orbit.errors import Conflict, StaleToken
from orbit.ids import parse_id
from orbit.storage import Database, Tx
from pulse import attempts, tasks, wire
from pulse import submit as submit_service
from pulse.attempts import Report
from pulse.dispatch import Dispatcher
from pulse.errors import TaskStateConflict
from pulse.hub import Hub
from pulse.recovery import Recovery
from pulse.types import Resolve, ResolveAction, TaskSubmit

LOOP: asyncio.AbstractEventLoop | None = None
DB: Database | None = None


def run(coro: Any) -> Any:
    assert LOOP is not None
    return LOOP.run_until_complete(coro)


class WorkerMachine(RuleBasedStateMachine):
    """One tenant per example; the clock is pinned and only moves forward."""

    @initialize()
    def setup(self) -> None:
        assert DB is not None
        self.db = DB
        self.t: Tenant = run(
            make_tenant(
                self.db, lease_ms=1000,
                retry={"max_attempts": 2, "backoff_initial_ms": 500, "backoff_max_ms": 500},
            )
        )  # fmt: skip
        self.now: datetime = run(self.db.now())
        self.hub = Hub(f"sm-{id(self)}")
        self.conns: list[FakeConn] = []
        self.offers: dict[str, FakeConn] = {}  # attempt hex → the session it was offered to
        self.running: dict[str, tuple[bytes, str]] = {}  # attempt hex → (id, token)
        self.applied: list[tuple[Report, str]] = []  # (report, receipt id)
        self.started: set[tuple[bytes, int]] = set()  # (task id, generation)
        self.tasks: list[str] = []

    # -- helpers ---------------------------------------------------------------------------

    def _tick(self, ms: int = 50) -> None:
        self.now += timedelta(milliseconds=ms)

    def _task_state(self, task_id: str) -> dict[str, Any]:
        async def q(tx: Tx) -> dict[str, Any]:
            row = await tx.fetchone(
                "SELECT state, revision, current_attempt_id FROM pulse_tasks"
                " WHERE namespace_id = %s AND id = %s",
                (self.t.namespace_id, bytes.fromhex(task_id)),
            )
            assert row is not None
            return row

        return run(self.db.read(q))  # type: ignore[no-any-return]

    # -- rules -----------------------------------------------------------------------------

    @rule(retry_safe=st.booleans(), priority=st.integers(0, 9))
    def submit(self, retry_safe: bool, priority: int) -> None:
        body = msgspec.json.decode(
            msgspec.json.encode({"queue": self.t.queue, "kind": "k", "payload": {"n": 1},
                                 "retry_safe": retry_safe, "priority": priority}),
            type=TaskSubmit,
        )  # fmt: skip
        res = run(submit_service.submit_one(
            self.db, self.t.namespace_id, self.t.application_id, body, now=self.now
        ))  # fmt: skip
        self.tasks.append(res.json()["id"])
        self.hub.notify_new_work()
        self._tick()

    @precondition(lambda self: len(self.conns) < 3)
    @rule(capacity=st.integers(1, 3))
    def open_session(self, capacity: int) -> None:
        info, _ = run(open_session(self.db, self.t, max_concurrency=capacity, now=self.now))
        self.conns.append(run(connect(self.db, self.hub, info)))

    @precondition(lambda self: bool(self.conns))
    @rule(data=st.data())
    def dispatch(self, data: st.DataObject) -> None:
        conn = data.draw(st.sampled_from(self.conns))
        run(Dispatcher(self.db, self.hub).dispatch_to(conn, now=self.now))
        if conn.closed:
            self.conns.remove(conn)
        for offer in conn.take_offers():
            assert offer.attempt_id not in self.offers
            self.offers[offer.attempt_id] = conn
        self._tick()

    @precondition(lambda self: bool(self.offers))
    @rule(data=st.data())
    def start(self, data: st.DataObject) -> None:
        aid = data.draw(st.sampled_from(sorted(self.offers)))
        conn = self.offers.pop(aid)
        reply = run(attempts.start(
            self.db, self.t.namespace_id, conn.info.session_id, parse_id(aid), now=self.now
        ))  # fmt: skip
        if isinstance(reply, wire.Started):
            key = (self._attempt_task(aid), reply.generation)
            assert key not in self.started, "a generation was started twice"
            self.started.add(key)
            # The same session starting again (its `started` reply was lost) rotates the
            # token: same generation, a new token, and the first one is stale from now on.
            again = run(attempts.start(
                self.db, self.t.namespace_id, conn.info.session_id, parse_id(aid), now=self.now
            ))  # fmt: skip
            assert isinstance(again, wire.Started), again
            assert again.generation == reply.generation
            assert again.execution_token != reply.execution_token
            with pytest.raises(StaleToken):
                run(attempts.report(
                    self.db, self.t.namespace_id,
                    Report("complete", parse_id(aid), reply.execution_token), now=self.now,
                ))  # type: ignore[arg-type]  # fmt: skip
            self.running[aid] = (parse_id(aid), again.execution_token)  # type: ignore[assignment]
        self._tick()

    def _attempt_task(self, aid: str) -> bytes:
        async def q(tx: Tx) -> bytes:
            return await tx.fetchval(  # type: ignore[no-any-return]
                "SELECT task_id FROM pulse_attempts WHERE namespace_id = %s AND id = %s",
                (self.t.namespace_id, parse_id(aid)),
            )

        return run(self.db.read(q))  # type: ignore[no-any-return]

    @precondition(lambda self: bool(self.conns))
    @rule(data=st.data())
    def heartbeat(self, data: st.DataObject) -> None:
        conn = data.draw(st.sampled_from(self.conns))
        try:
            run(attempts.heartbeat(
                self.db, self.t.namespace_id, conn.info.session_id, sorted(self.running),
                now=self.now,
            ))  # fmt: skip
        except attempts.SessionGone:
            self.conns.remove(conn)
        self._tick()

    @precondition(lambda self: bool(self.running))
    @rule(data=st.data(), outcome=st.sampled_from(["complete", "fail_retry", "fail", "cancelled"]))
    def report(self, data: st.DataObject, outcome: str) -> None:
        aid = data.draw(st.sampled_from(sorted(self.running)))
        raw_id, token = self.running[aid]
        err = wire.FailError(type="E", message="boom")
        rep = {
            "complete": Report("complete", raw_id, token, result=msgspec.Raw(b'{"v": 1.50}')),
            "fail_retry": Report("fail", raw_id, token, error=err, retryable=True),
            "fail": Report("fail", raw_id, token, error=err),
            "cancelled": Report("cancelled", raw_id, token),
        }[outcome]
        try:
            receipt = run(attempts.report(self.db, self.t.namespace_id, rep, now=self.now))
        except StaleToken:  # its lease passed: evidence, never applied
            del self.running[aid]
        except Conflict as exc:
            assert exc.kind == "not_cancel_requested" and outcome == "cancelled"
        else:
            assert receipt.outcome == "applied"
            del self.running[aid]
            self.applied.append((rep, receipt.receipt_id))
        self.hub.notify_new_work()
        self._tick()

    @precondition(lambda self: bool(self.applied))
    @rule(data=st.data())
    def replay(self, data: st.DataObject) -> None:
        rep, receipt_id = data.draw(st.sampled_from(self.applied))
        again = run(attempts.report(self.db, self.t.namespace_id, rep, now=self.now))
        assert again.outcome == "replayed" and again.receipt_id == receipt_id

    @precondition(lambda self: bool(self.running) or bool(self.applied))
    @rule(data=st.data())
    def stale_token(self, data: st.DataObject) -> None:
        ids = sorted(self.running) + [r.attempt_id.hex() for r, _ in self.applied]
        aid = data.draw(st.sampled_from(ids))

        async def snapshot(tx: Tx) -> Any:
            return await tx.fetchall(
                "SELECT id, state, revision FROM pulse_tasks WHERE namespace_id = %s ORDER BY id",
                (self.t.namespace_id,),
            )

        before = run(self.db.read(snapshot))
        with pytest.raises(StaleToken):
            run(attempts.report(
                self.db, self.t.namespace_id,
                Report("complete", parse_id(aid), "ext_not_the_token"), now=self.now,
            ))  # type: ignore[arg-type]  # fmt: skip
        assert run(self.db.read(snapshot)) == before  # nothing changed

    @precondition(lambda self: bool(self.tasks))
    @rule(data=st.data())
    def cancel(self, data: st.DataObject) -> None:
        task_id = data.draw(st.sampled_from(self.tasks))
        with contextlib.suppress(TaskStateConflict):  # a finished task: 409
            run(tasks.cancel_task(self.db, self.t.namespace_id, task_id, hub=self.hub,
                                  now=self.now))  # fmt: skip
        self._tick()

    @precondition(lambda self: bool(self.tasks))
    @rule(data=st.data(), action=st.sampled_from(list(ResolveAction)))
    def resolve(self, data: st.DataObject, action: ResolveAction) -> None:
        task_id = data.draw(st.sampled_from(self.tasks))
        if self._task_state(task_id)["state"] != "NEEDS_REVIEW":
            return
        body = Resolve(action=action, note="checked by the state machine")
        if action is ResolveAction.SUCCEED:
            body = Resolve(action=action, note="checked", result=msgspec.Raw(b"true"))
        run(tasks.resolve_task(self.db, self.t.namespace_id, task_id, body, actor=CLI_ACTOR,
                               hub=self.hub, now=self.now))  # fmt: skip
        self._tick()

    @rule(ms=st.sampled_from([300, 1_500, 11_000, 31_000]))
    def expire(self, ms: int) -> None:
        """The clock moves on; recovery decides (offers 10 s, running lease 1 s, session 30 s)."""
        self._tick(ms)
        run(Recovery(self.db, self.hub).run_once(now=self.now))
        self.conns = [c for c in self.conns if not c.closed]
        live = set()

        async def q(tx: Tx) -> set[str]:
            rows = await tx.fetchall(
                "SELECT id, state FROM pulse_attempts WHERE namespace_id = %s"
                " AND state IN ('OFFERED', 'RUNNING')",
                (self.t.namespace_id,),
            )
            return {r["id"].hex() for r in rows}

        live = run(self.db.read(q))
        self.offers = {a: c for a, c in self.offers.items() if a in live}
        self.running = {a: v for a, v in self.running.items() if a in live}

    @invariant()
    def invariants(self) -> None:
        if hasattr(self, "t"):
            run(check_invariants(self.db, self.t.namespace_id))
            run(self._check_lost_rule())

    async def _check_lost_rule(self) -> None:
        """docs/retries.md: a lost running attempt of a retry-safe task is retried, or ends
        the task FAILED ``attempts_exhausted`` (never uncertain) on its last attempt; only a
        task that is not retry-safe goes to NEEDS_REVIEW with ``effect_uncertain``."""

        async def q(tx: Tx) -> list[dict[str, Any]]:
            return await tx.fetchall(
                "SELECT state, retry_safe, effect_uncertain, attempts, max_attempts, error"
                " FROM pulse_tasks WHERE namespace_id = %s",
                (self.t.namespace_id,),
            )

        for row in await self.db.read(q):
            if row["state"] == "NEEDS_REVIEW":
                assert not row["retry_safe"] and row["effect_uncertain"], row
            error = msgspec.json.decode(row["error"]) if row["error"] else None
            if row["state"] == "FAILED" and error and error["type"] == "attempts_exhausted":
                assert row["retry_safe"] and not row["effect_uncertain"], row
                assert row["attempts"] == row["max_attempts"], row


@pytest.mark.slow
def test_worker_state_machine() -> None:
    global LOOP, DB
    dsn = create_database("orbit_test_sm")
    LOOP = asyncio.new_event_loop()
    try:
        migrate.up(dsn)
        DB = LOOP.run_until_complete(Database.connect(dsn, maxsize=4))
        WorkerMachine.TestCase.settings = settings(
            max_examples=15,
            stateful_step_count=35,
            deadline=None,
            suppress_health_check=list(HealthCheck),
        )
        WorkerMachine.TestCase().runTest()
    finally:
        if DB is not None:
            LOOP.run_until_complete(DB.close())
        LOOP.close()
        LOOP = DB = None
        drop_database(dsn)
