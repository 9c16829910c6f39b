"""The idle-latency offer (pulse/submit_offer.py): a submit leases its new task to a session
waiting on this node inside its own transaction, pushes the offer after COMMIT, and leaves
to dispatch everything dispatch would judge differently (older due work, a full session,
keyed and delayed tasks, a paused gate, a quota) — and never waits for a session row.
"""

from __future__ import annotations

import asyncio
import time
from typing import Any

import msgspec
import pytest
from fair_dispatch_support import set_max_reservations
from pulse_worker_support import check_invariants, connect, open_session, task_row

from orbit.ids import parse_id
from orbit.storage import Tx
from pulse import attempts, queues, wire
from pulse import submit as submit_service
from pulse.dispatch import Dispatcher
from pulse.hub import Hub
from pulse.submit_offer import IdleOffer
from pulse.types import TaskSubmit


@pytest.fixture
def hub() -> Hub:
    return Hub("node-offer")


def _body(t: Any, **fields: Any) -> TaskSubmit:
    fields.setdefault("queue", t.queue)
    fields.setdefault("kind", "k")
    raw = msgspec.json.encode({**fields, "payload": fields.pop("payload", {"n": 1})})
    return msgspec.json.decode(raw, type=TaskSubmit)


async def _submit(db: Any, t: Any, hub: Hub, **fields: Any) -> dict[str, Any]:
    """One single submit through the round, with the node's idle offer."""
    item = submit_service.SingleSubmit(_body(t, **fields))
    (res,) = await submit_service.submit_round(
        db, [(t.namespace_id, t.application_id, item)], offer=IdleOffer(hub)
    )
    assert not isinstance(res, Exception), res
    return res.json()  # type: ignore[no-any-return]


async def test_a_waiting_session_gets_the_new_task_in_the_submit(db, tenant, hub) -> None:
    t = await tenant()
    conn = await connect(db, hub, (await open_session(db, t))[0])
    task = await _submit(db, t, hub)
    # The answer is the task as committed: leased to the session, one revision on.
    assert task["state"] == "LEASED" and task["revision"] == 2
    (offer,) = conn.take_offers()
    assert offer.task.id == task["id"] and offer.task.generation == 1
    row = await task_row(db, t, task["id"])
    assert row["state"] == "LEASED" and row["session_id"] == conn.info.session_id
    # No dispatch transaction was needed: the offer starts through its session.
    started = await attempts.start(
        db, t.namespace_id, conn.info.session_id, parse_id(offer.attempt_id)
    )
    assert isinstance(started, wire.Started) and started.attempt_id == offer.attempt_id
    assert (await task_row(db, t, task["id"]))["state"] == "RUNNING"
    await check_invariants(db, t.namespace_id)


async def test_older_due_work_and_a_full_session_are_left_to_dispatch(db, tenant, hub) -> None:
    t = await tenant()
    older = await t.submit()  # WAITING, due: the queue's order comes first
    conn = await connect(db, hub, (await open_session(db, t, max_concurrency=1))[0])
    newer = await _submit(db, t, hub)
    assert newer["state"] == "WAITING" and conn.take_offers() == []
    # Dispatch serves the queue in order; the session is then full.
    assert await Dispatcher(db, hub).run_once() == 1
    assert [o.task.id for o in conn.take_offers()] == [older["id"]]
    third = await _submit(db, t, hub, queue=t.queue)
    assert third["state"] == "WAITING" and conn.take_offers() == []
    await check_invariants(db, t.namespace_id)


async def test_keyed_delayed_and_paused_tasks_are_left_to_dispatch(db, tenant, hub) -> None:
    t = await tenant()
    conn = await connect(
        db, hub, (await open_session(db, t, max_concurrency=8, concurrency_keys=True))[0]
    )
    keyed = await _submit(db, t, hub, concurrency_key="k1")
    assert keyed["state"] == "WAITING"
    # The keyed task is due: the next one waits behind it for dispatch.
    assert await Dispatcher(db, hub).run_once() == 1
    conn.take_offers()
    delayed = await _submit(db, t, hub, delay_ms=60_000)
    assert delayed["state"] == "WAITING" and conn.take_offers() == []
    await queues.set_queue_paused(db, t.namespace_id, t.queue, True)
    paused = await _submit(db, t, hub)
    assert paused["state"] == "WAITING" and conn.take_offers() == []
    await queues.set_queue_paused(db, t.namespace_id, t.queue, False)
    await check_invariants(db, t.namespace_id)


async def test_the_owners_reservation_quota_holds(db, tenant, hub) -> None:
    t = await tenant()
    conn = await connect(db, hub, (await open_session(db, t, max_concurrency=8))[0])
    await set_max_reservations(db, t.application_id, 1)
    first = await _submit(db, t, hub)
    assert first["state"] == "LEASED" and len(conn.take_offers()) == 1
    second = await _submit(db, t, hub)  # the quota allows one offered attempt
    assert second["state"] == "WAITING" and conn.take_offers() == []
    await check_invariants(db, t.namespace_id)


async def test_a_session_held_by_dispatch_is_skipped_without_waiting(db, tenant, hub) -> None:
    t = await tenant()
    conn = await connect(db, hub, (await open_session(db, t))[0])
    locked, release = asyncio.Event(), asyncio.Event()

    async def hold(tx: Tx) -> None:  # as a dispatch transaction serving the session does
        await tx.execute(
            "SELECT id FROM pulse_worker_sessions WHERE namespace_id = %s AND id = %s FOR UPDATE",
            (t.namespace_id, conn.info.session_id),
        )
        locked.set()
        await release.wait()

    holder = asyncio.create_task(db.transaction(hold))
    await locked.wait()
    try:
        t0 = time.monotonic()
        task = await _submit(db, t, hub)
        waited = time.monotonic() - t0
    finally:
        release.set()
        await holder
    # Left WAITING for dispatch, and answered without waiting out the other lock (the
    # lock wait timeout is tens of seconds; the bound here only tells waiting from not).
    assert task["state"] == "WAITING" and conn.take_offers() == []
    assert waited < 5.0
    assert await Dispatcher(db, hub).run_once() == 1
    assert [o.task.id for o in conn.take_offers()] == [task["id"]]
    await check_invariants(db, t.namespace_id)


async def test_sessions_of_another_namespace_or_node_get_nothing(db, tenant, hub) -> None:
    t = await tenant()
    other = await tenant()
    foreign = await connect(db, hub, (await open_session(db, other))[0])
    elsewhere = Hub("node-other")
    await connect(db, elsewhere, (await open_session(db, t))[0])
    task = await _submit(db, t, hub)
    assert task["state"] == "WAITING" and foreign.take_offers() == []
    await check_invariants(db, t.namespace_id)
