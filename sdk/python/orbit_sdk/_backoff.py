"""Exponential backoff with jitter for reconnects.

The n-th consecutive failure (n = 0, 1, 2, ...) waits
``ceiling(n) = min(maximum, initial * multiplier**n)`` scaled down by a random factor in
``[1 - jitter, 1]``. So a delay never exceeds ``maximum``, the ceilings grow
geometrically, and many workers that lost the server at the same moment spread their
reconnects instead of arriving together. ``reset()`` after a healthy connection.
"""

from __future__ import annotations

import random
from dataclasses import dataclass, field

__all__ = ["Backoff"]


@dataclass
class Backoff:
    """Reconnect delay schedule (seconds). Pass ``rng`` for a reproducible schedule."""

    initial: float = 0.1
    maximum: float = 30.0
    multiplier: float = 2.0
    jitter: float = 0.5
    rng: random.Random = field(default_factory=random.Random, repr=False)
    failures: int = field(default=0, init=False)

    def __post_init__(self) -> None:
        if self.initial <= 0 or self.maximum < self.initial:
            raise ValueError("need 0 < initial <= maximum")
        if self.multiplier < 1:
            raise ValueError("multiplier must be >= 1")
        if not 0 <= self.jitter <= 1:
            raise ValueError("jitter must be within [0, 1]")

    def ceiling(self, n: int) -> float:
        """The largest delay after ``n`` earlier consecutive failures (no jitter)."""
        # Step up and stop at the cap: multiplier**n would overflow after a long outage.
        delay = self.initial
        for _ in range(n):
            delay *= self.multiplier
            if delay >= self.maximum:
                return self.maximum
        return min(delay, self.maximum)

    def next_delay(self) -> float:
        """The delay before the next try; counts one more consecutive failure."""
        ceiling = self.ceiling(self.failures)
        self.failures += 1
        return ceiling * (1.0 - self.jitter * self.rng.random())

    def reset(self) -> None:
        """Forget earlier failures: the next delay starts again from ``initial``."""
        self.failures = 0
