"""The advancer: consumes the inbox and advances instances. Safe on any number of nodes.

One round (:meth:`Advancer.run_once`):

1. A cross-namespace scan (no locks) lists instances with due inbox events, oldest first
   (``inbox_scan_pending``), plus resumed instances that still have deferred advances
   (``pending_scan_resumable``).
2. For each instance, one transaction: lock the instance row with ``FOR UPDATE SKIP
   LOCKED`` (an instance another node is advancing, or a control request holds, is skipped
   and found again next round), lock its unprocessed events in arrival order, apply the
   deferred advances (when resumed) and then the events with the engine (when a full batch
   of deferred advances was applied, the events wait for a later round: they are newer),
   mark each event processed, write the instance with a CAS on its revision, commit.
3. After COMMIT only: push cancels of running attempts to their workers and wake this node's
   dispatcher for the new tasks.

Why two advancers never advance an instance twice: the instance row lock serialises them;
under it an event is consumed by a guarded UPDATE (``processed_at IS NULL``); and the
instance write is a CAS on the revision read under the lock. Every effect of an event
(steps, activations, waits, tasks, the mark) commits together or not at all.

A failed advance (e.g. a queue quota refusal while creating a task) rolls back; the oldest
unprocessed event of the instance gets ``attempts + 1``, ``last_error`` and a backoff in
``available_at``; later events of that instance wait behind it (order is kept).
"""

from __future__ import annotations

import asyncio
import logging
import random
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import TYPE_CHECKING

import msgspec

from orbit.backoff import backoff_ms
from orbit.business_json import enc_hook
from orbit.errors import OrbitError
from orbit.metrics import Registry
from orbit.storage import Database, Tx
from orbit.store.clock import clock_now
from pulse.hub import push_cancel, wake_queue
from weave.engine import Run
from weave.engine_core import AfterCommit
from weave.inbox import apply_events, apply_pending
from weave.store import inbox as inbox_store
from weave.store import instances as instance_store
from weave.store import pending as pending_store
from weave.types import InboxOutcome, InstanceState

if TYPE_CHECKING:
    from pulse.hub import Notifier

log = logging.getLogger("weave.advancer")

_JSON = msgspec.json.Encoder(decimal_format="number", enc_hook=enc_hook)


@dataclass(frozen=True)
class AdvancerSettings:
    """Tunables (tests shorten them)."""

    #: Seconds between rounds when there was nothing to do (jittered ±20 %).
    poll_s: float = 0.2
    #: Due events read per scan (their instances, de-duplicated, are advanced in the round).
    scan_limit: int = 500
    #: Events (and deferred advances) applied per instance per transaction.
    batch: int = 50
    #: Backoff of a failed advance: ``min(max, initial × 2^(attempts-1))`` milliseconds.
    backoff_initial_ms: int = 1000
    backoff_max_ms: int = 300_000


@dataclass
class AdvanceStats:
    """What one round did."""

    instances: int = 0
    skipped: int = 0
    failed: int = 0
    events: dict[str, int] = field(default_factory=dict)

    @property
    def applied(self) -> int:
        return self.events.get(InboxOutcome.APPLIED.value, 0)

    @property
    def processed(self) -> int:
        return sum(self.events.values())


class Advancer:
    """Advances instances from their inbox. ``run_once()`` for tests; ``run(stop)`` as a loop."""

    def __init__(
        self,
        db: Database,
        *,
        hub: Notifier | None = None,
        metrics: Registry | None = None,
        settings: AdvancerSettings | None = None,
    ) -> None:
        self.db = db
        self.hub = hub
        self.settings = settings or AdvancerSettings()
        self._wake = asyncio.Event()
        self._metrics = metrics
        if metrics is not None:
            self._events = metrics.counter(
                "weave_inbox_events_total", "Inbox events consumed, by outcome", ("outcome",)
            )
            self._failures = metrics.counter(
                "weave_advance_failures_total", "Advances rolled back and retried later"
            )

    def wake(self) -> None:
        """Start the next round now (call after committing a new inbox event)."""
        self._wake.set()

    async def run_once(self, *, now: datetime | None = None) -> AdvanceStats:
        """One round over the instances with due work (see the module docstring)."""
        stats = AdvanceStats()

        async def scan(tx: Tx) -> list[tuple[bytes, bytes]]:
            t = now or await clock_now(tx)
            rows = await inbox_store.inbox_scan_pending(tx, t, self.settings.scan_limit)
            rows += await pending_store.pending_scan_resumable(tx, self.settings.scan_limit)
            seen: dict[tuple[bytes, bytes], None] = {}
            for r in rows:
                seen[(bytes(r["namespace_id"]), bytes(r["instance_id"]))] = None
            return list(seen)

        for namespace_id, instance_id in await self.db.read(scan):
            try:
                counts = await self.advance(namespace_id, instance_id, now=now)
            except asyncio.CancelledError:
                raise
            except Exception as exc:
                stats.failed += 1
                await self._record_failure(namespace_id, instance_id, exc, now)
                continue
            if counts is None:
                stats.skipped += 1
                continue
            stats.instances += 1
            for k, v in counts.items():
                stats.events[k] = stats.events.get(k, 0) + v
                if self._metrics is not None:
                    self._events.inc(v, outcome=k)
        return stats

    async def advance(
        self, namespace_id: bytes, instance_id: bytes, *, now: datetime | None = None
    ) -> dict[str, int] | None:
        """Advance one instance in one transaction; counts of events by outcome, or None
        when another transaction holds the instance (skipped)."""

        async def run(tx: Tx) -> tuple[dict[str, int] | None, AfterCommit | None]:
            t = now or await clock_now(tx)
            inst = await instance_store.instance_get(tx, namespace_id, instance_id, lock="skip")
            if (
                inst is None
                and await instance_store.instance_get(tx, namespace_id, instance_id) is not None
            ):
                return None, None  # held by another advancer or a control request
            rows = await inbox_store.inbox_lock_pending_for_instance(
                tx, namespace_id, instance_id, self.settings.batch
            )
            if inst is None or inst.state != InstanceState.RUNNING:
                # Events for an ended (or unknown) instance are consumed as ignored.
                counts: dict[str, int] = {}
                for ev in rows:
                    if ev.available_at > t:
                        break
                    await inbox_store.inbox_mark_processed_if_pending(
                        tx, namespace_id, ev.id, InboxOutcome.IGNORED.value, t
                    )
                    counts["ignored"] = counts.get("ignored", 0) + 1
                return counts, None
            r = await Run.load(tx, inst, t)
            resumed = await apply_pending(r, self.settings.batch)
            if resumed >= self.settings.batch and r.running:
                # Deferred advances may be left: they are older than every unprocessed event,
                # so the events wait for a later round (order is kept).
                counts = {}
            else:
                counts = await apply_events(r, rows)
            after = await r.save()
            return counts, after

        counts, after = await self.db.transaction(run)
        if after is not None:
            await self.after_commit(namespace_id, after)
        return counts

    async def after_commit(self, namespace_id: bytes, after: AfterCommit) -> None:
        """Push cancels and wake the dispatcher (only ever after COMMIT)."""
        await push_after_commit(self.hub, namespace_id, after)

    async def _record_failure(
        self, namespace_id: bytes, instance_id: bytes, exc: Exception, now: datetime | None
    ) -> None:
        if self._metrics is not None:
            self._failures.inc()
        if isinstance(exc, OrbitError):
            log.warning("advance of instance %s failed: %s", instance_id.hex(), exc)
            err = {"code": exc.code, "message": exc.message}
        else:
            log.exception("advance of instance %s failed", instance_id.hex())
            err = {"code": "internal", "message": f"{type(exc).__name__}: {exc}"}

        async def run(tx: Tx) -> None:
            t = now or await clock_now(tx)
            rows = await inbox_store.inbox_lock_pending_for_instance(
                tx, namespace_id, instance_id, 1
            )
            if not rows:
                return
            head = rows[0]
            delay = backoff_ms(
                head.attempts + 1, self.settings.backoff_initial_ms, self.settings.backoff_max_ms
            )
            delay = int(delay * random.uniform(0.8, 1.0))
            await inbox_store.inbox_record_failure_if_pending(
                tx,
                namespace_id,
                head.id,
                _JSON.encode({**err, "attempt": head.attempts + 1}).decode(),
                t + timedelta(milliseconds=delay),
            )

        try:
            await self.db.transaction(run)
        except Exception:  # the event stays due; the next round tries again
            log.exception("could not record the failed advance of %s", instance_id.hex())

    async def run(self, stop: asyncio.Event) -> None:
        """Advance until ``stop`` is set: a round, then (when idle) a jittered pause."""
        while not stop.is_set():
            try:
                stats = await self.run_once()
                # More may be due at once; an instance held elsewhere is retried next round.
                busy = stats.processed > 0
            except asyncio.CancelledError:
                raise
            except Exception:
                log.exception("advancer round failed")
                busy = False
            if busy:
                await asyncio.sleep(0)
                continue
            await _pause(stop, self._wake, self.settings.poll_s)


async def push_after_commit(hub: Notifier | None, namespace_id: bytes, after: AfterCommit) -> None:
    """Cancels of running attempts to their workers, and a dispatcher wake-up for new tasks
    (no-ops without a hub: workers then learn of a cancel from their next heartbeat)."""
    if hub is None:
        return
    for task_id, attempt_id in after.cancels:
        await push_cancel(hub, namespace_id, task_id, attempt_id)
    for queue_id in sorted(after.queues):
        await wake_queue(hub, namespace_id, queue_id)


async def _pause(stop: asyncio.Event, wake: asyncio.Event, seconds: float) -> None:
    """Sleep ``seconds`` (jittered) or until ``stop`` or ``wake`` is set."""
    waiters = [asyncio.ensure_future(stop.wait()), asyncio.ensure_future(wake.wait())]
    try:
        await asyncio.wait(waiters, timeout=seconds * random.uniform(0.8, 1.2),
                           return_when=asyncio.FIRST_COMPLETED)  # fmt: skip
    finally:
        for w in waiters:
            w.cancel()
        wake.clear()
