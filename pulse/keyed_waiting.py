"""Keyed tasks waiting for a worker that takes them, told to a session that does not.

A session created with ``concurrency_keys: false`` is never offered a task that carries a
``concurrency_key``. So that its worker can say why such tasks wait (docs/api/workers.md),
the server tells it which of its queues have keyed tasks among their next due tasks:

* at session creation, ``keyed_waiting`` in the answer (:func:`keyed_waiting_queues`, in
  the creating transaction);
* while its stream lives, at most every ``keyed_check_ms`` (``ORBIT_PULSE_KEYED_CHECK_MS``,
  default 60 s), ``keyed_waiting`` on a ``heartbeat_ok`` — present only when such tasks wait
  (:class:`KeyedWaitingCheck`), so keyed work submitted after the worker connected is told
  too.

Each check is one bounded read per queue of the session (the first 1,000 WAITING tasks in
dispatch order, ``session_keyed_waiting``), outside any state change: a hint for the
worker's log, never a decision.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING

from orbit.storage import Database, Tx
from pulse.store import sessions as store

if TYPE_CHECKING:  # pulse.sessions uses this module at session creation
    from pulse.sessions import QueueRef, SessionInfo


async def keyed_waiting_queues(
    tx: Tx, namespace_id: bytes, queues: Sequence[tuple[str, bytes]]
) -> list[str]:
    """The names of ``queues`` (name, id) with keyed tasks among their next due tasks."""
    return [
        name for name, qid in queues if await store.session_keyed_waiting(tx, namespace_id, qid)
    ]


class KeyedWaitingCheck:
    """The stream's periodic check: :meth:`due` says when the next heartbeat answer should
    carry ``keyed_waiting``; :meth:`queues` reads it. Nothing for a session that takes keyed
    tasks. The first check comes one interval after the stream opened (session creation has
    just told the worker)."""

    def __init__(
        self,
        info: SessionInfo,
        queues: Sequence[QueueRef],
        interval_ms: int,
        *,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._namespace_id = info.namespace_id
        self._queues = [(q.name, q.id) for q in queues]
        self._enabled = not info.concurrency_keys and bool(self._queues) and interval_ms > 0
        self._interval_s = interval_ms / 1000.0
        self._clock = clock
        self._next = clock() + self._interval_s

    def due(self) -> bool:
        return self._enabled and self._clock() >= self._next

    async def queues(self, db: Database) -> list[str]:
        """The session's queues where keyed tasks wait (read now; the next check is one
        interval later)."""
        self._next = self._clock() + self._interval_s

        async def run(tx: Tx) -> list[str]:
            return await keyed_waiting_queues(tx, self._namespace_id, self._queues)

        return await db.read(run)
