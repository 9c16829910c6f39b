"""The node's worker-frame slots: a tenant alone may use nearly all of them (work-conserving),
and while another tenant waits, a freed slot goes to the waiting tenant holding the fewest."""

from __future__ import annotations

import asyncio

from pulse.http.admission import Admission, AdmissionSettings


async def test_a_tenant_alone_uses_most_of_the_node_and_a_waiting_tenant_is_served_next() -> None:
    adm = Admission(AdmissionSettings(frame_slots=100, tenant_frame_share_pct=80))
    a, b = adm.tenant_slots(b"a" * 16), adm.tenant_slots(b"b" * 16)
    for _ in range(80):  # far beyond a fixed per-tenant cap of 64: nobody else is waiting
        await asyncio.wait_for(a.acquire(), 1)
    more_a = asyncio.create_task(a.acquire())  # at its share: waits
    await asyncio.sleep(0.01)
    assert not more_a.done()
    for _ in range(20):  # the rest of the node is the other tenant's
        await asyncio.wait_for(b.acquire(), 1)
    b_waits = asyncio.create_task(b.acquire())
    await asyncio.sleep(0.01)
    assert not b_waits.done()
    a.release()  # a freed slot goes to b (it holds 20), not to a (79)
    await asyncio.wait_for(b_waits, 1)
    assert not more_a.done()
    b.release()
    await asyncio.wait_for(more_a, 1)
