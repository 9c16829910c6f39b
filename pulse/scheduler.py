"""The scheduler: turns due schedule fire times into occurrences and tasks, exactly once.

Safe on many nodes at once. Each step is ONE transaction that

1. locks the most overdue unpaused schedule row nobody else holds
   (``SELECT … WHERE paused = 0 AND check_at <= now ORDER BY check_at LIMIT 1 FOR UPDATE
   SKIP LOCKED`` on the ``(paused, check_at)`` index — the one cross-namespace scan of
   schedules, allow-listed in ``tests/sql_guard.py``), then
2. :func:`advance` s it: for every fire time from ``covered_until`` up to now, in order, it
   writes the occurrence (unique per (schedule, UTC fire time)), its task through
   :func:`pulse.submit.submit_in_tx` (owner = the schedule's owner, ``source_kind =
   'schedule'``, ``source_id`` = the occurrence id), the ``schedule.fired`` event, and at the
   end the schedule's ``covered_until`` / ``check_at`` progress.

Everything of one step commits together or not at all, so a crash can never leave a task
without its occurrence, an occurrence without its progress, or fire a time twice: a second
node either skips the locked row or, after the commit, sees the advanced ``covered_until``.

Rules of :func:`advance` (``docs/api/schedules.md`` has worked examples). For a fire time F of
version v (catch-up window W, grace G) judged at ``now``:

* ``now - F <= G`` → fires, on time;
* ``G < now - F <= max(W, G)`` → fires, ``late``;
* ``now - F > max(W, G)`` → skipped. All skipped fire times of one version segment become ONE
  occurrence row: ``fire_at`` = the first skipped time, ``covered_until`` = the exclusive end
  of the skipped range, ``skipped_count`` = how many fire times it covers (counted, never
  iterated), ``reason = 'outside_catchup'``.

Version v governs fire times in ``[published_at(v), published_at(v+1))``: what was due
under the old version fires under it; later times use the new one. ``covered_until`` only
moves forward (to ``now + 1 µs`` once caught up). At most ``batch`` occurrences are written per
transaction; a longer backlog continues in the next step.

``now`` comes from the database clock (``UTC_TIMESTAMP(6)``) unless a clock is injected
(tests): ``Scheduler(db, now=datetime | callable)``.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import random
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import TYPE_CHECKING, Any

from orbit.ids import id_hex
from orbit.metrics import Registry
from orbit.storage import Database, Tx
from orbit.store.clock import clock_now
from pulse.store import schedules as store

if TYPE_CHECKING:
    from pulse.hub import Notifier

from pulse.schedule_advance import (
    DEFAULT_BATCH,
    DEFER_S,
    EVENT_FIRED,
    EVENT_SKIPPED,
    VERSION_WINDOW,
    Advance,
    Clock,
    LoadedTimeline,
    advance,
    load_timeline,
    occurrence_row,
    render_dedup_key,
    task_item,
    timing_of,
)

log = logging.getLogger("pulse.scheduler")

#: When a step fails unexpectedly: look at that schedule again after this long.
ERROR_BACKOFF_S = 30.0


# ------------------------------------------------------------------------------ the loop


@dataclass
class SchedulerStats:
    """One :meth:`Scheduler.run_once` round."""

    steps: int = 0  # schedules worked on (one transaction each)
    fired: int = 0
    late: int = 0
    skipped_rows: int = 0
    skipped_times: int = 0
    deferred: int = 0
    errors: int = 0

    def add(self, a: Advance) -> None:
        self.steps += 1
        self.fired += a.fired
        self.late += a.late
        self.skipped_rows += a.skipped_rows
        self.skipped_times += a.skipped_times
        self.deferred += int(a.deferred)


class Scheduler:
    """The scheduler loop. ``run_once()`` for tests and tools; ``run(stop)`` until cancelled
    or ``stop`` is set. ``now``: a fixed datetime or a callable (tests); None = database clock.
    """

    def __init__(
        self,
        db: Database,
        now: Clock = None,
        *,
        hub: Notifier | None = None,
        metrics: Registry | None = None,
        batch: int = DEFAULT_BATCH,
        max_steps: int = 1000,
        interval_s: float = 1.0,
    ) -> None:
        self.db = db
        self.now = now
        self.hub = hub
        self.batch = batch
        self.max_steps = max_steps
        self.interval_s = interval_s
        self._metrics = metrics
        if metrics is not None:
            self._m_fired = metrics.counter(
                "pulse_schedule_fired_total", "Schedule occurrences that created a task", ("late",)
            )
            self._m_skipped = metrics.counter(
                "pulse_schedule_skipped_total", "Schedule fire times recorded as skipped", ()
            )
            self._m_deferred = metrics.counter(
                "pulse_schedule_deferred_total", "Scheduler rounds stopped by a queue quota", ()
            )
            self._m_errors = metrics.counter(
                "pulse_schedule_errors_total", "Scheduler steps that failed", ()
            )

    def _pinned(self, now: Clock) -> datetime | None:
        clock = now if now is not None else self.now
        if clock is None:
            return None
        return clock() if callable(clock) else clock

    async def step(self, now: Clock = None) -> Advance | None:
        """Claim one due schedule and advance it, in one transaction; None when nothing is
        due. A failing step pushes that schedule's ``check_at`` back by
        :data:`ERROR_BACKOFF_S` (so it cannot block the others) and re-raises."""
        pinned = self._pinned(now)
        claimed: dict[str, Any] = {}

        async def run(tx: Tx) -> Advance | None:
            t = await clock_now(tx, pinned)
            row = await store.schedule_claim_due(tx, t)
            if row is None:
                return None
            claimed.update(row, now=t)
            return await advance(tx, row, t, limit=self.batch)

        try:
            result = await self.db.transaction(run)
        except Exception:
            if claimed:
                await self._back_off(claimed)
            raise
        if result is not None and self.hub is not None:
            from pulse.hub import push_cancel, wake_queue

            for queue_id in sorted(result.new_work):
                await wake_queue(self.hub, claimed["namespace_id"], queue_id)
            for task_id, attempt_id in result.cancel_requested:
                await push_cancel(self.hub, claimed["namespace_id"], task_id, attempt_id)
        return result

    async def _back_off(self, row: dict[str, Any]) -> None:
        async def run(tx: Tx) -> None:
            await store.schedule_defer_if_check(
                tx, row["namespace_id"], row["id"], row["check_at"],
                row["now"] + timedelta(seconds=ERROR_BACKOFF_S),
            )  # fmt: skip

        try:
            await self.db.transaction(run, retries=2)
        except Exception:  # pragma: no cover - best effort
            log.exception("could not back off schedule %s", id_hex(row["id"]))

    async def run_once(self, *, now: Clock = None) -> SchedulerStats:
        """Work on due schedules until none is left (or ``max_steps`` transactions)."""
        stats = SchedulerStats()
        for _ in range(self.max_steps):
            try:
                result = await self.step(now)
            except Exception:
                stats.errors += 1
                log.exception("scheduler step failed")
                if self._metrics is not None:
                    self._m_errors.inc()
                continue
            if result is None:
                break
            stats.add(result)
            if self._metrics is not None:
                if result.fired - result.late:
                    self._m_fired.inc(result.fired - result.late, late="false")
                if result.late:
                    self._m_fired.inc(result.late, late="true")
                if result.skipped_times:
                    self._m_skipped.inc(result.skipped_times)
                if result.deferred:
                    self._m_deferred.inc()
        return stats

    async def run(self, stop: asyncio.Event | None = None) -> None:
        """Run rounds every ``interval_s`` (with jitter) until cancelled or ``stop`` is set;
        a round that hit ``max_steps`` is followed at once by the next."""
        while stop is None or not stop.is_set():
            try:
                stats = await self.run_once()
                if stats.steps >= self.max_steps:
                    continue
            except asyncio.CancelledError:
                raise
            except Exception:  # pragma: no cover - run_once already logs per step
                log.exception("scheduler round failed")
            delay = self.interval_s * random.uniform(0.8, 1.2)
            if stop is None:
                await asyncio.sleep(delay)
            else:
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(stop.wait(), delay)


async def run_forever(
    db: Database,
    interval: float = 1.0,
    *,
    stop: asyncio.Event | None = None,
    hub: Notifier | None = None,
    metrics: Registry | None = None,
) -> None:
    """Run a :class:`Scheduler` on the database clock until cancelled or ``stop`` is set."""
    await Scheduler(db, hub=hub, metrics=metrics, interval_s=interval).run(stop)


__all__ = [
    "DEFAULT_BATCH",
    "DEFER_S",
    "EVENT_FIRED",
    "EVENT_SKIPPED",
    "VERSION_WINDOW",
    "Advance",
    "LoadedTimeline",
    "Scheduler",
    "SchedulerStats",
    "advance",
    "load_timeline",
    "occurrence_row",
    "render_dedup_key",
    "run_forever",
    "task_item",
    "timing_of",
]
