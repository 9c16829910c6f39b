"""Queue depth on /metrics: tasks per queue and state, and the wait of the oldest waiting task.

* ``pulse_queue_tasks{application, namespace, queue, state}`` for ``WAITING``, ``LEASED``,
  ``RUNNING`` and ``NEEDS_REVIEW``;
* ``pulse_queue_oldest_waiting_seconds{application, namespace, queue}``.

Computed by a background refresh (:meth:`orbit.metrics.Registry.run_refresh`, every
``ORBIT_METRICS_REFRESH_S``), never on a scrape, and never by scanning tasks: LEASED and
RUNNING are the queue's live usage counters (offered and running attempts, kept in the same
transaction as every task change), NEEDS_REVIEW is an index range counted up to
``review_cap``, WAITING is the rest of the unfinished count, and the oldest wait is read from
the head of the queue's WAITING range of the fair index (at most ``head`` index entries,
by fairness subject, each in dispatch order). Only the
``max_queues`` queues with the most unfinished tasks are exported (``ORBIT_METRICS_MAX_QUEUES``,
default 100), which bounds both the refresh's work and the labels' cardinality; a queue
with nothing unfinished is not exported.
"""

from __future__ import annotations

import os
from collections.abc import Coroutine
from datetime import datetime
from typing import Any

from orbit.metrics import Registry
from orbit.storage import Database, Tx
from pulse.store import queue_depth as store

#: Queues exported (the ones with the most unfinished tasks).
MAX_QUEUES = 100
#: NEEDS_REVIEW tasks counted per queue at most.
REVIEW_CAP = 10_000
#: Fair-index entries looked at for the oldest waiting task.
HEAD = 1_000
STATES = ("WAITING", "LEASED", "RUNNING", "NEEDS_REVIEW")
LABELS = ("application", "namespace", "queue")


class QueueGauges:
    """The queue-depth refresher (see the module docstring)."""

    def __init__(
        self,
        registry: Registry,
        db: Database,
        *,
        max_queues: int | None = None,
        review_cap: int = REVIEW_CAP,
        head: int = HEAD,
    ) -> None:
        self.db = db
        if max_queues is None:
            max_queues = int(os.environ.get("ORBIT_METRICS_MAX_QUEUES", str(MAX_QUEUES)))
        self.max_queues = max_queues
        self.review_cap = review_cap
        self.head = head
        self.tasks = registry.gauge(
            "pulse_queue_tasks",
            "Unfinished tasks per queue and state (the queues with the most unfinished tasks)",
            (*LABELS, "state"),
        )
        self.oldest = registry.gauge(
            "pulse_queue_oldest_waiting_seconds",
            "Seconds the oldest due WAITING task of the queue has waited",
            LABELS,
        )

    async def refresh(self, *, now: datetime | None = None) -> None:
        """Read the top queues and set both gauges (replacing the previous label sets)."""

        async def run(tx: Tx) -> list[tuple[store.DepthRow, int, float]]:
            top = await store.queue_depth_top(tx, self.max_queues)
            if not top:
                return []
            reads: list[Coroutine[Any, Any, float]] = []
            for q in top:
                reads.append(
                    store.queue_depth_needs_review_capped(
                        tx, q.namespace_id, q.queue_id, self.review_cap
                    )
                )
                reads.append(
                    store.queue_depth_oldest_waiting(tx, q.namespace_id, q.queue_id, self.head, now)
                )
            got = await tx.pipeline(*reads)
            return [(q, int(got[2 * i]), float(got[2 * i + 1])) for i, q in enumerate(top)]

        rows = await self.db.read(run)
        self.tasks.clear()
        self.oldest.clear()
        for q, review, oldest in rows:
            labels = {"application": q.application, "namespace": q.namespace, "queue": q.queue}
            leased, running = q.reservations, q.active_attempts
            waiting = max(0, q.unfinished_tasks - leased - running - review)
            for state, n in (
                ("WAITING", waiting),
                ("LEASED", leased),
                ("RUNNING", running),
                ("NEEDS_REVIEW", review),
            ):
                self.tasks.set(n, labels, state=state)
            self.oldest.set(round(oldest, 6), labels)


def install(registry: Registry, db: Database) -> QueueGauges:
    """Register the queue-depth refresher once per registry; return it."""
    return registry.refreshing("pulse_queue_tasks", lambda: QueueGauges(registry, db))
