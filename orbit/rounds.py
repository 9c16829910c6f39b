"""Node rounds: ONE transaction in flight per node for a stage, taking everything that
arrived while the previous one ran.

    acks = NodeRound(apply_acks, max_items=1024, name="acks")
    outcome = await acks.submit(item)            # this item's own outcome, or raises
    outcomes = await acks.submit_many(items)     # several items of one caller, in order

Unlike a per-key group commit, a node round is not partitioned by namespace or
subscription: items of every namespace, subscription and connection of this process go into
the same round, so a node with many quiet tenants runs one transaction per round, not one
per tenant. The first item after a quiet spell goes alone, at once (no added latency when
idle); items that arrive while a round is in flight wait for the next one (up to
``max_items`` a round).

``apply(items)`` runs the items in one transaction and returns one outcome per item, in
order: a value, or an exception *instance* for an item that failed on its own. When
``apply`` raises (the transaction as a whole failed) and the round carried more than one
item, each item is re-applied alone, so one poisoned item cannot fail the others — except
for an unknown commit outcome, which must reach every caller. Nothing here is durable: the
database decides; a caller that stops waiting does not withdraw its item.
"""

from __future__ import annotations

import asyncio
import logging
from collections import deque
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass
from typing import Generic, TypeVar

from orbit.storage import OutcomeUnknown

log = logging.getLogger("orbit.rounds")

I = TypeVar("I")  # noqa: E741 - the item type
R = TypeVar("R")


@dataclass
class RoundStats:
    """What a :class:`NodeRound` did (tests, /metrics, the bench)."""

    rounds: int = 0
    items: int = 0
    largest: int = 0
    isolated: int = 0  # rounds that failed whole and were re-applied item by item


class NodeRound(Generic[I, R]):
    """One transaction in flight per node for ``apply`` (see the module docstring)."""

    def __init__(
        self,
        apply: Callable[[list[I]], Awaitable[Sequence[R | BaseException]]],
        *,
        max_items: int = 1024,
        name: str = "round",
    ) -> None:
        if max_items < 1:
            raise ValueError("max_items must be >= 1")
        self._apply = apply
        self.max_items = max_items
        self.name = name
        self._queue: deque[tuple[I, asyncio.Future[R]]] = deque()
        self._runner: asyncio.Task[None] | None = None
        self.stats = RoundStats()

    async def submit(self, item: I) -> R:
        """Apply ``item`` in the next round; its own outcome (an error is raised)."""
        (fut,) = self._enqueue([item])
        return await fut

    async def submit_many(self, items: Sequence[I]) -> list[R | BaseException]:
        """Apply ``items`` (in order, in the same round when they fit); each one's outcome,
        errors returned as instances rather than raised."""
        futs = self._enqueue(items)
        out: list[R | BaseException] = []
        for f in futs:
            try:
                out.append(await f)
            except asyncio.CancelledError:
                raise
            except Exception as exc:
                out.append(exc)
        return out

    def _enqueue(self, items: Sequence[I]) -> list[asyncio.Future[R]]:
        loop = asyncio.get_running_loop()
        futs: list[asyncio.Future[R]] = []
        for item in items:
            fut: asyncio.Future[R] = loop.create_future()
            self._queue.append((item, fut))
            futs.append(fut)
        if self._runner is None or self._runner.done():
            self._runner = asyncio.create_task(self._drain(), name=f"{self.name}-round")
        return futs

    async def _drain(self) -> None:
        batch: list[tuple[I, asyncio.Future[R]]] = []
        try:
            while self._queue:
                take = min(len(self._queue), self.max_items)
                batch = [self._queue.popleft() for _ in range(take)]
                await self._run(batch)
                batch = []
        except BaseException as exc:
            unknown = OutcomeUnknown(f"{self.name}: stopped while applying ({exc!r})")
            for _, fut in batch:
                _settle(fut, unknown)
            while self._queue:
                _settle(self._queue.popleft()[1], OutcomeUnknown(f"{self.name}: stopped"))
            if not isinstance(exc, Exception):
                raise
            log.exception("%s: round loop failed", self.name)

    async def _run(self, batch: list[tuple[I, asyncio.Future[R]]]) -> None:
        self.stats.rounds += 1
        self.stats.items += len(batch)
        self.stats.largest = max(self.stats.largest, len(batch))
        try:
            outcomes = await self._apply([item for item, _ in batch])
            if len(outcomes) != len(batch):  # pragma: no cover - a bug in apply
                raise RuntimeError(f"{self.name}: {len(outcomes)} outcomes for {len(batch)}")
        except asyncio.CancelledError:
            raise
        except Exception as exc:
            if len(batch) > 1 and not isinstance(exc, OutcomeUnknown):
                self.stats.isolated += 1
                log.info("%s: round of %d failed (%r); applying items alone", self.name,
                         len(batch), exc)  # fmt: skip
                for entry in batch:
                    await self._run([entry])
                return
            outcomes = [exc] * len(batch)
        for (_, fut), outcome in zip(batch, outcomes, strict=True):
            _settle(fut, outcome)

    async def close(self) -> None:
        """Stop the round loop (queued items fail with OutcomeUnknown)."""
        if self._runner is not None and not self._runner.done():
            self._runner.cancel()
            await asyncio.gather(self._runner, return_exceptions=True)


def _settle(fut: asyncio.Future[R], outcome: R | BaseException) -> None:
    if fut.done():
        return
    if isinstance(outcome, BaseException):
        fut.set_exception(outcome)
    else:
        fut.set_result(outcome)
