"""Coalesced hand-out probes (orbit.delivery_pump.LeaseProbes): the probes of a node's
consumers asked for in the same turn of the event loop (idle subscription streams poll on a
shared tick) go out as ONE statement, and each gets exactly what its own probe would say."""

from __future__ import annotations

import asyncio

import msgspec
import pytest
from subscription_fixtures import SubTenant, append_results, make_tenant

from orbit import delivery_pump, subscriptions
from orbit.audit import CLI_ACTOR
from orbit.http.subscription_stream import _until_tick
from orbit.ids import new_id
from orbit.storage import Database
from orbit.store import deliveries as dstore
from orbit.subscriptions import SubscriptionPut


async def _sub(db: Database, t: SubTenant, name: str, **kw: object):
    body = msgspec.convert({"start": "earliest", **kw}, SubscriptionPut)
    row, *_ = await subscriptions.put_subscription(db, CLI_ACTOR, t.namespace_id, name, body)
    return row


async def test_probes_of_one_turn_go_out_as_one_statement(db: Database) -> None:
    a, b = await make_tenant(db), await make_tenant(db)
    subs = [(a, await _sub(db, a, f"s{i}", max_in_flight=2)) for i in range(3)]
    subs += [(b, await _sub(db, b, "s", max_in_flight=5))]
    await append_results(db, a.namespace_id, 3)
    got = await delivery_pump.lease(db, a.namespace_id, subs[0][1].id, 10)  # s0: 2 in flight
    assert len(got.deliveries) == 2
    probes = delivery_pump.LeaseProbes(db)
    keys = [(t.namespace_id, s.id) for t, s in subs] + [(a.namespace_id, new_id())]
    seen = await asyncio.gather(*(probes.probe(ns, sid) for ns, sid in keys))
    assert (probes.statements, probes.probed) == (1, 5)
    assert seen[-1] is None  # a subscription that does not exist
    for (ns, sid), mine in zip(keys[:-1], seen[:-1], strict=True):
        alone = await db.read(lambda tx, ns=ns, sid=sid: dstore.delivery_lease_probe(tx, ns, sid))
        assert mine == alone
    (row0, p0), (row1, p1), (_, pb) = seen[0], seen[1], seen[3]
    # s0: two handed out, the cursor stopped before the third event (left for later)
    assert (row0.after_seq, p0.last_seq, p0.due, p0.in_flight) == (2, 3, False, 2)
    assert (row1.after_seq, p1.last_seq, p1.in_flight) == (0, 3, 0)  # behind: to hand out
    assert pb.idle(0) and pb.last_seq == 0  # the other namespace has no results
    # A second turn: a new statement; a lease() through the probes hands out as before.
    batch = await delivery_pump.lease(db, a.namespace_id, subs[1][1].id, 10, probes=probes)
    assert [d.seq for d in batch.deliveries] == [1, 2] and probes.statements == 2
    idle = await delivery_pump.lease(db, b.namespace_id, subs[3][1].id, 10, probes=probes)
    assert idle.deliveries == [] and probes.statements == 3


async def test_a_failed_probe_statement_fails_only_its_probes(
    db: Database, monkeypatch: pytest.MonkeyPatch
) -> None:
    t = await make_tenant(db)
    sub = await _sub(db, t, "s")
    probes = delivery_pump.LeaseProbes(db)
    real = dstore.delivery_lease_probe_many
    calls = 0

    async def flaky(tx, keys):  # type: ignore[no-untyped-def]
        nonlocal calls
        calls += 1
        if calls == 1:
            raise RuntimeError("boom")
        return await real(tx, keys)

    monkeypatch.setattr(dstore, "delivery_lease_probe_many", flaky)
    with pytest.raises(RuntimeError, match="boom"):
        await probes.probe(t.namespace_id, sub.id)
    again = await probes.probe(t.namespace_id, sub.id)
    assert again is not None and again[0].id == sub.id


def test_idle_streams_share_a_polling_tick() -> None:
    for period in (0.5, 0.05, 2.0):
        for _ in range(50):
            wait = _until_tick(period)
            assert period / 10 <= wait <= period * 1.1 + 1e-9
