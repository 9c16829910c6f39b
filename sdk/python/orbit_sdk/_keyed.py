"""What a worker that does not accept keyed tasks (``Worker(concurrency_keys=False)``) logs
when the server says keyed tasks wait on its queues: at session creation and, while its
stream lives, in a heartbeat answer (``keyed_waiting``, at most every minute by default;
docs/api/workers.md). A warning names the queues when they change, and again every
``repeat_s`` while they stay the same, so a lasting misconfiguration is seen without
flooding the log."""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Sequence

logger = logging.getLogger("orbit_sdk.connection")

#: A warning about the same queues is repeated at most this often (seconds).
REPEAT_S = 600.0


class KeyedWaitingLog:
    """Logs the queues where keyed tasks wait for a worker that takes them."""

    def __init__(
        self, *, repeat_s: float = REPEAT_S, clock: Callable[[], float] = time.monotonic
    ) -> None:
        self._repeat_s = repeat_s
        self._clock = clock
        self._last: tuple[str, ...] = ()
        self._logged_at = 0.0

    def note(self, queues: Sequence[str]) -> None:
        """The server's latest answer: ``queues`` where keyed tasks wait (empty: none)."""
        now, current = self._clock(), tuple(sorted(queues))
        if current and (current != self._last or now - self._logged_at >= self._repeat_s):
            logger.warning(
                "tasks with a concurrency_key wait on queue(s) %s, and this worker does not"
                " accept keyed tasks (concurrency_keys=False): they wait for a worker that"
                " does",
                ", ".join(current),
            )
            self._logged_at = now
        self._last = current
