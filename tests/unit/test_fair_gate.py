"""The pool's fair gate (orbit/storage/fairness.py): a cap per tenant, and a freed
connection goes to the waiting tenant holding the fewest."""

from __future__ import annotations

import asyncio

import pytest

from orbit.storage.fairness import FairGate, GateTimeout


async def _settle() -> None:
    for _ in range(5):
        await asyncio.sleep(0)


async def test_one_tenant_never_holds_more_than_its_share() -> None:
    gate = FairGate(10, share=0.8)
    assert gate.per_tenant == 8
    for _ in range(8):
        await gate.acquire("flood")
    ninth = asyncio.create_task(gate.acquire("flood"))
    await _settle()
    assert not ninth.done()  # 2 connections stay free for the others
    await asyncio.wait_for(gate.acquire("quiet"), 1)
    await asyncio.wait_for(gate.acquire("quiet"), 1)
    gate.release("flood")
    await asyncio.wait_for(ninth, 1)
    assert gate.held == {"flood": 8, "quiet": 2} and gate.in_use == 10


async def test_a_freed_connection_goes_to_the_tenant_holding_fewest() -> None:
    gate = FairGate(4, share=1.0)
    for _ in range(4):
        await gate.acquire("flood")
    floods = [asyncio.create_task(gate.acquire("flood")) for _ in range(50)]
    await _settle()
    quiet = asyncio.create_task(gate.acquire("quiet"))  # queued after fifty flood waiters
    await _settle()
    gate.release("flood")
    await _settle()
    assert quiet.done() and sum(f.done() for f in floods) == 0
    for f in floods:
        f.cancel()
    await asyncio.gather(*floods, return_exceptions=True)
    assert gate._waiting == {}


async def test_small_pools_are_not_capped_and_waits_time_out() -> None:
    gate = FairGate(2)
    assert gate.per_tenant == 2
    await gate.acquire(None)
    await gate.acquire(None)
    with pytest.raises(GateTimeout):
        await gate.acquire(None, 0.05)
    assert gate.in_use == 2 and gate._waiting == {}
    gate.release(None)
    gate.release(None)
    assert gate.in_use == 0 and gate.held == {}


async def test_a_grant_to_a_cancelled_waiter_is_handed_on() -> None:
    gate = FairGate(1)
    await gate.acquire("a")
    waiter = asyncio.create_task(gate.acquire("b"))
    other = asyncio.create_task(gate.acquire("c"))
    await _settle()
    gate.release("a")  # granted to b ...
    waiter.cancel()  # ... which gave up before it could run
    await asyncio.gather(waiter, return_exceptions=True)
    await asyncio.wait_for(other, 1)
    assert gate.held == {"c": 1} and gate.in_use == 1


async def test_a_nested_transaction_is_not_held_back_by_its_tenants_cap() -> None:
    gate = FairGate(5, share=0.5)
    assert gate.per_tenant == 2
    await gate.acquire("t")
    await gate.acquire("t")
    token = gate.hold()
    try:
        await asyncio.wait_for(gate.acquire("t"), 1)  # inside an open transaction
    finally:
        gate.unhold(token)
    assert gate.held == {"t": 3}
