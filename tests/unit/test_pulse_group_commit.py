"""pulse.batcher.GroupCommit: per-key group commit (pure asyncio, no database)."""

from __future__ import annotations

import asyncio

import pytest

from orbit.storage import OutcomeUnknown
from pulse.batcher import GroupCommit


class Poison(Exception):
    pass


class Recorder:
    """An ``apply`` that records its batches; items named "bad" fail the whole batch
    (a transaction-level error), items named "stale" fail alone (an item outcome)."""

    def __init__(self, delay: float = 0.02) -> None:
        self.batches: list[tuple[str, list[str]]] = []
        self.delay = delay
        self.in_flight: dict[str, int] = {}
        self.max_in_flight = 0

    async def __call__(self, key: str, items: list[str]) -> list[str | BaseException]:
        self.in_flight[key] = self.in_flight.get(key, 0) + 1
        self.max_in_flight = max(self.max_in_flight, self.in_flight[key])
        try:
            self.batches.append((key, list(items)))
            await asyncio.sleep(self.delay)
            if "bad" in items:
                raise Poison("the transaction failed")
            return [ValueError(i) if i == "stale" else f"ok:{key}:{i}" for i in items]
        finally:
            self.in_flight[key] -= 1


async def test_first_item_goes_alone_and_the_rest_together() -> None:
    rec = Recorder()
    gc: GroupCommit[str, str, str] = GroupCommit(rec, max_batch=64)
    first = asyncio.create_task(gc.submit("ns", "a"))
    await asyncio.sleep(0.005)  # "a" is in flight
    rest = [asyncio.create_task(gc.submit("ns", f"i{k}")) for k in range(10)]
    assert await first == "ok:ns:a"
    assert await asyncio.gather(*rest) == [f"ok:ns:i{k}" for k in range(10)]
    assert [len(b) for _, b in rec.batches] == [1, 10]
    assert rec.max_in_flight == 1  # one batch in flight per key
    assert gc.stats.batches == 2 and gc.stats.items == 11 and gc.stats.largest == 10
    assert gc.pending() == 0


async def test_max_batch_and_keys_are_separate() -> None:
    rec = Recorder()
    gc: GroupCommit[str, str, str] = GroupCommit(rec, max_batch=4)
    tasks = [asyncio.create_task(gc.submit(k, f"{k}{n}")) for n in range(9) for k in ("x", "y")]
    out = await asyncio.gather(*tasks)
    assert all(o.startswith("ok:") for o in out)
    for key in ("x", "y"):
        sizes = [len(b) for k, b in rec.batches if k == key]
        assert sum(sizes) == 9 and max(sizes) <= 4
        # in order, per key
        assert [i for k, b in rec.batches if k == key for i in b] == [f"{key}{n}" for n in range(9)]


async def test_an_item_outcome_fails_only_that_item() -> None:
    rec = Recorder()
    gc: GroupCommit[str, str, str] = GroupCommit(rec)
    blocker = asyncio.create_task(gc.submit("ns", "first"))
    await asyncio.sleep(0.005)
    tasks = [asyncio.create_task(gc.submit("ns", i)) for i in ("a", "stale", "b")]
    await blocker
    results = await asyncio.gather(*tasks, return_exceptions=True)
    assert results[0] == "ok:ns:a" and results[2] == "ok:ns:b"
    assert isinstance(results[1], ValueError)
    assert [len(b) for _, b in rec.batches] == [1, 3]  # one transaction for all three


async def test_a_poisoned_batch_is_reapplied_item_by_item() -> None:
    rec = Recorder()
    gc: GroupCommit[str, str, str] = GroupCommit(rec)
    blocker = asyncio.create_task(gc.submit("ns", "first"))
    await asyncio.sleep(0.005)
    tasks = [asyncio.create_task(gc.submit("ns", i)) for i in ("a", "bad", "b")]
    await blocker
    results = await asyncio.gather(*tasks, return_exceptions=True)
    assert results[0] == "ok:ns:a" and results[2] == "ok:ns:b"
    assert isinstance(results[1], Poison)
    assert [b for _, b in rec.batches] == [["first"], ["a", "bad", "b"], ["a"], ["bad"], ["b"]]
    assert gc.stats.isolated == 1
    assert gc.pending() == 0


async def test_unknown_outcome_reaches_every_item_and_is_never_reapplied() -> None:
    calls: list[list[str]] = []

    async def apply(key: str, items: list[str]) -> list[str]:
        calls.append(list(items))
        await asyncio.sleep(0.01)
        if len(calls) > 1:
            raise OutcomeUnknown("connection lost during COMMIT")
        return ["ok" for _ in items]

    gc: GroupCommit[str, str, str] = GroupCommit(apply)
    first = asyncio.create_task(gc.submit("ns", "a"))
    await asyncio.sleep(0.002)
    tasks = [asyncio.create_task(gc.submit("ns", i)) for i in ("b", "c")]
    assert await first == "ok"
    results = await asyncio.gather(*tasks, return_exceptions=True)
    assert all(isinstance(r, OutcomeUnknown) for r in results)
    assert calls == [["a"], ["b", "c"]]  # never re-applied: it may have committed


async def test_a_waiter_that_goes_away_does_not_cancel_its_batch() -> None:
    rec = Recorder(delay=0.05)
    gc: GroupCommit[str, str, str] = GroupCommit(rec)
    first = asyncio.create_task(gc.submit("ns", "a"))
    await asyncio.sleep(0.005)
    quitter = asyncio.create_task(gc.submit("ns", "q"))
    other = asyncio.create_task(gc.submit("ns", "b"))
    await asyncio.sleep(0.005)
    quitter.cancel()
    assert await first == "ok:ns:a"
    assert await other == "ok:ns:b"
    with pytest.raises(asyncio.CancelledError):
        await quitter
    assert rec.batches[1] == ("ns", ["q", "b"])  # still applied (a lost reply, not a lost item)
    assert gc.pending() == 0


async def test_bounded_queue_applies_backpressure() -> None:
    release = asyncio.Event()

    async def apply(key: str, items: list[int]) -> list[int]:
        await release.wait()
        return items

    gc: GroupCommit[str, int, int] = GroupCommit(apply, max_batch=2, max_pending=3)
    tasks = [asyncio.create_task(gc.submit("ns", n)) for n in range(5)]
    await asyncio.sleep(0.01)
    assert gc.pending() == 3  # two submitters wait for room
    release.set()
    assert await asyncio.gather(*tasks) == [0, 1, 2, 3, 4]
    assert gc.pending() == 0


async def test_close_fails_queued_items_with_unknown_outcome() -> None:
    async def apply(key: str, items: list[int]) -> list[int]:
        await asyncio.sleep(10)
        return items

    gc: GroupCommit[str, int, int] = GroupCommit(apply)
    tasks = [asyncio.create_task(gc.submit("ns", n)) for n in range(3)]
    await asyncio.sleep(0.01)
    await gc.close()
    results = await asyncio.gather(*tasks, return_exceptions=True)
    assert all(isinstance(r, OutcomeUnknown) for r in results)
    assert gc.pending() == 0


async def test_a_lingering_item_waits_for_the_items_that_arrive_meanwhile() -> None:
    rec = Recorder(delay=0.0)
    gc: GroupCommit[str, str, str] = GroupCommit(rec, max_batch=64)
    first = asyncio.create_task(gc.submit("ns", "a", linger_s=30.0))
    await asyncio.sleep(0.01)
    assert rec.batches == []  # still lingering
    more = [asyncio.create_task(gc.submit("ns", f"i{k}", linger_s=30.0)) for k in range(3)]
    await asyncio.sleep(0.01)
    assert rec.batches == []
    # An item without a linger ends the wait: everything queued goes in one round.
    now = asyncio.create_task(gc.submit("ns", "now"))
    assert await now == "ok:ns:now"
    assert await first == "ok:ns:a"
    await asyncio.gather(*more)
    assert [b for _, b in rec.batches] == [["a", "i0", "i1", "i2", "now"]]


async def test_a_linger_ends_at_its_deadline_or_when_a_batch_is_full() -> None:
    rec = Recorder(delay=0.0)
    gc: GroupCommit[str, str, str] = GroupCommit(rec, max_batch=3)
    assert await gc.submit("ns", "a", linger_s=0.01) == "ok:ns:a"  # alone: after its linger
    full = [asyncio.create_task(gc.submit("ns", f"f{k}", linger_s=30.0)) for k in range(3)]
    await asyncio.gather(*full)  # a full batch does not wait out the linger
    assert [b for _, b in rec.batches] == [["a"], ["f0", "f1", "f2"]]
