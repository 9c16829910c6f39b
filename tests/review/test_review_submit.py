"""Review: submission follows the lock order (application resources → queue → task). A
submit with a dedup key locks the queue's usage row to serialise identical submits; it must
not then wait for the application's row while holding the queue's, or it deadlocks with
every transaction that takes them in the documented order (cancel, start, recovery)."""

from __future__ import annotations

import asyncio

import msgspec

from orbit.storage import Database, LockConflict, Tx
from pulse import submit
from pulse.types import TaskSubmit


async def test_dedup_submit_takes_the_application_row_before_the_queue_row(
    db: Database, tenant
) -> None:
    t = await tenant()  # no task quota on the application: its row is only counted into
    holder_has_app = asyncio.Event()
    release = asyncio.Event()
    outcome: dict[str, object] = {}

    async def holder(tx: Tx) -> None:
        # The documented order: the application's row, then the queue's usage row.
        await tx.execute(
            "SELECT application_id FROM orbit_application_resources"
            " WHERE application_id = %s FOR UPDATE",
            (t.application_id,),
        )
        holder_has_app.set()
        await release.wait()
        try:
            await tx.execute(
                "SELECT queue_id FROM pulse_queue_usage"
                " WHERE namespace_id = %s AND queue_id = %s FOR UPDATE",
                (t.namespace_id, t.queue_id),
            )
            outcome["holder"] = "ok"
        except LockConflict as exc:
            outcome["holder"] = exc.code

    hold = asyncio.create_task(db.transaction(holder, retries=0))
    await holder_has_app.wait()
    body = msgspec.json.decode(
        b'{"queue": "default", "kind": "k", "dedup_key": "d-1"}', type=TaskSubmit
    )
    sub = asyncio.create_task(submit.submit_one(db, t.namespace_id, t.application_id, body))
    await asyncio.sleep(0.5)  # the submit is now waiting for a lock the holder has
    release.set()
    await hold
    res = await sub
    assert outcome["holder"] == "ok", f"the holder was a deadlock victim: {outcome}"
    assert res.status == 201
