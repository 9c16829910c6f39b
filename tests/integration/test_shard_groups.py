"""The shard-group guard (tests/shard_guard.py) on real transactions.

The node-wide ack round serves two namespaces in ONE transaction. Under the default map (one
shard group: a single database or a Galera cluster) that is legal; under a map that puts the
two namespaces on different shards it is exactly the transaction a sharded deployment could
not run, and the guard reports it; under the per-application map it is legal again when both
namespaces belong to one application, which is the layout docs/deployment.md proposes."""

from __future__ import annotations

import contextlib
import secrets
from collections.abc import Iterator

import msgspec
import shard_guard
from hypothesis import given
from hypothesis import strategies as st
from subscription_fixtures import append_results, make_tenant

from orbit import deliveries, delivery_pump, subscriptions
from orbit.audit import CLI_ACTOR
from orbit.bootstrap import bootstrap
from orbit.deliveries import AckItem
from orbit.namespaces import insert_namespace
from orbit.storage import Database, Tx
from orbit.subscriptions import SubscriptionPut


@contextlib.contextmanager
def guarded(spec: str) -> Iterator[shard_guard.Guard]:
    """A fresh guard with shard map ``spec`` for the Tx objects made meanwhile."""
    if shard_guard.install({}) is None:  # switched off (ORBIT_SHARD_GUARD=0): install anyway
        import pytest

        pytest.skip("shard guard switched off")
    previous = shard_guard.GUARD
    assert previous is not None
    shard_guard.GUARD = g = shard_guard.Guard(spec=spec, registry=previous.registry, names=previous.names)
    try:
        yield g
    finally:
        shard_guard.GUARD = previous


async def _ack_round_of(db: Database, namespaces: list[bytes]) -> None:
    items = []
    for ns in namespaces:
        body = msgspec.convert({"start": "earliest"}, SubscriptionPut)
        sub, *_ = await subscriptions.put_subscription(db, CLI_ACTOR, ns, f"s{secrets.token_hex(3)}", body)
        await append_results(db, ns, 2)
        for d in (await delivery_pump.lease(db, ns, sub.id, 10)).deliveries:
            items.append(AckItem(ns, d.delivery_id, d.proof))
    await deliveries.ack_round(db, items)


async def test_a_cross_namespace_round_is_one_group_by_default(db: Database) -> None:
    a, b = await make_tenant(db), await make_tenant(db)
    with guarded("single") as g:
        await _ack_round_of(db, [a.namespace_id, b.namespace_id])
    assert g.multi_namespace >= 1 and g.widest == 2
    assert g.violations == []


async def test_the_same_round_spans_two_groups_under_a_per_namespace_map(db: Database) -> None:
    a, b = await make_tenant(db), await make_tenant(db)
    with guarded("namespace") as g:
        await _ack_round_of(db, [a.namespace_id, b.namespace_id])
    assert len(g.violations) == 1
    groups, names = g.violations[0]
    assert sorted(groups) == sorted([a.namespace_id.hex(), b.namespace_id.hex()])
    assert any("deliver" in n for n in names), names  # the round's statements on deliveries


async def test_per_application_map_keeps_an_applications_namespaces_together(db: Database) -> None:
    res = await bootstrap(db, f"shard-{secrets.token_hex(4)}", "one")

    async def second(tx: Tx) -> bytes:
        row = await insert_namespace(tx, CLI_ACTOR, res.application_id, "two")
        return row.id

    two = await db.transaction(second)
    other = await make_tenant(db)
    with guarded("application") as g:
        await _ack_round_of(db, [res.namespace_id, two])
    assert g.widest == 2 and g.violations == []
    with guarded("application") as g:
        await _ack_round_of(db, [res.namespace_id, other.namespace_id])
    assert len(g.violations) == 1


@given(st.lists(st.binary(min_size=16, max_size=16), min_size=1, max_size=6, unique=True), st.integers(1, 4))
def test_hash_map_flags_exactly_the_transactions_that_span_groups(ids: list[bytes], n: int) -> None:
    reg = shard_guard.Registry({i: None for i in ids})
    g = shard_guard.Guard(spec=f"hash:{n}", registry=reg)
    trace = g.begin()
    for i in ids:
        g.see(trace, "SELECT 1 FROM t WHERE namespace_id = %(namespace_id)s", {"namespace_id": i})
    g.end(trace)
    groups = {g.shard(i) for i in ids}
    assert (len(g.violations) == 1) == (len(groups) > 1)
