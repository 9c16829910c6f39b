"""Overlap policies of schedules: what a fire time does while the schedule's previous run is
unfinished.

The *previous run* is the task of the schedule's latest scheduled or triggered occurrence
(``pulse_schedules.last_task_id``; backfilled tasks do not count). It is unfinished while it
is WAITING, LEASED, RUNNING or NEEDS_REVIEW (a task under review has not finished: its
effect is uncertain). A version's ``overlap`` decides:

| policy | the previous run is unfinished |
| --- | --- |
| ``allow`` (default) | the fire time creates its task anyway |
| ``skip`` | the fire time is recorded as skipped (reason ``overlap``) |
| ``buffer_one`` | the first such fire time is held back on the schedule row and fires (reason ``buffered``) as soon as the previous run has finished; further ones while one is held are skipped (reason ``overlap``) |
| ``cancel_previous`` | the previous run is cancelled (WAITING/LEASED → CANCELLED, RUNNING → cancel requested) and the fire time creates its task |

The scheduler (:func:`pulse.scheduler.advance`) keeps one :class:`OverlapState` per step:
loaded from the locked schedule row, updated after every fire, written back with the step's
progress. Cancels are applied at the end of the step, as its last write
(:func:`pulse.tasks.cancel_in_tx`), so the lock order holds. A held-back fire time makes the
scheduler look at the schedule again every :data:`BUFFER_POLL_S` until it has fired.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import datetime, timedelta
from enum import StrEnum
from typing import Any

from orbit.storage import Tx
from pulse.store import tasks as task_store

#: How often a schedule holding a buffered fire time is looked at again.
BUFFER_POLL_S = 1.0
#: Task states in which the previous run counts as unfinished.
UNFINISHED = frozenset({"WAITING", "LEASED", "RUNNING", "NEEDS_REVIEW"})
#: Occurrence reasons written by the policies.
REASON_OVERLAP = "overlap"
REASON_BUFFERED = "buffered"


class Decision(StrEnum):
    """What one fire time does."""

    FIRE = "fire"  # create its task (cancel_previous: after cancelling the previous run)
    SKIP = "skip"  # record it as skipped, reason overlap
    BUFFER = "buffer"  # hold it back until the previous run has finished


@dataclass
class OverlapState:
    """The previous run and the held-back fire time of one schedule, during one step."""

    previous_id: bytes | None
    previous_unfinished: bool
    previous_queue_id: bytes | None = None
    buffered_fire_at: datetime | None = None
    buffered_version: int | None = None
    #: Previous runs to cancel at the end of the step (cancel_previous), in order.
    cancel: list[bytes] = field(default_factory=list)

    @classmethod
    async def load(cls, tx: Tx, schedule: dict[str, Any]) -> OverlapState:
        """The state of the LOCKED ``schedule`` row (one task read when it has a previous
        run)."""
        previous = schedule.get("last_task_id")
        row = None
        if previous is not None:
            row = await task_store.task_get(tx, schedule["namespace_id"], previous)
        version = schedule.get("buffered_version")
        return cls(
            previous_id=previous,
            previous_unfinished=row is not None and row["state"] in UNFINISHED,
            previous_queue_id=None if row is None else row["queue_id"],
            buffered_fire_at=schedule.get("buffered_fire_at"),
            buffered_version=None if version is None else int(version),
        )

    def decide(self, policy: str) -> Decision:
        """The decision for a fire time of a version with ``policy``."""
        if policy == "allow" or not self.previous_unfinished:
            return Decision.FIRE
        if policy == "buffer_one" and self.buffered_fire_at is None:
            return Decision.BUFFER
        if policy == "cancel_previous":
            return Decision.FIRE
        return Decision.SKIP

    def buffer(self, fire_at: datetime, version: int) -> None:
        """Hold ``fire_at`` back (buffer_one)."""
        self.buffered_fire_at = fire_at
        self.buffered_version = version

    def release_due(self) -> bool:
        """True when a held-back fire time may fire now (the previous run has finished)."""
        return self.buffered_fire_at is not None and not self.previous_unfinished

    def released(self) -> None:
        """The held-back fire time has fired."""
        self.buffered_fire_at = None
        self.buffered_version = None

    def fired(self, policy: str, task: dict[str, Any]) -> None:
        """A fire time of a version with ``policy`` created (or, deduplicated, matched)
        ``task``: it becomes the previous run; under cancel_previous the run it replaces is
        queued for cancelling."""
        if (
            policy == "cancel_previous"
            and self.previous_unfinished
            and self.previous_id is not None
            and self.previous_id != task["id"]
            and self.previous_id not in self.cancel
        ):
            self.cancel.append(self.previous_id)
        self.previous_id = task["id"]
        self.previous_unfinished = task["state"] in UNFINISHED
        self.previous_queue_id = task["queue_id"]

    def check_at(self, next_fire: datetime | None, now: datetime) -> datetime | None:
        """When the scheduler must look again: the next fire time, or sooner while a fire
        time is held back."""
        if self.buffered_fire_at is None:
            return next_fire
        poll = now + timedelta(seconds=BUFFER_POLL_S)
        return poll if next_fire is None else min(next_fire, poll)


__all__ = [
    "BUFFER_POLL_S",
    "REASON_BUFFERED",
    "REASON_OVERLAP",
    "UNFINISHED",
    "Decision",
    "OverlapState",
]
