"""The stuck-work watchdog: surface tasks that stay too long in one non-terminal state.

A queue's ``stuck_after_ms`` (NULL = off) bounds the time a task may spend in one stay in a
non-terminal state (WAITING, LEASED, RUNNING, NEEDS_REVIEW) — one *state episode*, which
starts at ``state_changed_at``. Each round (:meth:`Watchdog.run_once`):

1. pages through the queues that have a bound (the one cross-namespace scan, of
   ``pulse_queues`` only, keyset-paged);
2. per queue, in ONE short transaction: for each watched state, claims (``FOR UPDATE SKIP
   LOCKED``, oldest first, at most ``watchdog_batch`` per queue) the tasks whose episode began
   before ``now - stuck_after_ms`` (database clock) and that were not surfaced in this
   episode yet (surfaced = ``stuck_at >= state_changed_at`` and ``stuck_reason`` written
   for the current state, see ``pulse/sql/watchdog.sql``); marks each one
   (``stuck_at = now``, ``stuck_reason``: the time and the cause, :mod:`pulse.stuck_causes`)
   with an UPDATE guarded by the same episode
   (state, state_version, not yet surfaced); and, for the marks that matched, writes the raw
   event ``task.stuck`` in the same transaction;
3. after COMMIT counts ``pulse_tasks_stuck_total{state}`` and, at the end of a full round,
   sets the ``pulse_tasks_stuck{state}`` gauge.

It never changes a task's state, ``state_version`` or ``revision`` and writes no result
event: surfacing is an observation for operators (``GET …/tasks?stuck=true``, the event,
the metric), not a decision. A task that changes state starts a new episode, which can be
surfaced again once the bound passes anew; no state-changing UPDATE has to reset the marks.

Safe on many nodes at once: SKIP LOCKED hands concurrent watchdogs disjoint rows, and the
episode guard of the mark makes a task surface once per episode even if two rounds see it
(the second UPDATE matches 0 rows and writes no event). Lock order: only task rows (by
primary key, in the claim) and the append-only events table — no usage, permit or result
stream row — so it cannot wait crosswise with the lock order application resources → queue
→ task/attempt → permit. Settings: ``ORBIT_PULSE_WATCHDOG_INTERVAL_MS`` (default 10 000) and
``ORBIT_PULSE_WATCHDOG_BATCH`` (tasks surfaced per queue per transaction, default 500).
"""

from __future__ import annotations

import asyncio
import logging
from collections import Counter
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from orbit import events as orbit_events
from orbit.ids import id_hex
from orbit.metrics import Registry
from orbit.storage import Database, Tx
from orbit.store.clock import clock_now
from orbit.times import format_time
from pulse import stuck_causes, transitions
from pulse.rounds import run_rounds, settings_from_env
from pulse.store import watchdog as store

log = logging.getLogger("pulse.watchdog")

#: Queues read per page of the cross-namespace queue scan.
QUEUE_PAGE = 500
WATCHED_STATES = store.WATCHED_STATES


@dataclass(frozen=True, slots=True)
class WatchdogSettings:
    """Tunables of the watchdog; ``ORBIT_PULSE_<NAME>`` environment overrides (the pattern of
    :class:`pulse.sessions.WorkerSettings`)."""

    #: Time between rounds (with ±20 % jitter); a round that hit the batch limit on some
    #: queue is followed by the next one at once.
    watchdog_interval_ms: int = 10_000
    #: Tasks surfaced per queue per transaction.
    watchdog_batch: int = 500

    @classmethod
    def from_env(cls, env: dict[str, str] | None = None, **overrides: int) -> WatchdogSettings:
        return settings_from_env(cls, env, overrides)


@dataclass
class WatchdogStats:
    """What one round did."""

    #: Queues with a bound that were examined.
    queues: int = 0
    #: Tasks surfaced, by state.
    surfaced: Counter[str] = field(default_factory=Counter)
    #: Some queue filled its batch: more may be waiting (the loop goes again at once).
    backlog: bool = False
    #: Surfaced tasks still in their episode and past their queue's bound, by state
    #: (only computed when counting is on, see :meth:`Watchdog.run_once`).
    stuck_now: Counter[str] | None = None

    @property
    def total(self) -> int:
        return sum(self.surfaced.values())


def stuck_reason(
    state: str, age_ms: int, stuck_after_ms: int, queue: str, cause: str | None = None
) -> str:
    """The recorded reason, e.g. ``WAITING for 612 s > stuck_after_ms 600000 on queue
    emails: no live worker session takes work from queue emails`` — the time, then the
    cause when one is known (:mod:`pulse.stuck_causes`); at most 255 characters."""
    text = f"{state} for {age_ms // 1000} s > stuck_after_ms {stuck_after_ms} on queue {queue}"
    if cause:
        text += f": {cause}"
    return text if len(text) <= 255 else text[:254] + "…"


def _ms(delta: Any) -> int:
    return int(delta.total_seconds() * 1000)


async def surface_queue(
    db: Database,
    namespace_id: bytes,
    queue_id: bytes,
    stuck_after_ms: int,
    *,
    limit: int = 500,
    now: datetime | None = None,
) -> list[dict[str, Any]]:
    """Surface up to ``limit`` overdue tasks of one queue in one transaction; return the
    surfaced tasks as ``{"id", "state", "reason"}`` (empty when nothing was due). ``now``
    pins the clock (tests); otherwise the database clock decides."""

    async def run(tx: Tx) -> list[dict[str, Any]]:
        t = await clock_now(tx, now)
        claimed: list[dict[str, Any]] = []
        for state in WATCHED_STATES:
            room = limit - len(claimed)
            if room <= 0:
                break
            claimed += await store.claim_overdue(
                tx, namespace_id, queue_id, state, stuck_after_ms, t, room
            )
        if not claimed:
            return []
        causes = await stuck_causes.diagnose(
            tx, namespace_id, queue_id, claimed[0]["queue_name"], claimed, t
        )
        marks = []
        for row in claimed:
            age_ms = _ms(t - row["state_changed_at"])
            cause = causes.get(row["id"])
            reason = stuck_reason(
                row["state"], age_ms, stuck_after_ms, row["queue_name"],
                cause.text if cause else None,
            )  # fmt: skip
            marks.append(
                {
                    "namespace_id": namespace_id,
                    "id": row["id"],
                    "state": row["state"],
                    "state_version": row["state_version"],
                    "reason": reason,
                    "now": t,
                    "_age_ms": age_ms,
                    "_cause": cause,
                }
            )
        counts = await store.mark_many(
            tx, [{k: v for k, v in m.items() if not k.startswith("_")} for m in marks]
        )
        done = [(m, row) for m, row, n in zip(marks, claimed, counts, strict=True) if n == 1]
        if not done:
            return []
        # The raw event, with the data conventions of transitions.record (state,
        # state_version, queue, attempts, attempt_id) — but written directly: this is no state
        # change, so no result event and no terminal hooks (a stuck NEEDS_REVIEW task must not
        # look like a finished one to a workflow).
        await orbit_events.append_events(
            tx,
            namespace_id,
            [
                orbit_events.NewEvent(
                    type=transitions.EVENT_STUCK,
                    subject_kind="task",
                    subject_id=row["id"],
                    data=_event_data(row, m, stuck_after_ms),
                )
                for m, row in done
            ],
            now=t,
        )
        return [{"id": row["id"], "state": row["state"], "reason": m["reason"]} for m, row in done]

    return await db.transaction(run)


def _event_data(row: dict[str, Any], mark: dict[str, Any], stuck_after_ms: int) -> dict[str, Any]:
    data: dict[str, Any] = {
        "state": row["state"],
        "state_version": int(row["state_version"]),
        "queue": row["queue_name"],
        "attempts": int(row["attempts"]),
    }
    if row.get("current_attempt_id") is not None:
        data["attempt_id"] = id_hex(row["current_attempt_id"])
    data.update(
        {
            "reason": mark["reason"],
            "stuck_after_ms": int(stuck_after_ms),
            "age_ms": int(mark["_age_ms"]),
            "state_changed_at": format_time(row["state_changed_at"]),
        }
    )
    cause = mark.get("_cause")
    if cause is not None:
        data["cause"] = cause.code
        if cause.details:
            data["cause_details"] = cause.details
    return data


class Watchdog:
    """The watchdog loop (see the module docstring). Safe on many nodes at once."""

    def __init__(
        self,
        db: Database,
        *,
        settings: WatchdogSettings | None = None,
        metrics: Registry | None = None,
    ) -> None:
        self.db = db
        self.settings = settings or WatchdogSettings.from_env()
        self._metrics = metrics
        if metrics is not None:
            self._surfaced = metrics.counter(
                "pulse_tasks_stuck_total",
                "Tasks surfaced by the stuck-work watchdog, by the state they were stuck in",
                ("state",),
            )
            self._stuck = metrics.gauge(
                "pulse_tasks_stuck",
                "Tasks surfaced as stuck and still in that state past their queue's bound, by "
                "state (this node's last full watchdog round)",
                ("state",),
            )

    async def run_once(
        self, *, now: datetime | None = None, count: bool | None = None
    ) -> WatchdogStats:
        """One round over every queue with a bound. ``now`` pins the clock (tests), else the
        database clock decides. ``count`` (default: when metrics are on) also counts the
        surfaced tasks still stuck per state, for the gauge."""
        counting = self._metrics is not None if count is None else count
        stats = WatchdogStats(stuck_now=Counter() if counting else None)
        batch = self.settings.watchdog_batch
        after_ns, after_id = b"", b""
        while True:

            async def page(tx: Tx, ns: bytes = after_ns, qid: bytes = after_id) -> list[Any]:
                return await store.queue_list(tx, ns, qid, QUEUE_PAGE)

            queues = await self.db.read(page)
            for q in queues:
                stats.queues += 1
                try:
                    surfaced = await surface_queue(
                        self.db, q["namespace_id"], q["id"], int(q["stuck_after_ms"]),
                        limit=batch, now=now,
                    )  # fmt: skip
                except asyncio.CancelledError:
                    raise
                except Exception:
                    log.exception("watchdog failed on queue %s", id_hex(q["id"]))
                    continue
                if len(surfaced) >= batch:
                    stats.backlog = True
                for s in surfaced:
                    stats.surfaced[s["state"]] += 1
                if surfaced:
                    log.warning(
                        "%d task(s) of queue %s surfaced as stuck, e.g. %s: %s",
                        len(surfaced), q["name"], id_hex(surfaced[0]["id"]),
                        surfaced[0]["reason"],
                    )  # fmt: skip
                if stats.stuck_now is not None:
                    stats.stuck_now.update(await self._count(q, now))
            if len(queues) < QUEUE_PAGE:
                break
            after_ns, after_id = queues[-1]["namespace_id"], queues[-1]["id"]
        if self._metrics is not None:
            for state, n in stats.surfaced.items():
                self._surfaced.inc(n, state=state)
            if stats.stuck_now is not None:
                for state in WATCHED_STATES:
                    self._stuck.set(stats.stuck_now.get(state, 0), state=state)
        return stats

    async def _count(self, q: dict[str, Any], now: datetime | None) -> dict[str, int]:
        async def run(tx: Tx) -> dict[str, int]:
            t = await clock_now(tx, now)
            return await store.count_surfaced(
                tx, q["namespace_id"], q["id"], int(q["stuck_after_ms"]), t
            )

        return await self.db.read(run)

    async def run(self, stop: asyncio.Event | None = None) -> None:
        """Watch until ``stop`` is set (or the task is cancelled), every
        ``watchdog_interval_ms`` (with jitter); at once again while there is a backlog."""

        async def round_once() -> bool:
            return bool((await self.run_once()).backlog)

        interval = self.settings.watchdog_interval_ms / 1000
        await run_rounds(round_once, interval, stop, log, "watchdog")
