"""Group commit: requests that arrive at this node while a transaction is in flight are
applied together in the next one.

    batcher = GroupCommit(apply_many, max_batch=64)
    outcome = await batcher.submit(namespace_id, item)   # the item's own result, or raises

For each key (a namespace: the hot rows — application resources, queue usage, result stream —
belong to one) at most ONE batch is in flight on this node. The first item after a quiet
spell is applied at once, alone (no added latency when idle); items that arrive while it
runs queue up and go together in the next batch (up to ``max_batch``). So under load one
transaction locks the hot rows once for many items, instead of every item queueing on the
row locks for its own transaction — the classic group commit of databases, one level up.

``apply(key, items)`` runs the items in one transaction and returns one outcome per item, in
order: a value, or an exception *instance* for an item that failed on its own (a stale token
fails only that item). When ``apply`` itself raises — the transaction as a whole failed — and
the batch has more than one item, each item is re-applied alone so one poisoned item cannot
fail the others (``isolate`` decides which errors allow that: never an unknown commit
outcome, which must reach every caller). A single item gets the exception.

An item may be submitted with a ``linger_s``: a round that would start with it waits that
long (or until an item with an earlier deadline arrives, and never past any queued item's
deadline) so that items arriving meanwhile join it. Heartbeats of idle sessions use it
(:meth:`WorkerBatches.heartbeat`): they come on each session's own clock, spread out, and
without a linger each would be its own locking transaction; with it a node of many idle
sessions commits a few heartbeat rounds a second, whatever its number of sessions.

Nothing here is durable or shared: the database stays the only coordinator. The queue is
bounded (``max_pending`` items in total; :meth:`submit` waits for room: backpressure). A
caller that stops waiting (cancelled) does not cancel its item: it may still be applied, as
any request whose reply is lost; receipts and fencing tokens make that safe.
"""

from __future__ import annotations

import asyncio
import contextlib
import contextvars
import logging
import os
from collections import deque
from collections.abc import Awaitable, Callable, Hashable, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Generic, TypeVar

from orbit.shards import shard_group
from orbit.storage import OutcomeUnknown

if TYPE_CHECKING:
    from pulse.heartbeat_round import HeartbeatItem
    from pulse.hub import Hub

log = logging.getLogger("pulse.batcher")

K = TypeVar("K", bound=Hashable)
I = TypeVar("I")  # noqa: E741 - the item type
R = TypeVar("R")

Apply = Callable[[K, list[I]], Awaitable[Sequence[R | BaseException]]]


def isolate_unless_unknown(exc: BaseException) -> bool:
    """Default ``isolate``: re-apply items one by one after any failure except an unknown
    commit outcome (the batch may have committed: every caller must re-read or re-send)."""
    return not isinstance(exc, OutcomeUnknown)


@dataclass
class BatchStats:
    """What the batcher did (for /metrics and the bench)."""

    batches: int = 0
    items: int = 0
    largest: int = 0
    isolated: int = 0  # batches that failed whole and were re-applied item by item
    sizes: dict[int, int] = field(default_factory=dict)  # batch size → count (capped keys)

    def observe(self, n: int) -> None:
        self.batches += 1
        self.items += n
        self.largest = max(self.largest, n)
        bucket = 1 if n <= 1 else 2 ** (n - 1).bit_length()
        self.sizes[bucket] = self.sizes.get(bucket, 0) + 1


@dataclass(eq=False)
class _Entry(Generic[I, R]):
    item: I
    future: asyncio.Future[R]
    settled: bool = False
    due: float = 0.0  # loop time by which a round must take it (its linger's end)


class GroupCommit(Generic[K, I, R]):
    """Per-key group commit of items through ``apply`` (see the module docstring)."""

    def __init__(
        self,
        apply: Apply[K, I, R],
        *,
        max_batch: int = 64,
        max_pending: int = 4096,
        isolate: Callable[[BaseException], bool] = isolate_unless_unknown,
        name: str = "batch",
    ) -> None:
        if max_batch < 1 or max_pending < 1:
            raise ValueError("max_batch and max_pending must be >= 1")
        self._apply = apply
        self.max_batch = max_batch
        self.max_pending = max_pending
        self._isolate = isolate
        self.name = name
        self._queues: dict[K, deque[_Entry[I, R]]] = {}
        self._running: dict[K, asyncio.Task[None]] = {}
        #: Rounds waiting out a linger: set to make them look at the deadlines again.
        self._lingering: dict[K, asyncio.Event] = {}
        self._slots = asyncio.Semaphore(max_pending)
        self.stats = BatchStats()

    def pending(self) -> int:
        """Items queued or in flight."""
        return self.max_pending - self._slots._value  # a Semaphore keeps its count there

    async def submit(self, key: K, item: I, *, linger_s: float = 0.0) -> R:
        """Apply ``item`` with whatever else is queued for ``key``; its own outcome. With
        ``linger_s``, a round that starts with it waits up to that long for more items."""
        await self._slots.acquire()
        loop = asyncio.get_running_loop()
        future: asyncio.Future[R] = loop.create_future()
        due = loop.time() + linger_s if linger_s > 0 else 0.0
        self._queues.setdefault(key, deque()).append(_Entry(item, future, due=due))
        kick = self._lingering.get(key)
        if kick is not None:
            kick.set()
        if key not in self._running:
            # A round is the node's work, for every tenant in it: it runs in a fresh context
            # (no tenant: the pool's fair gate does not charge it to whoever came first).
            task = asyncio.create_task(
                self._drain(key), name=f"{self.name}-drain", context=contextvars.Context()
            )
            self._running[key] = task
        return await future

    async def _drain(self, key: K) -> None:
        queue = self._queues[key]
        batch: list[_Entry[I, R]] = []
        try:
            while queue:
                await self._linger(key, queue)
                batch = [queue.popleft() for _ in range(min(len(queue), self.max_batch))]
                await self._run(key, batch)
                batch = []
        except BaseException as exc:
            # Cancelled (shutdown) or a bug: nobody may wait forever. The batch in flight
            # may or may not have committed: say so; the queued ones never ran.
            unknown = OutcomeUnknown(f"{self.name}: stopped while applying ({exc!r})")
            for entry in batch:
                self._settle(entry, unknown)
            while queue:
                self._settle(queue.popleft(), OutcomeUnknown(f"{self.name}: stopped"))
            if not isinstance(exc, Exception):  # CancelledError, KeyboardInterrupt...
                raise
            log.exception("%s: batch loop failed", self.name)
        finally:
            del self._running[key]
            if not queue:
                self._queues.pop(key, None)

    async def _linger(self, key: K, queue: deque[_Entry[I, R]]) -> None:
        """Wait until the earliest deadline of the queued items (at once when one has none),
        or until a full batch is queued."""
        loop = asyncio.get_running_loop()
        while len(queue) < self.max_batch:
            left = min(e.due for e in queue) - loop.time()
            if left <= 0:
                return
            kick = self._lingering[key] = asyncio.Event()
            try:
                with contextlib.suppress(TimeoutError):
                    async with asyncio.timeout(left):
                        await kick.wait()
            finally:
                del self._lingering[key]

    async def _run(self, key: K, batch: list[_Entry[I, R]]) -> None:
        self.stats.observe(len(batch))
        try:
            outcomes = await self._apply(key, [e.item for e in batch])
            if len(outcomes) != len(batch):  # pragma: no cover - a bug in apply
                raise RuntimeError(f"{self.name}: {len(outcomes)} outcomes for {len(batch)} items")
        except asyncio.CancelledError:
            raise
        except Exception as exc:
            if len(batch) > 1 and self._isolate(exc):
                self.stats.isolated += 1
                log.info("%s: batch of %d failed (%r); applying items alone", self.name,
                         len(batch), exc)  # fmt: skip
                for entry in batch:
                    await self._run(key, [entry])
                return
            outcomes = [exc] * len(batch)
        for entry, outcome in zip(batch, outcomes, strict=True):
            self._settle(entry, outcome)

    def _settle(self, entry: _Entry[I, R], outcome: R | BaseException) -> None:
        if entry.settled:
            return
        entry.settled = True
        self._slots.release()
        if entry.future.done():  # the caller stopped waiting
            return
        if isinstance(outcome, BaseException):
            entry.future.set_exception(outcome)
        else:
            entry.future.set_result(outcome)

    async def close(self) -> None:
        """Cancel the batch loops (queued items fail with OutcomeUnknown)."""
        tasks = list(self._running.values())
        for t in tasks:
            t.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)


class WorkerBatches:
    """This node's rounds of worker messages: ``start``, result reports
    (``complete``/``fail``/``cancelled``) and heartbeats, each through their own
    :class:`GroupCommit`, keyed
    by shard group (:func:`orbit.shards.shard_group`) — so one transaction in flight per
    node and stage takes the starts (or reports) of every namespace that arrived meanwhile
    (:mod:`pulse.start_round`, :mod:`pulse.report_round`, :mod:`pulse.heartbeat_round`).
    Used by the worker stream and the
    HTTP fallback (pulse/http/workers.py).

    ``ORBIT_PULSE_GROUP_COMMIT=0`` turns batching off (every message its own transaction,
    for comparisons); ``ORBIT_PULSE_BATCH_MAX`` sets the largest round (64).

    A heartbeat that lists no attempts (an idle session's keep-alive) lingers: its round
    waits up to ``ORBIT_PULSE_HEARTBEAT_LINGER_MS`` (250), at most a twentieth of the
    session's heartbeat interval, for the heartbeats of other sessions — the session's
    lease (``lease_ms``, at least three heartbeat intervals) is extended that much later,
    never shorter. Heartbeats that list attempts, and those over HTTP (the fallback, which
    a client sends one at a time), are applied at once.
    """

    def __init__(
        self,
        db: Any,
        *,
        max_batch: int | None = None,
        enabled: bool | None = None,
    ) -> None:
        from pulse.heartbeat_round import heartbeat_round
        from pulse.report_round import report_round
        from pulse.start_round import start_round

        self.db = db
        if enabled is None:
            enabled = os.environ.get("ORBIT_PULSE_GROUP_COMMIT", "1") != "0"
        if max_batch is None:
            max_batch = int(os.environ.get("ORBIT_PULSE_BATCH_MAX", "64"))
        self.enabled = enabled
        size = max_batch if enabled else 1
        linger_ms = int(os.environ.get("ORBIT_PULSE_HEARTBEAT_LINGER_MS", "250"))
        #: Longest linger of an idle session's heartbeat (seconds; 0 without batching).
        self.heartbeat_linger_s = max(0, linger_ms) / 1000 if enabled else 0.0
        self.starts: GroupCommit[int, tuple[bytes, bytes, bytes], Any] = GroupCommit(
            lambda _group, items: start_round(db, items), max_batch=size, name="starts"
        )
        self.reports: GroupCommit[int, tuple[bytes, Any], Any] = GroupCommit(
            lambda _group, items: report_round(db, items), max_batch=size, name="reports"
        )
        self.heartbeats: GroupCommit[int, Any, Any] = GroupCommit(
            lambda _group, items: heartbeat_round(db, items), max_batch=size, name="heartbeats"
        )

    async def start(self, namespace_id: bytes, session_id: bytes, attempt_id: bytes) -> Any:
        """:func:`pulse.attempts.start`, in this node's next start round."""
        return await self.starts.submit(
            shard_group(namespace_id), (namespace_id, session_id, attempt_id)
        )

    async def report(self, namespace_id: bytes, rep: Any) -> Any:
        """:func:`pulse.attempts.report`, in this node's next report round (raises the
        item's own error)."""
        return await self.reports.submit(shard_group(namespace_id), (namespace_id, rep))

    async def heartbeat(
        self,
        namespace_id: bytes,
        session_id: bytes,
        attempt_ids: Any,
        progress: Any = None,
        *,
        heartbeat_ms: int = 0,
    ) -> Any:
        """:func:`pulse.attempts.heartbeat`, in this node's next heartbeat round (raises
        :class:`~pulse.attempts.SessionGone` for its own session); ``progress``: checked
        documents by attempt id (pulse/progress.py); ``heartbeat_ms``: the session's
        heartbeat interval (an idle session's heartbeat lingers a twentieth of it, at most
        :attr:`heartbeat_linger_s`; 0: none)."""
        ids = list(attempt_ids)
        item: HeartbeatItem = (
            (namespace_id, session_id, ids, progress)
            if progress
            else (namespace_id, session_id, ids)
        )
        linger = 0.0 if ids else min(self.heartbeat_linger_s, heartbeat_ms / 20_000)
        return await self.heartbeats.submit(shard_group(namespace_id), item, linger_s=linger)

    async def close(self) -> None:
        await self.starts.close()
        await self.reports.close()
        await self.heartbeats.close()


class SubmitBatches:
    """This node's rounds of single task submits without an ``Idempotency-Key``
    (``POST …/tasks``), keyed by shard group (:func:`orbit.shards.shard_group`): the submits
    of every namespace and owner that arrive while one round is being committed go together
    in the next transaction (:func:`pulse.submit.submit_round`), each answered with its own
    status. ``ORBIT_PULSE_GROUP_COMMIT=0`` turns it off."""

    def __init__(
        self,
        db: Any,
        *,
        max_batch: int | None = None,
        enabled: bool | None = None,
        hub: Hub | None = None,
    ):
        from pulse import submit
        from pulse.submit_offer import IdleOffer

        if enabled is None:
            enabled = os.environ.get("ORBIT_PULSE_GROUP_COMMIT", "1") != "0"
        if max_batch is None:
            max_batch = int(os.environ.get("ORBIT_PULSE_BATCH_MAX", "64"))
        self.enabled = enabled
        #: With this node's hub: new tasks offered in the submit to sessions waiting here
        #: (pulse/submit_offer.py; ``ORBIT_PULSE_SUBMIT_OFFER=0`` turns it off).
        self.offer = (
            IdleOffer(hub)
            if hub is not None and os.environ.get("ORBIT_PULSE_SUBMIT_OFFER", "1") != "0"
            else None
        )
        self.singles: GroupCommit[int, tuple[bytes, bytes, Any], Any] = GroupCommit(
            lambda _group, items: submit.submit_round(db, items, offer=self.offer),
            max_batch=max_batch if enabled else 1,
            name="submits",
        )

    async def submit(self, namespace_id: bytes, owner_id: bytes, item: Any) -> Any:
        """:func:`pulse.submit.submit_one`'s answer for ``item`` (a ``SingleSubmit``), or
        its error raised."""
        return await self.singles.submit(shard_group(namespace_id), (namespace_id, owner_id, item))

    async def close(self) -> None:
        await self.singles.close()
