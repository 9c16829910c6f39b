"""Durable timers: turn due waits into ``timer_fired`` inbox events. Safe on many nodes.

Timers are rows of ``weave_waits`` with a ``due_at`` (sleeps, signal-wait timeouts, poll
intervals), written by the advance that opened them, so they survive restarts: nothing is
held in memory. One round (:meth:`TimerLoop.run_once`) is one transaction:

* claim up to ``limit`` OPEN waits whose ``due_at`` passed and whose event is not written
  yet (``notified_at IS NULL``), oldest first, **across all namespaces**, with
  ``FOR UPDATE SKIP LOCKED`` (``wait_claim_due``; allow-listed in ``tests/sql_guard.py``:
  it is the one scan that must see every namespace, served by ``ix_weave_waits_due``);
* for each, write the ``timer_fired`` inbox event (source id = the wait id, so a second
  write is a no-op) and stamp ``notified_at`` — by the wait's ``(namespace_id, id)`` key.

The wait stays OPEN until the advancer applies the event (FIRED), unless a signal matched
it first: then the event is ignored. ``now`` is the database clock (tests pin it).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import random
from dataclasses import dataclass
from datetime import datetime

from orbit.storage import Database, Tx
from orbit.store.clock import clock_now
from weave.inbox import write_event
from weave.store import waits as wait_store
from weave.types import InboxKind

log = logging.getLogger("weave.timers")


@dataclass(frozen=True)
class TimerSettings:
    #: Seconds between rounds when nothing was due (jittered ±20 %).
    poll_s: float = 0.25
    #: Waits claimed per transaction.
    batch: int = 200


class TimerLoop:
    """Fires due timers. ``run_once()`` for tests; ``run(stop)`` as a loop."""

    def __init__(
        self, db: Database, *, settings: TimerSettings | None = None, on_fired: object = None
    ) -> None:
        self.db = db
        self.settings = settings or TimerSettings()
        #: Called (no arguments) after a round wrote events, e.g. ``Advancer.wake``.
        self.on_fired = on_fired

    async def run_once(self, *, now: datetime | None = None) -> int:
        """Write the events of every due timer (batch by batch); the number written."""
        total = 0
        while True:
            n = await self.db.transaction(lambda tx: self._fire(tx, now))
            total += n
            if n < self.settings.batch:
                break
        if total and callable(self.on_fired):
            self.on_fired()
        return total

    async def _fire(self, tx: Tx, now: datetime | None) -> int:
        t = now or await clock_now(tx)
        due = await wait_store.wait_claim_due(tx, t, self.settings.batch)
        for w in due:
            await write_event(
                tx,
                w.namespace_id,
                w.instance_id,
                InboxKind.TIMER_FIRED,
                w.id,
                step_path=w.step_path,
                data={"wait_kind": w.kind},
                now=t,
            )
            await wait_store.wait_mark_notified_if_open(tx, w.namespace_id, w.id, t)
        return len(due)

    async def run(self, stop: asyncio.Event) -> None:
        """Fire timers until ``stop`` is set."""
        while not stop.is_set():
            try:
                await self.run_once()
            except asyncio.CancelledError:
                raise
            except Exception:
                log.exception("timer round failed")
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(stop.wait(), self.settings.poll_s * random.uniform(0.8, 1.2))
