"""Concurrency keys at dispatch (docs/dispatch.md "Concurrency keys"): a keyed task is only
offered to a session that handles keys, only while its key is not held to its limit
(``pulse_concurrency_limits.held >= max_permits``), and never together with another task of
the same key in one batch — on the queue-wide claim and on the per-owner claims."""

from __future__ import annotations

import hashlib
from collections import Counter

import pytest
from fair_dispatch_support import add_owner, submit_as
from pulse_worker_support import check_invariants, connect, open_session

from orbit.ids import new_id
from orbit.storage import Tx
from pulse.dispatch import Dispatcher
from pulse.hub import Hub

PATHS = pytest.mark.parametrize("owners", [1, 2], ids=["queue_claim", "owner_claims"])


@pytest.fixture
def hub() -> Hub:
    return Hub("node-keys")


def digest(key: str) -> bytes:
    return hashlib.sha256(key.encode("utf-8")).digest()


async def set_held(db, namespace_id: bytes, key: str, held: int, max_permits: int = 1) -> None:
    """The key's limits row as the start-time permits keep it (one row per key digest)."""

    async def run(tx: Tx) -> None:
        await tx.execute(
            "INSERT INTO pulse_concurrency_limits (namespace_id, id, key_digest,"
            " concurrency_key, max_permits, held, updated_at)"
            " VALUES (%s, %s, %s, %s, %s, %s, UTC_TIMESTAMP(6))"
            " ON DUPLICATE KEY UPDATE held = VALUES(held), max_permits = VALUES(max_permits)",
            (namespace_id, new_id(), digest(key), key, max_permits, held),
        )

    await db.transaction(run)


async def _submit(db, t, owner: bytes | None, **fields):
    if owner is None or owner == t.application_id:
        return await t.submit(**fields)
    return await submit_as(db, t, owner, **fields)


@PATHS
async def test_one_task_per_key_in_a_batch(db, tenant, hub, owners) -> None:
    t = await tenant()
    who = [t.application_id] + [await add_owner(db) for _ in range(owners - 1)]
    for owner in who:
        for _ in range(3):
            await _submit(db, t, owner, concurrency_key="k1")
        await _submit(db, t, owner, concurrency_key="k2")
        await _submit(db, t, owner)
    info, _ = await open_session(db, t, max_concurrency=20, concurrency_keys=True)
    conn = await connect(db, hub, info)
    d = Dispatcher(db, hub)
    got = await d.dispatch_to(conn)
    keys = Counter(o.task.concurrency_key for o in conn.take_offers())
    assert keys["k1"] == 1 and keys["k2"] == 1 and keys[None] == owners
    assert got == 2 + owners
    # The next batch may offer another k1 task (the key is held only from a start, by the
    # start-time permits); still one per batch.
    await d.dispatch_to(conn)
    keys = Counter(o.task.concurrency_key for o in conn.take_offers())
    assert keys["k1"] == 1 and keys["k2"] <= 1
    await check_invariants(db, t.namespace_id)


@PATHS
async def test_held_key_is_skipped_until_released(db, tenant, hub, owners) -> None:
    t = await tenant()
    who = [t.application_id] + [await add_owner(db) for _ in range(owners - 1)]
    k1 = [await _submit(db, t, o, concurrency_key="k1") for o in who]
    k2 = [await _submit(db, t, o, concurrency_key="k2") for o in who]
    await set_held(db, t.namespace_id, "k1", held=1)
    await set_held(db, t.namespace_id, "k2", held=1, max_permits=2)  # one permit left
    info, _ = await open_session(db, t, max_concurrency=20, concurrency_keys=True)
    conn = await connect(db, hub, info)
    d = Dispatcher(db, hub)
    assert await d.dispatch_to(conn) == 1
    (offer,) = conn.take_offers()
    assert offer.task.id in {x["id"] for x in k2}
    assert await d.dispatch_to(conn) == (1 if owners == 2 else 0)  # k2 again, next batch
    conn.take_offers()
    await set_held(db, t.namespace_id, "k1", held=0)
    assert await d.dispatch_to(conn) == 1
    (offer,) = conn.take_offers()
    assert offer.task.id in {x["id"] for x in k1}
    await check_invariants(db, t.namespace_id)


async def test_session_without_keys_gets_no_keyed_task(db, tenant, hub) -> None:
    t = await tenant()
    b = await add_owner(db)
    await t.submit(concurrency_key="k1")
    await submit_as(db, t, b, concurrency_key="k2")
    plain = await submit_as(db, t, b)
    info, _ = await open_session(db, t, max_concurrency=10, concurrency_keys=False)
    conn = await connect(db, hub, info)
    assert await Dispatcher(db, hub).dispatch_to(conn) == 1
    assert [o.task.id for o in conn.take_offers()] == [plain["id"]]
