"""Token buckets for per-connection and per-session budgets (node memory, no database).

A :class:`TokenBucket` holds up to ``burst`` tokens and gains ``rate`` tokens per second;
an action that costs more than it holds is refused. :class:`BucketMap` keeps one bucket per
key (a worker session, say) for at most ``max_keys`` keys, dropping the least recently used,
so its memory is bounded whatever the clients do. These are per-node limits against floods,
not quotas: quotas live in the database.
"""

from __future__ import annotations

import time
from collections import OrderedDict
from collections.abc import Callable, Hashable


class TokenBucket:
    """``rate`` tokens per second, at most ``burst`` saved up; starts full."""

    __slots__ = ("_clock", "_stamp", "burst", "rate", "tokens")

    def __init__(
        self, rate: float, burst: float, *, clock: Callable[[], float] = time.monotonic
    ) -> None:
        if rate <= 0 or burst < 1:
            raise ValueError("rate must be > 0 and burst >= 1")
        self.rate = float(rate)
        self.burst = float(burst)
        self.tokens = float(burst)
        self._clock = clock
        self._stamp = clock()

    def _fill(self) -> None:
        now = self._clock()
        self.tokens = min(self.burst, self.tokens + (now - self._stamp) * self.rate)
        self._stamp = now

    def take(self, cost: float = 1.0) -> bool:
        """Spend ``cost`` tokens if there are that many; False (nothing spent) otherwise."""
        self._fill()
        if self.tokens >= cost:
            self.tokens -= cost
            return True
        return False

    def spend(self, cost: float) -> None:
        """Spend ``cost`` tokens whether or not there are that many: the bucket may go into
        debt, and :meth:`take` refuses until the debt is refilled."""
        self._fill()
        self.tokens -= cost

    def retry_after_s(self, cost: float = 1.0) -> float:
        """Seconds until ``cost`` tokens will be there."""
        self._fill()
        return max(0.0, (cost - self.tokens) / self.rate)


class BucketMap:
    """One :class:`TokenBucket` per key, for at most ``max_keys`` keys (LRU)."""

    def __init__(self, make: Callable[[], TokenBucket], *, max_keys: int = 100_000) -> None:
        self._make = make
        self.max_keys = max_keys
        self._buckets: OrderedDict[Hashable, TokenBucket] = OrderedDict()

    def get(self, key: Hashable, make: Callable[[], TokenBucket] | None = None) -> TokenBucket:
        """The bucket of ``key``, made by ``make`` (default: the map's) on first use."""
        bucket = self._buckets.get(key)
        if bucket is None:
            bucket = self._buckets[key] = (make or self._make)()
            if len(self._buckets) > self.max_keys:
                self._buckets.popitem(last=False)
        else:
            self._buckets.move_to_end(key)
        return bucket

    def __len__(self) -> int:
        return len(self._buckets)
