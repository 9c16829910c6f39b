"""The node dispatch round's planning (pulse/dispatch_plan.py): capacity shared by
application → namespace/queue → fairness subject, least recently served first; the claimed
rows dealt within every limit."""

from __future__ import annotations

from datetime import datetime, timedelta
from typing import Any

from pulse.dispatch_plan import Pool, Served, deal, plan, split

NS, NS2, Q, Q2 = b"n" * 16, b"m" * 16, b"q" * 16, b"r" * 16
T0 = datetime(2026, 1, 1)


def _rows(
    ns: bytes, q: bytes, subject: bytes, n: int, owner: bytes = b"o" * 16
) -> list[dict[str, Any]]:
    return [
        {
            "namespace_id": ns, "queue_id": q, "fair_subject": subject, "owner_id": owner,
            "id": subject[:8] + i.to_bytes(8, "big"), "dispatch_at": T0 + timedelta(seconds=i),
            "concurrency_key_digest": None,
        }
        for i in range(n)
    ]  # fmt: skip


def test_split_is_even_water_filling_with_the_remainder_first() -> None:
    assert split(10, [100, 100, 100]) == [4, 3, 3]
    assert split(10, [1, 100, 100]) == [1, 5, 4]
    assert split(3, [0, 5, 5, 5, 5]) == [0, 1, 1, 1, 0]
    assert split(100, [2, 3]) == [2, 3]


def test_the_round_budget_goes_to_the_least_recently_served_applications() -> None:
    served = Served()
    pools = [Pool(bytes([a]) * 16, bytes([a]) * 16, (Q,), False, [(a, 4)]) for a in range(10)]
    subjects = {(bytes([a]) * 16, Q): [b"s" * 16] for a in range(10)}
    first = plan(pools, subjects, served, budget=8, pool_cap=256, queue_room={})
    granted = [p.application_id for p in pools if p.grant]
    assert len(granted) == 8 and sum(p.grant for p in pools) == 8 and first.parts
    served.mark(("app", a) for a in granted)
    served.round += 1
    plan(pools, subjects, served, budget=8, pool_cap=256, queue_room={})
    again = {p.application_id for p in pools if p.grant}
    # The two left out last time come first now.
    assert {bytes([a]) * 16 for a in range(10)} - set(granted) <= again


def test_subjects_share_a_queue_and_what_one_cannot_use_goes_to_the_others() -> None:
    pool = Pool(b"a" * 16, NS, (Q,), False, [(0, 6), (1, 4)])
    subs = [b"f" * 16, b"g" * 16, b"h" * 16]
    the_plan = plan([pool], {(NS, Q): subs}, Served(), budget=100, pool_cap=256, queue_room={})
    assert pool.grant == 10
    assert {s: limit for _, _, s, _, limit in the_plan.parts} == {
        subs[0]: 8,
        subs[1]: 6,
        subs[2]: 6,
    }
    # "g" and "h" have one due task each: the flood fills the rest, one turn after another.
    rows = _rows(NS, Q, subs[0], 8) + _rows(NS, Q, subs[1], 1) + _rows(NS, Q, subs[2], 1)
    dealt = deal([pool], the_plan, rows, queue_room={}, allowance={})
    got = [r["fair_subject"] for r, _ in dealt.offers[0]]
    assert got[:3] == subs and len(got) == 10
    assert sorted(i for _, i in dealt.offers[0]) == [0] * 6 + [1] * 4  # each its free slots
    assert not dealt.more  # every slot is used: nothing to run again for


def test_limits_hold_back_rows_and_count_them() -> None:
    owner = b"o" * 16
    pool = Pool(b"a" * 16, NS, (Q, Q2), False, [(0, 10)])
    subjects = {(NS, Q): [b"f" * 16], (NS, Q2): [b"g" * 16]}
    room = {(NS, Q): 2}
    the_plan = plan([pool], subjects, Served(), budget=100, pool_cap=256, queue_room=dict(room))
    rows = _rows(NS, Q, b"f" * 16, 2) + _rows(NS, Q2, b"g" * 16, 10, owner=b"p" * 16)
    dealt = deal([pool], the_plan, rows, queue_room=room, allowance={b"p" * 16: 3, owner: 10})
    per_queue = [r["queue_id"] for r, _ in dealt.offers[0]]
    assert per_queue.count(Q) == 2 and per_queue.count(Q2) == 3
    assert (
        dealt.denied_owner[b"p" * 16] == len(rows) - 2 - 3 - 0 or dealt.denied_owner[b"p" * 16] > 0
    )


def test_a_fairness_key_is_1_to_128_characters_and_a_bad_one_names_the_field() -> None:
    import msgspec
    import pytest

    from pulse.types import TaskSubmit

    ok = msgspec.json.decode(
        b'{"queue": "q", "kind": "k", "fairness_key": "user-1"}', type=TaskSubmit
    )
    assert ok.fairness_key == "user-1"
    for bad in (b'""', b'"' + b"x" * 129 + b'"', b"7"):
        with pytest.raises(msgspec.ValidationError, match="fairness_key"):
            msgspec.json.decode(
                b'{"queue": "q", "kind": "k", "fairness_key": ' + bad + b"}", type=TaskSubmit
            )


def test_an_idle_dispatcher_polls_less_often_up_to_its_bound() -> None:
    from pulse.dispatch import idle_poll_s

    assert idle_poll_s(0.25, 1.0, 0) == 0.25  # a round that offered or saw a due time
    assert idle_poll_s(0.25, 1.0, 1) == 0.25
    assert idle_poll_s(0.25, 1.0, 2) == 0.5
    assert idle_poll_s(0.25, 1.0, 3) == 1.0
    assert idle_poll_s(0.25, 1.0, 50) == 1.0
    assert idle_poll_s(10.0, 1.0, 5) == 10.0  # never shorter than dispatch_poll_ms
