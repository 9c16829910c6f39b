"""Background loop deleting expired idempotency keys in bounded batches.

Safe on many nodes: each round is one short ``DELETE ... ORDER BY expires_at LIMIT n``; two
nodes deleting at once simply share the work. ``run_once()`` is what tests call.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from datetime import datetime

from orbit import idempotency
from orbit.context import AppContext

log = logging.getLogger("orbit.idempotency")


class IdempotencyCleanup:
    """Deletes expired keys: rounds of ``batch`` rows until a round deletes fewer, then
    sleeps ``interval_s``."""

    def __init__(self, ctx: AppContext) -> None:
        self.db = ctx.db
        self.batch = ctx.settings.idempotency_cleanup_batch
        self.interval_s = ctx.settings.idempotency_cleanup_interval_s
        self.deleted = ctx.metrics.counter(
            "orbit_idempotency_keys_deleted_total", "Expired idempotency keys deleted"
        )

    async def run_once(self, *, now: datetime | None = None, max_rounds: int = 100) -> int:
        """Delete expired keys (at most ``max_rounds`` batches); return how many."""
        total = 0
        for _ in range(max_rounds):
            n = await idempotency.cleanup_once(self.db, self.batch, now=now)
            total += n
            if n < self.batch:
                break
        if total:
            self.deleted.inc(total)
        return total

    async def run(self, stop: asyncio.Event) -> None:
        """Loop until ``stop`` is set; errors are logged and retried next interval."""
        while not stop.is_set():
            try:
                await self.run_once()
            except Exception:
                log.exception("idempotency cleanup failed")
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(stop.wait(), self.interval_s)
