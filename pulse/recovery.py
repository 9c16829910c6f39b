"""The recovery loop: expire sessions and leases, and decide what happens to their attempts.

Each round (:meth:`Recovery.run_once`):

1. **Sessions** whose ``expires_at`` passed (no heartbeat for ``lease_ms``) become EXPIRED;
   their stream on this node is closed, and every attempt they hold is recovered at once
   (reason ``session_expired``), whatever its own lease says.
2. **Offers** (OFFERED attempts) whose lease passed become RELEASED and their task returns
   to WAITING — nothing ran, so nothing is uncertain and ``attempts`` is unchanged.
3. **Running attempts** whose lease passed become LOST (evidence ``lost``). Their task:
   retried after the backoff when ``retry_safe`` and ``attempts < max_attempts``; FAILED
   ``attempts_exhausted`` when ``retry_safe`` and that was its last attempt (a poison task;
   nothing is uncertain about an idempotent task); otherwise NEEDS_REVIEW with
   ``effect_uncertain = 1`` (result event ``task.needs_review``). A task whose cancel was
   requested ends CANCELLED when retry-safe, NEEDS_REVIEW otherwise.
   (A session its worker closes is handled the same way by :func:`pulse.sessions.close_session`.)
4. The deadline sweep of the tasks side (``pulse.tasks.expire_deadlines_once``).

Safe on many nodes at once: candidates are read without locks, then each is decided in its
own transaction with the rows locked in the lock order and every condition re-checked
(state, lease, session) under the locks; guarded updates make a second node's attempt a
no-op. The scans are the allow-listed cross-namespace queries (docs/api/workers.md):
``pulse_worker_sessions (state, expires_at)`` and ``pulse_attempts (state, lease_expires_at)``.
"""

from __future__ import annotations

import asyncio
import logging
from dataclasses import dataclass
from datetime import datetime

from orbit import events as orbit_events
from orbit.ids import id_hex
from orbit.metrics import Registry
from orbit.storage import Database, Tx
from orbit.store.clock import clock_now
from pulse import transitions
from pulse.attempts import Change, lock_chain, lose_running, release_offer
from pulse.hub import Hub
from pulse.rounds import run_rounds
from pulse.sessions import EVENT_SESSION_EXPIRED, WorkerSettings
from pulse.store import attempts as store
from pulse.store import sessions as session_store

log = logging.getLogger("pulse.recovery")

REASON_OFFER_EXPIRED = "offer_expired"
REASON_LEASE_EXPIRED = "lease_expired"
REASON_SESSION_EXPIRED = "session_expired"
REASON_DISCONNECTED = "disconnected"


@dataclass
class RecoveryStats:
    """What one round did."""

    sessions_expired: int = 0
    offers_released: int = 0
    attempts_lost: int = 0
    deadlines_expired: int = 0

    def total(self) -> int:
        return (
            self.sessions_expired
            + self.offers_released
            + self.attempts_lost
            + self.deadlines_expired
        )


async def recover_attempt(
    db: Database,
    namespace_id: bytes,
    attempt_id: bytes,
    *,
    reason: str,
    session_gone: bool = False,
    offers_only: bool = False,
    now: datetime | None = None,
) -> str | None:
    """Decide one attempt in its own transaction; return ``"released"``, ``"lost"`` or None
    (nothing to do: it moved on, or its lease has not passed).

    ``session_gone``: recover it whatever its lease says, provided its session is not ACTIVE
    any more (re-checked under the locks). ``offers_only``: release an OFFERED attempt of a
    disconnected session, never touch a RUNNING one (the worker may reconnect and report).
    """

    async def run(tx: Tx) -> tuple[str | None, list[Change]]:
        locked = await lock_chain(tx, namespace_id, attempt_id, now)
        if locked is None:
            return None, []
        task, attempt, t = locked
        if attempt["state"] not in ("OFFERED", "RUNNING"):
            return None, []
        if offers_only and attempt["state"] != "OFFERED":
            return None, []
        due = attempt["lease_expires_at"] <= t
        if not due and session_gone:
            session = await session_store.session_get(tx, namespace_id, attempt["session_id"])
            due = session is None or session["state"] != "ACTIVE" or session["expires_at"] <= t
        if not due and not offers_only:
            return None, []
        if attempt["state"] == "OFFERED":
            changes = await release_offer(tx, namespace_id, task, attempt, t, reason)
            outcome = "released"
        else:
            changes = await lose_running(tx, namespace_id, task, attempt, t, reason)
            outcome = "lost"
        await transitions.record_many(tx, namespace_id, changes, now=t)
        return outcome, changes

    outcome, _ = await db.transaction(run)
    return outcome


async def release_session_offers(
    db: Database, namespace_id: bytes, session_id: bytes, *, now: datetime | None = None
) -> int:
    """Release the OFFERED attempts of a session whose stream ended (its tasks return to
    WAITING for other workers at once). RUNNING attempts are left to heartbeats and leases."""

    async def run(tx: Tx) -> list[bytes]:
        rows = await session_store.session_list_held(tx, namespace_id, session_id, 10_000)
        return [r["id"] for r in rows if r["state"] == "OFFERED"]

    released = 0
    for attempt_id in await db.read(run):
        if await recover_attempt(
            db, namespace_id, attempt_id, reason=REASON_DISCONNECTED, offers_only=True, now=now
        ):
            released += 1
    return released


class Recovery:
    """The recovery loop (see the module docstring). Safe on many nodes at once."""

    def __init__(
        self,
        db: Database,
        hub: Hub | None = None,
        *,
        settings: WorkerSettings | None = None,
        metrics: Registry | None = None,
    ) -> None:
        self.db = db
        self.hub = hub
        self.settings = settings or (hub.settings if hub is not None else WorkerSettings())
        self._metrics = metrics
        if metrics is not None:
            self._recovered = metrics.counter(
                "pulse_recovered_total", "Sessions and attempts recovered, by kind", ("kind",)
            )

    async def run_once(self, *, now: datetime | None = None) -> RecoveryStats:
        """One round; ``now`` pins the clock (tests), else the database clock decides."""
        stats = RecoveryStats()
        limit = self.settings.recovery_batch
        t = now if now is not None else await self.db.now()

        async def expired_sessions(tx: Tx) -> list[dict[str, bytes]]:
            return await session_store.session_list_expired(tx, t, limit)

        for row in await self.db.read(expired_sessions):
            if await self._expire_session(row["namespace_id"], row["id"], now):
                stats.sessions_expired += 1
                ns, sid = row["namespace_id"], row["id"]
                for attempt_id in await _held(self.db, ns, sid):
                    outcome = await recover_attempt(
                        self.db, ns, attempt_id, reason=REASON_SESSION_EXPIRED,
                        session_gone=True, now=now,
                    )  # fmt: skip
                    await self._count(stats, outcome, attempt_id)

        for state, reason in (("OFFERED", REASON_OFFER_EXPIRED), ("RUNNING", REASON_LEASE_EXPIRED)):

            async def expired(tx: Tx, state: str = state) -> list[dict[str, bytes]]:
                return await store.attempt_list_expired(tx, state, t, limit)

            for row in await self.db.read(expired):
                outcome = await recover_attempt(
                    self.db, row["namespace_id"], row["id"], reason=reason, now=now
                )
                await self._count(stats, outcome, row["id"], row["namespace_id"], row["task_id"])

        stats.deadlines_expired = await _expire_deadlines(self.db, limit, now)
        if self._metrics is not None:
            for kind, n in (
                ("session", stats.sessions_expired),
                ("offer", stats.offers_released),
                ("lost", stats.attempts_lost),
                ("deadline", stats.deadlines_expired),
            ):
                if n:
                    self._recovered.inc(n, kind=kind)
        if stats.offers_released and self.hub is not None:
            self.hub.notify_new_work()
        return stats

    async def _count(
        self,
        stats: RecoveryStats,
        outcome: str | None,
        attempt_id: bytes,
        namespace_id: bytes | None = None,
        task_id: bytes | None = None,
    ) -> None:
        if outcome == "released":
            stats.offers_released += 1
        elif outcome == "lost":
            stats.attempts_lost += 1
            if self.hub is not None and namespace_id is not None and task_id is not None:
                # A worker still connected here stops the handler; its late report becomes
                # evidence.
                await self.hub.request_cancel(namespace_id, task_id, attempt_id, "lease_expired")
        if outcome is not None and self.hub is not None:
            self.hub.forget(attempt_id)

    async def _expire_session(
        self, namespace_id: bytes, session_id: bytes, now: datetime | None
    ) -> bool:
        async def run(tx: Tx) -> bool:
            t = await clock_now(tx, now)
            if not await session_store.session_expire_if_due(tx, namespace_id, session_id, t):
                return False
            await orbit_events.append_event(
                tx, namespace_id, EVENT_SESSION_EXPIRED, "worker_session", session_id, {}, now=t
            )
            return True

        expired = await self.db.transaction(run)
        if expired:
            log.info("worker session %s expired", id_hex(session_id))
            if self.hub is not None:
                await self.hub.close_session(namespace_id, session_id)
        return expired

    async def run(self, stop: asyncio.Event | None = None) -> None:
        """Recover until ``stop`` is set (or the task is cancelled), every
        ``recovery_interval_ms`` (with jitter); at once again while there is a backlog."""

        async def round_once() -> bool:
            # A full batch means a backlog: go again at once.
            return (await self.run_once()).total() >= self.settings.recovery_batch

        interval = self.settings.recovery_interval_ms / 1000
        await run_rounds(round_once, interval, stop, log, "recovery")


async def _held(db: Database, namespace_id: bytes, session_id: bytes) -> list[bytes]:
    async def run(tx: Tx) -> list[bytes]:
        rows = await session_store.session_list_held(tx, namespace_id, session_id, 10_000)
        return [r["id"] for r in rows]

    return await db.read(run)


async def _expire_deadlines(db: Database, limit: int, now: datetime | None) -> int:
    """The tasks side's deadline sweep, when it exists."""
    try:
        from pulse import tasks
    except ImportError:  # pragma: no cover - the tasks side is always installed
        return 0
    sweep = getattr(tasks, "expire_deadlines_once", None)
    if sweep is None:
        return 0
    return int(await sweep(db, limit, now=now))
