"""Exponential backoff: the one formula behind task retries, delivery re-hand-outs and
workflow advance retries."""

from __future__ import annotations


def backoff_ms(attempts: int, initial_ms: int, max_ms: int, multiplier: float = 2.0) -> int:
    """Delay before the next try after the ``attempts``-th one failed:
    ``min(max_ms, initial_ms × multiplier^(attempts-1))`` (``initial_ms`` for the first; an
    exponent too large for a float gives ``max_ms``), never negative."""
    exponent = max(0, attempts - 1)
    try:
        delay = initial_ms * float(multiplier) ** exponent
    except OverflowError:
        delay = float(max_ms)
    return max(0, int(min(float(max_ms), delay)))
