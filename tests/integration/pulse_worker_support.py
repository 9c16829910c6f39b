"""Helpers for the worker-side Pulse tests (dispatch, attempts, recovery).

* :class:`FakeConn` — a hub connection that records the frames pushed to it (no socket).
* :func:`open_session` — a real session (service layer), authenticated, as SessionInfo.
* :func:`connect` — bind a session to a hub as the WebSocket route does.
* :func:`check_invariants` — every rule the worker side must keep, checked on the rows.
"""

from __future__ import annotations

from collections.abc import Sequence
from datetime import datetime, timedelta
from typing import Any

from pulse_fixtures import Tenant

from orbit.storage import Database, Tx
from pulse import sessions, wire
from pulse.hub import Connection, Hub
from pulse.sessions import SessionInfo


class FakeConn(Connection):
    """Records frames instead of sending them."""

    kind = "test"

    def __init__(self, info: SessionInfo, queues: Sequence[sessions.QueueRef]) -> None:
        super().__init__(info, queues)
        self.frames: list[wire.ServerFrame] = []

    async def send(self, frame: wire.ServerFrame) -> bool:
        if self.closed:
            return False
        self.frames.append(frame)
        return True

    def offers(self) -> list[wire.Offer]:
        return [f for f in self.frames if isinstance(f, wire.Offer)]

    def take_offers(self) -> list[wire.Offer]:
        out = self.offers()
        self.frames = [f for f in self.frames if not isinstance(f, wire.Offer)]
        return out

    def cancels(self) -> list[wire.Cancel]:
        return [f for f in self.frames if isinstance(f, wire.Cancel)]


async def open_session(
    db: Database,
    t: Tenant,
    *,
    queues: Sequence[str] | None = None,
    max_concurrency: int = 4,
    concurrency_keys: bool = False,
    settings: sessions.WorkerSettings | None = None,
    now: datetime | None = None,
) -> tuple[SessionInfo, str]:
    """Create a session through the service and authenticate it; (info, token)."""
    body = wire.SessionCreate(
        instance=wire.InstanceInfo(host="test-host", pid=1234, sdk="tests/0"),
        queues=list(queues or [t.queue]),
        max_concurrency=max_concurrency,
        concurrency_keys=concurrency_keys,
    )
    created = await sessions.create_session(
        db,
        namespace_id=t.namespace_id,
        application_id=t.application_id,
        credential_id=t.credential_id,
        allowed_queues=None,
        body=body,
        settings=settings or sessions.WorkerSettings(),
        now=now,
    )
    info = await sessions.authenticate(
        db, t.namespace, created.session_token, created.session_id, now=now
    )
    return info, created.session_token


async def connect(db: Database, hub: Hub, info: SessionInfo) -> FakeConn:
    """Bind the session to ``hub`` (node id recorded in the DB) with a recording transport."""
    queues = await sessions.resolve_queues(db, info.namespace_id, info.queues)
    conn = FakeConn(info, queues)
    assert await sessions.attach_node(db, info.namespace_id, info.session_id, hub.node_id)
    hub.register(conn)
    return conn


async def db_now(db: Database) -> datetime:
    return await db.now()


def later(now: datetime, ms: int) -> datetime:
    return now + timedelta(milliseconds=ms)


async def task_row(db: Database, t: Tenant, task_id: str | bytes) -> dict[str, Any]:
    tid = bytes.fromhex(task_id) if isinstance(task_id, str) else task_id

    async def run(tx: Tx) -> dict[str, Any]:
        row = await tx.fetchone(
            "SELECT * FROM pulse_tasks WHERE namespace_id = %s AND id = %s", (t.namespace_id, tid)
        )
        assert row is not None
        return row

    return await db.read(run)


async def attempt_rows(db: Database, t: Tenant, task_id: str | bytes) -> list[dict[str, Any]]:
    tid = bytes.fromhex(task_id) if isinstance(task_id, str) else task_id

    async def run(tx: Tx) -> list[dict[str, Any]]:
        return await tx.fetchall(
            "SELECT * FROM pulse_attempts WHERE namespace_id = %s AND task_id = %s"
            " ORDER BY offered_at, id",
            (t.namespace_id, tid),
        )

    return await db.read(run)


async def evidence_rows(db: Database, t: Tenant, task_id: str | bytes) -> list[dict[str, Any]]:
    tid = bytes.fromhex(task_id) if isinstance(task_id, str) else task_id

    async def run(tx: Tx) -> list[dict[str, Any]]:
        return await tx.fetchall(
            "SELECT * FROM pulse_attempt_evidence WHERE namespace_id = %s AND task_id = %s"
            " ORDER BY created_at, id",
            (t.namespace_id, tid),
        )

    return await db.read(run)


async def check_invariants(db: Database, namespace_id: bytes) -> None:
    """The worker side's invariants over every row of a namespace (raises AssertionError).

    * counters of every queue equal a recount of the rows they count;
    * a LEASED task's current attempt is OFFERED, a RUNNING task's is RUNNING, both bound to
      the task at generation ``attempts + 1`` (LEASED) / ``attempts`` (RUNNING), and lease
      and session mirrored on the task; other states have no current attempt;
    * at most one OFFERED/RUNNING attempt per task, and it is the current one;
    * no two started attempts of a task share a generation; generations of started attempts
      are 1..attempts;
    * every session holds at most max_concurrency OFFERED + RUNNING attempts;
    * SUCCEEDED/FAILED/CANCELLED never carry effect_uncertain; NEEDS_REVIEW from a lost
      attempt does; every applied receipt belongs to a finished attempt.
    """

    async def run(tx: Tx) -> None:
        ns = (namespace_id,)
        usage = await tx.fetchall(
            "SELECT queue_id, unfinished_tasks, reservations, active_attempts"
            " FROM pulse_queue_usage WHERE namespace_id = %s",
            ns,
        )
        for u in usage:
            r = await tx.fetchone(
                "SELECT COALESCE(SUM(state IN ('WAITING','LEASED','RUNNING','NEEDS_REVIEW')),0) u,"
                " COALESCE(SUM(state='LEASED'),0) r, COALESCE(SUM(state='RUNNING'),0) a"
                " FROM pulse_tasks WHERE namespace_id = %s AND queue_id = %s",
                (namespace_id, u["queue_id"]),
            )
            assert r is not None
            got = (int(u["unfinished_tasks"]), int(u["reservations"]), int(u["active_attempts"]))
            want = (int(r["u"]), int(r["r"]), int(r["a"]))
            assert got == want, f"usage {got} != recount {want}"
        tasks = await tx.fetchall("SELECT * FROM pulse_tasks WHERE namespace_id = %s", ns)
        attempts = await tx.fetchall("SELECT * FROM pulse_attempts WHERE namespace_id = %s", ns)
        by_task: dict[bytes, list[dict[str, Any]]] = {}
        for a in attempts:
            by_task.setdefault(a["task_id"], []).append(a)
        for task in tasks:
            mine = by_task.get(task["id"], [])
            live = [a for a in mine if a["state"] in ("OFFERED", "RUNNING")]
            assert len(live) <= 1, f"task has {len(live)} live attempts"
            state = task["state"]
            if state in ("LEASED", "RUNNING"):
                assert live, f"{state} task without a live attempt"
                a = live[0]
                assert task["current_attempt_id"] == a["id"]
                assert task["session_id"] == a["session_id"]
                assert task["lease_expires_at"] == a["lease_expires_at"]
                if state == "LEASED":
                    assert a["state"] == "OFFERED"
                    assert a["generation"] == task["attempts"] + 1
                else:
                    assert a["state"] == "RUNNING"
                    assert a["generation"] == task["attempts"]
            else:
                assert not live, f"{state} task with a live attempt"
                assert task["current_attempt_id"] is None
                assert task["lease_expires_at"] is None
            if state in ("SUCCEEDED", "FAILED", "CANCELLED"):
                assert not task["effect_uncertain"]
                assert task["finished_at"] is not None
            started = sorted(a["generation"] for a in mine if a["started_at"] is not None)
            assert started == list(range(1, len(started) + 1)), f"generations {started}"
            assert len(started) == task["attempts"], (
                f"{len(started)} started, attempts={task['attempts']}"
            )
        sessions_rows = await tx.fetchall(
            "SELECT id, max_concurrency FROM pulse_worker_sessions WHERE namespace_id = %s", ns
        )
        for s in sessions_rows:
            held = sum(
                1
                for a in attempts
                if a["session_id"] == s["id"] and a["state"] in ("OFFERED", "RUNNING")
            )
            assert held <= s["max_concurrency"], f"session holds {held} > {s['max_concurrency']}"
        receipts = await tx.fetchall(
            "SELECT id AS attempt_id, state FROM pulse_attempts"
            " WHERE namespace_id = %s AND receipt_id IS NOT NULL",
            ns,
        )
        for rc in receipts:
            assert rc["state"] in ("SUCCEEDED", "FAILED", "CANCELLED"), rc

    await db.read(run)
