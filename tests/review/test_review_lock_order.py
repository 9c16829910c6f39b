"""Review: the result report of an attempt follows the documented lock order (application
resources → queue → task/attempt → permit → result stream). ``pulse.attempts.report_many``
once locked the task and attempt rows first and only then counted into the application's
and queue's usage rows, so it deadlocked with any transaction that locks in the documented
order (cancel, resolve, deadline sweep, submit); it now takes the usage rows first."""

from __future__ import annotations

import asyncio
import secrets
import sys
from pathlib import Path

import msgspec

from orbit.ids import parse_id
from orbit.storage import Database, LockConflict, Tx
from pulse import attempts, wire
from pulse.attempts import Report
from pulse.dispatch import Dispatcher
from pulse.hub import Hub

# The integration helpers live beside the integration tests.
sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "integration"))
from pulse_worker_support import connect, open_session


async def test_report_takes_usage_rows_before_the_task_row(db: Database, tenant) -> None:
    t = await tenant()
    task = await t.submit(kind="k", payload={"n": 1})
    hub = Hub(f"review-{secrets.token_hex(4)}")
    info, _ = await open_session(db, t)
    conn = await connect(db, hub, info)
    assert await Dispatcher(db, hub).dispatch_to(conn) == 1
    [offer] = conn.take_offers()
    aid = parse_id(offer.attempt_id)
    assert aid is not None
    started = await attempts.start(db, t.namespace_id, info.session_id, aid)
    assert isinstance(started, wire.Started)

    holder_has_app = asyncio.Event()
    release = asyncio.Event()
    outcome: dict[str, object] = {}

    async def holder(tx: Tx) -> None:  # cancel's order: application, queue, then the task
        await tx.execute(
            "SELECT application_id FROM orbit_application_resources"
            " WHERE application_id = %s FOR UPDATE",
            (t.application_id,),
        )
        holder_has_app.set()
        await release.wait()
        try:
            await tx.execute(
                "SELECT id FROM pulse_tasks WHERE namespace_id = %s AND id = %s FOR UPDATE",
                (t.namespace_id, bytes.fromhex(task["id"])),
            )
            outcome["holder"] = "ok"
        except LockConflict as exc:
            outcome["holder"] = exc.code

    hold = asyncio.create_task(db.transaction(holder, retries=0))
    await holder_has_app.wait()
    rep = Report("complete", aid, started.execution_token, result=msgspec.Raw(b"1"))
    reporting = asyncio.create_task(attempts.report(db, t.namespace_id, rep))
    await asyncio.sleep(0.5)  # the report now waits for a row the holder has
    release.set()
    await hold
    receipt = await reporting
    assert receipt.task_state == "SUCCEEDED"
    assert outcome["holder"] == "ok", f"the holder was a deadlock victim: {outcome}"
