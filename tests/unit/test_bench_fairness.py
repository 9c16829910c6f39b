"""S5's offered load: every owner is offered the same number of tasks, within one request,
whatever mix of batch and single requests the producers send (bench/fairness.py)."""

from __future__ import annotations

from bench.fairness import EvenOffer, jain


def test_mixed_batches_and_singles_stay_within_one_batch() -> None:
    deal = EvenOffer(100)
    sizes = [50, 1, 1, 50, 1, 1] * 2000  # 2 batch clients and 4 single clients, interleaved
    for n in sizes:
        deal.take(n)
        assert max(deal.offered) - min(deal.offered) <= 50
    assert sum(deal.offered) == sum(sizes)


def test_equal_requests_go_round_robin() -> None:
    deal = EvenOffer(4)
    assert [deal.take(1) for _ in range(8)] == [0, 1, 2, 3, 0, 1, 2, 3]
    assert deal.offered == [2, 2, 2, 2]


def test_jain_index() -> None:
    assert jain([5, 5, 5, 5]) == 1.0
    assert jain([20, 0, 0, 0]) == 0.25
    assert jain([0, 0]) is None
