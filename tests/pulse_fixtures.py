"""Fixtures shared by Pulse tests (producer and worker side).

Use in a test module with::

    from pulse_fixtures import Tenant  # the `tenant` fixture is registered in conftest.py

``tenant`` is a factory: ``t = await tenant()`` creates a fresh application, a namespace,
a credential key holding every action on it (``t.key``, usable as ``Bearer``), and a queue
named ``default`` (``t.queue_id``). Every call makes a new, unrelated tenant, so tests never
depend on each other. ``await t.add_queue("other", max_unfinished_tasks=3)`` adds queues;
``await t.submit(kind="k", payload={"a": 1})`` submits a task through the real service and
returns its row; ``await t.other_namespace()`` gives a second namespace of the same
application (same owner, other isolation boundary).
"""

from __future__ import annotations

import os
import secrets
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any

import msgspec
import pytest

from orbit.audit import CLI_ACTOR
from orbit.bootstrap import bootstrap
from orbit.ids import id_hex
from orbit.namespaces import insert_namespace
from orbit.storage import Database, Tx
from pulse import queues as queue_service
from pulse import submit as submit_service
from pulse.types import QueuePut, RetryPolicy, TaskSubmit


@dataclass
class Tenant:
    """One application with one namespace, an all-actions key and a ``default`` queue."""

    db: Database
    application_id: bytes
    application: str
    namespace_id: bytes
    namespace: str
    credential_id: bytes
    key: str
    queue: str = "default"
    queue_id: bytes = b""
    queues: dict[str, bytes] = field(default_factory=dict)

    @property
    def owner_hex(self) -> str:
        return id_hex(self.application_id)

    @property
    def auth(self) -> dict[str, str]:
        """``Authorization`` header of the tenant's key."""
        return {"Authorization": f"Bearer {self.key}"}

    async def add_queue(
        self, name: str, *, retry: dict[str, Any] | None = None, **config: Any
    ) -> bytes:
        """Create (or replace) queue ``name`` with ``config`` (QueuePut fields); its id."""
        body = QueuePut(retry=RetryPolicy(**retry) if retry else None, **config)
        res = await queue_service.put_queue(self.db, self.namespace_id, name, body)
        queue_id = bytes.fromhex(res.queue["id"])
        self.queues[name] = queue_id
        return queue_id

    async def submit(self, **fields: Any) -> dict[str, Any]:
        """Submit one task (``queue`` defaults to the tenant's queue, ``kind`` to ``"k"``,
        ``payload`` is any JSON-encodable value); return the task API object."""
        fields.setdefault("queue", self.queue)
        fields.setdefault("kind", "k")
        payload = fields.pop("payload", None)
        raw = msgspec.json.encode({**fields, "payload": payload})
        body = msgspec.json.decode(raw, type=TaskSubmit)
        res = await submit_service.submit_one(self.db, self.namespace_id, self.application_id, body)
        return res.json()  # type: ignore[no-any-return]

    async def other_namespace(self, name: str | None = None) -> Tenant:
        """A second namespace of the same application, with its own ``default`` queue and
        the same key (bootstrap keys name one namespace: use the service layer there)."""
        ns_name = name or f"ns-{secrets.token_hex(4)}"

        async def run(tx: Tx) -> bytes:
            row = await insert_namespace(tx, CLI_ACTOR, self.application_id, ns_name)
            return row.id  # type: ignore[no-any-return]

        ns_id = await self.db.transaction(run)
        other = Tenant(
            db=self.db,
            application_id=self.application_id,
            application=self.application,
            namespace_id=ns_id,
            namespace=ns_name,
            credential_id=self.credential_id,
            key=self.key,
        )
        other.queue_id = await other.add_queue(other.queue)
        return other


TenantFactory = Callable[..., Awaitable[Tenant]]


async def make_tenant(db: Database, *, queue: str = "default", **queue_config: Any) -> Tenant:
    """Create a fresh tenant (see module docstring)."""
    app = f"app-{secrets.token_hex(6)}"
    ns = f"ns-{secrets.token_hex(4)}"
    boot = await bootstrap(db, app, ns)
    t = Tenant(
        db=db,
        application_id=boot.application_id,
        application=app,
        namespace_id=boot.namespace_id,
        namespace=ns,
        credential_id=boot.credential_id,
        key=boot.key,
        queue=queue,
    )
    t.queue_id = await t.add_queue(queue, **queue_config)
    return t


@pytest.fixture
def tenant(db: Database) -> TenantFactory:
    """Factory fixture: ``t = await tenant(queue="default", **queue_config)``."""

    async def create(*, queue: str = "default", **queue_config: Any) -> Tenant:
        return await make_tenant(db, queue=queue, **queue_config)

    return create


# -- test-only state forcing (producer-side tests need LEASED/RUNNING/NEEDS_REVIEW tasks
# without a real worker; the worker side's tests drive the real dispatch instead) ----------


async def force_state(db: Database, t: Tenant, task_id: str, state: str) -> dict[str, Any]:
    """Move a task WAITING → LEASED → RUNNING → NEEDS_REVIEW with raw SQL, keeping the
    attempt row and the usage counters consistent (as the worker side would). Returns the
    attempt id hex of the current/last attempt under ``"attempt_id"``."""
    from pulse import transitions
    from pulse.store import tasks as task_store

    order = ["WAITING", "LEASED", "RUNNING", "NEEDS_REVIEW"]
    tid = bytes.fromhex(task_id)
    ns = t.namespace_id
    out: dict[str, Any] = {}

    async def step(tx: Tx, target: str) -> None:
        row = await task_store.task_get(tx, ns, tid, for_update=True)
        assert row is not None
        if target == "LEASED":
            attempt_id = os.urandom(16)
            await tx.execute(
                "INSERT INTO pulse_attempts (namespace_id, id, task_id, generation, session_id,"
                " state, lease_expires_at, offered_at) VALUES (%s, %s, %s, %s, %s, 'OFFERED',"
                " UTC_TIMESTAMP(6) + INTERVAL 30 SECOND, UTC_TIMESTAMP(6))",
                (ns, attempt_id, tid, row["attempts"] + 1, os.urandom(16)),
            )
            await tx.execute(
                "UPDATE pulse_tasks SET state = 'LEASED', attempts = attempts + 1,"
                " current_attempt_id = %s, session_id = %s,"
                " lease_expires_at = UTC_TIMESTAMP(6) + INTERVAL 30 SECOND,"
                " state_version = state_version + 1, revision = revision + 1,"
                " state_changed_at = UTC_TIMESTAMP(6) WHERE namespace_id = %s AND id = %s",
                (attempt_id, os.urandom(16), ns, tid),
            )
            await transitions.adjust_usage(
                tx, ns, row["queue_id"], reservations=1, owner_id=row["owner_id"]
            )
        elif target == "RUNNING":
            await tx.execute(
                "UPDATE pulse_attempts SET state = 'RUNNING', execution_token_digest = %s,"
                " started_at = UTC_TIMESTAMP(6), revision = revision + 1"
                " WHERE namespace_id = %s AND id = %s",
                (os.urandom(32), ns, row["current_attempt_id"]),
            )
            await tx.execute(
                "UPDATE pulse_tasks SET state = 'RUNNING', started_at = UTC_TIMESTAMP(6),"
                " state_version = state_version + 1, revision = revision + 1,"
                " state_changed_at = UTC_TIMESTAMP(6) WHERE namespace_id = %s AND id = %s",
                (ns, tid),
            )
            await transitions.adjust_usage(
                tx, ns, row["queue_id"], reservations=-1, active=1, owner_id=row["owner_id"]
            )
        elif target == "NEEDS_REVIEW":
            await tx.execute(
                "UPDATE pulse_attempts SET state = 'LOST', finished_at = UTC_TIMESTAMP(6),"
                ' error = \'{"type": "lease_expired"}\', revision = revision + 1'
                " WHERE namespace_id = %s AND id = %s",
                (ns, row["current_attempt_id"]),
            )
            await tx.execute(
                "UPDATE pulse_tasks SET state = 'NEEDS_REVIEW', effect_uncertain = 1,"
                " current_attempt_id = NULL, session_id = NULL, lease_expires_at = NULL,"
                ' error = \'{"type": "lost", "message": "running attempt lost"}\','
                " state_version = state_version + 1, revision = revision + 1,"
                " state_changed_at = UTC_TIMESTAMP(6) WHERE namespace_id = %s AND id = %s",
                (ns, tid),
            )
            await transitions.adjust_usage(
                tx, ns, row["queue_id"], active=-1, owner_id=row["owner_id"]
            )
        after = await task_store.task_get(tx, ns, tid)
        assert after is not None
        if after["current_attempt_id"] is not None:
            out["attempt_id"] = after["current_attempt_id"].hex()
        await transitions.record(tx, ns, after, f"test.forced_{target.lower()}")

    async def current(tx: Tx) -> str:
        row = await task_store.task_get(tx, ns, tid)
        assert row is not None
        return str(row["state"])

    now_state = await db.read(current)
    for target in order[order.index(now_state) + 1 : order.index(state) + 1]:

        async def run(tx: Tx, target: str = target) -> None:
            await step(tx, target)

        await db.transaction(run)
    return out


async def recount(db: Database, t: Tenant, queue_id: bytes | None = None) -> dict[str, Any]:
    """Counters vs the rows they count, for one queue: ``{"usage": {...}, "rows": {...}}``."""
    qid = queue_id or t.queue_id

    async def run(tx: Tx) -> dict[str, Any]:
        usage = await tx.fetchone(
            "SELECT unfinished_tasks, reservations, active_attempts FROM pulse_queue_usage"
            " WHERE namespace_id = %s AND queue_id = %s",
            (t.namespace_id, qid),
        )
        rows = await tx.fetchone(
            "SELECT COALESCE(SUM(state IN ('WAITING','LEASED','RUNNING','NEEDS_REVIEW')), 0) AS u,"
            " COALESCE(SUM(state = 'LEASED'), 0) AS r, COALESCE(SUM(state = 'RUNNING'), 0) AS a"
            " FROM pulse_tasks WHERE namespace_id = %s AND queue_id = %s",
            (t.namespace_id, qid),
        )
        assert usage is not None and rows is not None
        return {
            "usage": {k: int(v) for k, v in usage.items()},
            "rows": {
                "unfinished_tasks": int(rows["u"]),
                "reservations": int(rows["r"]),
                "active_attempts": int(rows["a"]),
            },
        }

    return await db.read(run)
