"""The reconnect backoff schedule: geometric ceilings, cap, jitter bounds, reset."""

from __future__ import annotations

import itertools
import random

import pytest
from hypothesis import given
from hypothesis import strategies as st
from orbit_sdk import Backoff


def test_backoff_schedule_without_jitter_doubles_up_to_the_cap() -> None:
    b = Backoff(initial=0.1, maximum=1.0, multiplier=2.0, jitter=0.0)
    assert [round(b.next_delay(), 6) for _ in range(7)] == [0.1, 0.2, 0.4, 0.8, 1.0, 1.0, 1.0]
    b.reset()
    assert b.next_delay() == pytest.approx(0.1)


def test_backoff_survives_a_very_long_outage() -> None:
    b = Backoff(initial=0.1, maximum=30.0, jitter=0.0)
    b.failures = 100_000
    assert b.next_delay() == 30.0


def test_backoff_is_reproducible_with_a_seeded_rng() -> None:
    a = Backoff(rng=random.Random(7))
    b = Backoff(rng=random.Random(7))
    assert [a.next_delay() for _ in range(10)] == [b.next_delay() for _ in range(10)]


@given(
    initial=st.floats(min_value=0.001, max_value=5),
    factor=st.floats(min_value=1, max_value=10),
    multiplier=st.floats(min_value=1, max_value=4),
    jitter=st.floats(min_value=0, max_value=1),
    seed=st.integers(),
    n=st.integers(min_value=1, max_value=40),
)
def test_backoff_delays_stay_within_jittered_ceilings(
    initial: float, factor: float, multiplier: float, jitter: float, seed: int, n: int
) -> None:
    b = Backoff(
        initial=initial,
        maximum=initial * factor,
        multiplier=multiplier,
        jitter=jitter,
        rng=random.Random(seed),
    )
    ceilings = [b.ceiling(i) for i in range(n)]
    delays = [b.next_delay() for _ in range(n)]
    assert all(x <= y for x, y in itertools.pairwise(ceilings)), "ceilings never shrink"
    assert all(c <= b.maximum for c in ceilings)
    for c, d in zip(ceilings, delays, strict=True):
        assert c * (1 - jitter) - 1e-12 <= d <= c + 1e-12


def test_backoff_rejects_nonsense() -> None:
    with pytest.raises(ValueError):
        Backoff(initial=0)
    with pytest.raises(ValueError):
        Backoff(initial=2, maximum=1)
    with pytest.raises(ValueError):
        Backoff(jitter=1.5)
    with pytest.raises(ValueError):
        Backoff(multiplier=0.5)
