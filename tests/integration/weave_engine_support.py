"""Helpers for the Weave engine tests: publish/start through the services, a worker that
drives Pulse through its worker-side services (dispatch → start → report), and ``settle``
which runs the timer loop, the advancer and the worker until nothing moves.

    from weave_engine_support import Flow

    flow = await Flow.create(db, tenant, queues=["pay"])
    inst = await flow.start({"steps": [...]}, input={"a": 1})
    await flow.settle(handler)            # handler(kind, payload) -> result | Fail(...)
    row = await flow.instance(inst["id"])
"""

from __future__ import annotations

import secrets
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

import msgspec
from pulse_fixtures import Tenant
from pulse_worker_support import connect, open_session

from orbit.audit import Actor
from orbit.ids import parse_id
from orbit.storage import Database, Tx
from pulse import attempts, wire
from pulse.attempts import Report
from pulse.dispatch import Dispatcher
from pulse.hub import Hub
from weave import definitions, instances, signals
from weave.advancer import Advancer, AdvancerSettings
from weave.timers import TimerLoop
from weave.types import SignalBody, StartBody


@dataclass
class Fail:
    """What a handler returns to fail the attempt."""

    message: str = "boom"
    retryable: bool = False


@dataclass
class Hold:
    """What a handler returns to leave the attempt running (no report)."""


Handler = Callable[[str, Any], Any]


def ok(_kind: str, payload: Any) -> Any:
    """Default handler: echo the payload back as the result."""
    return {"echo": payload}


@dataclass
class Flow:
    db: Database
    t: Tenant
    hub: Hub
    queues: list[str]
    advancer: Advancer
    timers: TimerLoop
    conn: Any = None
    held: list[tuple[bytes, str]] = field(default_factory=list)
    seen: list[tuple[str, Any]] = field(default_factory=list)

    @classmethod
    async def create(
        cls,
        db: Database,
        t: Tenant,
        queues: Sequence[str] = ("q",),
        *,
        queue_config: dict[str, Any] | None = None,
        advancer: Advancer | None = None,
    ) -> Flow:
        for q in queues:
            await t.add_queue(q, **(queue_config or {}))
        hub = Hub(f"weave-test-{secrets.token_hex(4)}")
        flow = cls(
            db=db,
            t=t,
            hub=hub,
            queues=list(queues),
            advancer=advancer
            or Advancer(db, hub=hub, settings=AdvancerSettings(backoff_initial_ms=50)),
            timers=TimerLoop(db),
        )
        return flow

    @property
    def actor(self) -> Actor:
        return Actor(self.t.credential_id, self.t.application_id)

    async def publish(self, doc: dict[str, Any], name: str | None = None) -> str:
        name = name or f"wf-{secrets.token_hex(4)}"
        reply = await definitions.publish_version(
            self.db, self.actor, self.t.namespace_id, name, msgspec.json.encode(doc)
        )
        assert reply.status in (200, 201), reply
        return name

    async def start_named(
        self,
        name: str,
        input: Any = None,
        *,
        raw_input: bytes | None = None,
        business_key: str | None = None,
        version: int | None = None,
        now: datetime | None = None,
    ) -> tuple[int, dict[str, Any]]:
        body = StartBody(
            input=msgspec.Raw(raw_input if raw_input is not None else msgspec.json.encode(input)),
            business_key=business_key,
            version=version,
        )
        reply = await instances.start_instance(
            self.db, self.actor, self.t.namespace_id, name, body, hub=self.hub, now=now
        )
        return reply.status, msgspec.json.decode(reply.body)

    async def start(self, doc: dict[str, Any], input: Any = None, **kw: Any) -> dict[str, Any]:
        name = await self.publish(doc)
        status, out = await self.start_named(name, input, **kw)
        assert status == 201, out
        return out

    async def signal(
        self,
        instance_id: str,
        name: str,
        payload: Any = None,
        *,
        signal_id: str | None = None,
        correlation_key: str | None = None,
        now: datetime | None = None,
    ) -> tuple[int, dict[str, Any]]:
        body = SignalBody(
            signal_id=signal_id or secrets.token_hex(8),
            payload=msgspec.Raw(msgspec.json.encode(payload)),
            correlation_key=correlation_key,
        )
        reply = await signals.send_signal(
            self.db, self.t.namespace_id, instance_id, name, body, actor=self.actor, now=now
        )
        return reply.status, msgspec.json.decode(reply.body)

    async def instance(self, instance_id: str) -> dict[str, Any]:
        out = await instances.get_instance(self.db, self.t.namespace_id, instance_id)
        return msgspec.json.decode(msgspec.json.encode(out))  # type: ignore[no-any-return]

    async def history(self, instance_id: str, **kw: Any) -> dict[str, Any]:
        out = await instances.get_history(self.db, self.t.namespace_id, instance_id, **kw)
        return msgspec.json.decode(msgspec.json.encode(out))  # type: ignore[no-any-return]

    # ------------------------------------------------------------------ the worker side

    async def _connection(self, now: datetime | None) -> Any:
        if self.conn is None or self.conn.closed:
            info, _ = await open_session(
                self.db, self.t, queues=self.queues, max_concurrency=64, now=now
            )
            self.conn = await connect(self.db, self.hub, info)
        return self.conn

    async def work(self, handler: Handler = ok, *, now: datetime | None = None) -> int:
        """Offer due tasks to this flow's session, run ``handler`` on each, report."""
        conn = await self._connection(now)
        n = await Dispatcher(self.db, self.hub).dispatch_to(conn, now=now)
        if not n and conn.closed:  # the session expired (a pinned clock moved on): reconnect
            conn = await self._connection(now)
            n = await Dispatcher(self.db, self.hub).dispatch_to(conn, now=now)
        if not n:
            return 0
        for offer in conn.take_offers():
            aid = parse_id(offer.attempt_id)
            assert aid is not None
            started = await attempts.start(
                self.db, self.t.namespace_id, conn.info.session_id, aid, now=now
            )
            if not isinstance(started, wire.Started):
                continue
            payload = msgspec.json.decode(bytes(offer.task.payload))
            self.seen.append((offer.task.kind, payload))
            outcome = handler(offer.task.kind, payload)
            if isinstance(outcome, Hold):
                self.held.append((aid, started.execution_token))
                continue
            await self.report(aid, started.execution_token, outcome, now=now)
        return n

    async def report(
        self, aid: bytes, token: str, outcome: Any, *, now: datetime | None = None
    ) -> wire.Receipt:
        if isinstance(outcome, Fail):
            rep = Report(
                "fail",
                aid,
                token,
                error=wire.FailError(type="test", message=outcome.message),
                retryable=outcome.retryable,
            )
        elif outcome == "cancelled":
            rep = Report("cancelled", aid, token)
        else:
            rep = Report("complete", aid, token, result=msgspec.Raw(msgspec.json.encode(outcome)))
        return await attempts.report(self.db, self.t.namespace_id, rep, now=now)

    async def settle(
        self, handler: Handler = ok, *, now: datetime | None = None, rounds: int = 50
    ) -> None:
        """Run timers, the advancer and the worker until a round changes nothing."""
        for _ in range(rounds):
            moved = await self.timers.run_once(now=now)
            stats = await self.advancer.run_once(now=now)
            moved += stats.processed + stats.failed
            moved += await self.work(handler, now=now)
            if not moved:
                return
        raise AssertionError("the flow did not settle")

    # ------------------------------------------------------------------ raw rows

    async def rows(self, sql: str, *args: Any) -> list[dict[str, Any]]:
        async def run(tx: Tx) -> list[dict[str, Any]]:
            return await tx.fetchall(sql, (self.t.namespace_id, *args))

        return await self.db.read(run)

    async def tasks_of(self, instance_id: str) -> list[dict[str, Any]]:
        """The instance's Pulse tasks (through their activations), in history order."""
        return await self.rows(
            "SELECT t.id, t.state, t.kind, t.payload, t.owner_id, t.source_kind, t.max_attempts,"
            " t.deadline_at, a.step_path, a.activation_no, a.state AS activation_state"
            " FROM weave_activations a JOIN pulse_tasks t"
            " ON t.namespace_id = a.namespace_id AND t.id = a.task_id"
            " WHERE a.namespace_id = %s AND a.instance_id = %s ORDER BY a.seq",
            bytes.fromhex(instance_id),
        )

    async def inbox_of(self, instance_id: str) -> list[dict[str, Any]]:
        return await self.rows(
            "SELECT kind, source_event_id, outcome, processed_at, attempts FROM weave_inbox"
            " WHERE namespace_id = %s AND instance_id = %s ORDER BY created_at, id",
            bytes.fromhex(instance_id),
        )
