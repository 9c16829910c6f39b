"""Delivery ranges, the pure part: proof locators round-trip and reject everything else,
slot packing round-trips, and the slot state machine keeps its counts in step (Hypothesis)."""

from __future__ import annotations

import os
from datetime import datetime, timedelta

import pytest
from hypothesis import given
from hypothesis import strategies as st

from orbit import delivery_ranges as dr
from orbit.ids import new_secret

ids = st.binary(min_size=16, max_size=16)
indexes = st.integers(min_value=0, max_value=dr.MAX_SLOTS - 1)


@given(ids, indexes, st.binary(min_size=24, max_size=24))
def test_proof_locator_round_trips(range_id: bytes, index: int, secret: bytes) -> None:
    proof = dr.make_proof(range_id, index, secret)
    assert dr.parse_proof(proof) == (range_id, index)
    assert len(proof) <= 256  # fits the API's proof field
    assert dr.make_proof(range_id, index) != dr.make_proof(range_id, index)  # fresh secrets


@given(st.text(max_size=300))
def test_any_other_text_is_not_a_locator(text: str) -> None:
    got = dr.parse_proof(text)
    if got is not None:  # only a well-formed d1. proof parses, and then to itself
        assert text.startswith(dr.PROOF_PREFIX)
        rid, i = got
        assert len(rid) == 16 and 0 <= i < dr.MAX_SLOTS


def test_plain_secrets_and_near_misses_are_not_locators() -> None:
    good = dr.make_proof(os.urandom(16), 3)
    for bad in (new_secret(24), "", "d1.", good[:-1], good + "A", "d2" + good[2:],
                good.replace("d1.", "d1:"), "d1." + "!" * 56):  # fmt: skip
        assert dr.parse_proof(bad) is None, bad
    with pytest.raises(ValueError):
        dr.make_proof(os.urandom(16), dr.MAX_SLOTS)


@given(st.lists(st.integers(min_value=0, max_value=2**63), max_size=50))
def test_seq_packing_round_trips(seqs: list[int]) -> None:
    assert dr.unpack_seqs(dr.pack_seqs(seqs)) == seqs


@given(st.lists(ids, max_size=40))
def test_fixed_packing_round_trips(items: list[bytes]) -> None:
    assert dr.unpack_fixed(dr.pack_fixed(items, 16), 16) == items


def test_delivery_ids_share_the_bucket_and_are_random() -> None:
    bucket, got = dr.new_delivery_ids(50)
    assert all(d[:2] == bucket and len(d) == 16 for d in got)
    assert len(set(got)) == 50
    assert dr.bucket_of(got[0]) == int.from_bytes(bucket, "big")


@given(st.datetimes(min_value=datetime(1971, 1, 1), max_value=datetime(2200, 1, 1)))
def test_microsecond_times_round_trip(at: datetime) -> None:
    assert dr.from_us(dr.to_us(at)) == at


@given(st.integers(min_value=1, max_value=200), st.data())
def test_slot_state_machine_keeps_counts(n: int, data: st.DataObject) -> None:
    _, dids = dr.new_delivery_ids(n)
    slots = dr.Slots.decode(
        dr.pack_seqs(list(range(1, n + 1))), dr.pack_fixed(dids, 16),
        dr.pack_fixed([os.urandom(16) for _ in range(n)], 16),
        dr.pack_fixed([os.urandom(32) for _ in range(n)], 32),
        dr.pack_seqs([0] * n), dr.empty_bitmap(n),
    )  # fmt: skip
    acked: set[int] = set()
    moved: set[int] = set()
    at = datetime(2026, 1, 1)
    ops = data.draw(
        st.lists(st.tuples(st.sampled_from("am"), st.integers(0, n - 1)), max_size=3 * n)
    )
    for op, i in ops:
        if i in acked or i in moved:
            with pytest.raises(ValueError):  # a slot leaves the open state once
                if op == "a":
                    slots.ack(i, at)
                else:
                    slots.move(i)
            continue
        if op == "a":
            slots.ack(i, at + timedelta(microseconds=i))
            acked.add(i)
        else:
            slots.move(i)
            moved.add(i)
        assert slots.open_n == n - len(acked) - len(moved)
        assert slots.acked_n == len(acked) and dr.popcount(slots.moved) == len(moved)
    for i in range(n):
        assert slots.is_open(i) == (i not in acked and i not in moved)
        assert slots.is_acked(i) == (i in acked) and slots.is_moved(i) == (i in moved)
    expect = (
        dr.RangeState.LEASED
        if len(acked) + len(moved) < n
        else dr.RangeState.RECLAIMED
        if moved
        else dr.RangeState.DONE
    )
    assert slots.state() is expect
    again = dr.Slots.decode(
        dr.pack_seqs(slots.seqs), dr.pack_fixed(slots.delivery_ids, 16),
        dr.pack_fixed(slots.event_ids, 16), dr.pack_fixed(slots.digests, 32),
        slots.acked_blob(), slots.moved,
    )  # fmt: skip
    assert again == slots
    assert [slots.index_of(d) for d in dids] == list(range(n))


def test_inconsistent_blobs_are_refused() -> None:
    with pytest.raises(ValueError):
        dr.Slots.decode(dr.pack_seqs([1, 2]), os.urandom(16), os.urandom(32), os.urandom(64),
                        dr.pack_seqs([0, 0]), dr.empty_bitmap(2))  # fmt: skip
