"""The node's fair share of HTTP request handling (orbit/request_share.py): a tenant alone
may use every slot, a tenant over its share while another is active waits in its own queue,
freed slots go round-robin to the waiting tenant holding the fewest, a full queue refuses."""

from __future__ import annotations

import pytest

from orbit.request_share import QueueFull, RequestShare, ShareSettings


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def _share(slots: int = 8, queue: int = 256, window: float = 1.0) -> tuple[RequestShare, Clock]:
    clock = Clock()
    settings = ShareSettings(slots=slots, tenant_queue=queue, active_window_s=window)
    return RequestShare(settings, clock=clock), clock


async def test_a_tenant_alone_may_use_every_slot() -> None:
    share, _ = _share(slots=8)
    assert all(share.try_enter("flood") for _ in range(8))
    assert not share.try_enter("flood")  # the ninth waits: every slot is taken
    assert share.held == {"flood": 8}


async def test_while_another_tenant_is_active_each_holds_at_most_its_share() -> None:
    share, _ = _share(slots=8)
    assert share.try_enter("quiet")
    share.release("quiet")  # quiet is still active (within the window)
    assert share.share() == 8  # alone so far
    assert all(share.try_enter("flood") for _ in range(4))
    assert share.share() == 4  # two active tenants
    assert not share.try_enter("flood")  # over its share: queued, though slots are free
    assert share.try_enter("quiet")  # the quiet tenant never waits behind the flood


async def test_the_share_grows_back_when_the_other_tenant_goes_quiet() -> None:
    share, clock = _share(slots=8, window=1.0)
    assert share.try_enter("quiet")
    share.release("quiet")
    for _ in range(4):
        assert share.try_enter("flood")
    waiter = share.enqueue("flood")
    assert not waiter.done()
    clock.now += 2.0  # quiet has been idle longer than the window
    share.release("flood")  # any release re-evaluates the share
    assert share.share() == 8
    assert waiter.done()
    assert share.held == {"flood": 4}


async def test_a_freed_slot_goes_to_the_waiting_tenant_holding_the_fewest() -> None:
    share, _ = _share(slots=2)
    assert share.try_enter("flood") and share.try_enter("flood")
    floods = [share.enqueue("flood") for _ in range(20)]
    quiet = share.enqueue("quiet")  # queued after twenty flood requests
    share.release("flood")
    assert quiet.done() and not any(f.done() for f in floods)
    assert share.held == {"flood": 1, "quiet": 1}


async def test_waiting_tenants_are_served_round_robin() -> None:
    share, _ = _share(slots=1)
    assert share.try_enter("x")
    waits = [(t, share.enqueue(t)) for t in ("a", "a", "a", "b", "b", "c")]
    served: list[str] = []
    seen: set[int] = set()
    holder = "x"
    for _ in range(len(waits)):
        share.release(holder)
        granted = [(i, t) for i, (t, f) in enumerate(waits) if f.done() and i not in seen]
        assert len(granted) == 1  # one slot: one grant per release
        i, holder = granted[0]
        seen.add(i)
        served.append(holder)
    assert served == ["a", "b", "c", "a", "b", "a"]


async def test_a_full_queue_refuses_at_once() -> None:
    share, _ = _share(slots=1, queue=3)
    assert share.try_enter("flood")
    for _ in range(3):
        share.enqueue("flood")
    with pytest.raises(QueueFull):
        share.enqueue("flood")
    assert share.refused == 1
    share.enqueue("quiet")  # another tenant's queue is its own


async def test_a_cancelled_wait_gives_back_a_slot_granted_meanwhile() -> None:
    share, _ = _share(slots=1)
    assert share.try_enter("a")
    waiter = share.enqueue("b")
    share.release("a")
    assert waiter.done() and share.held == {"b": 1}
    share.cancel("b", waiter)  # the request gave up just as it was served
    assert share.held == {} and share.in_use == 0
    other = share.enqueue("c")
    assert other.done()
    share.cancel("c", other)
    pending = [share.enqueue("d") for _ in range(2)]
    share.cancel("d", pending[1])
    assert share.waiting("d") == 0 and share.held == {"d": 1}
