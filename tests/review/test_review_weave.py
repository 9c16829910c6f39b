"""Review tests of Weave: event order across a resume with a large deferred backlog, and
identity keys that MariaDB's PAD SPACE collation would merge."""

from __future__ import annotations

import sys
from datetime import timedelta
from pathlib import Path

import pytest

from orbit.errors import InvalidRequest
from orbit.storage import Database
from weave import instances
from weave.advancer import Advancer, AdvancerSettings

# The integration helpers live beside the integration tests.
sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "integration"))
from weave_engine_support import Flow


async def test_events_wait_behind_deferred_advances_after_resume(
    db: Database, tenant, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The timer fired while paused (deferred); after the resume a signal arrives. With more
    deferred advances left than one advance applies, the signal must not overtake the timer:
    the wait TIMED_OUT, the late signal is kept unmatched."""
    monkeypatch.setattr(instances, "RESUME_BATCH", 1)  # a small stand-in for a big backlog
    flow = await Flow.create(db, await tenant())
    doc = {"steps": [{"id": "w", "type": "wait_signal", "signal": "go", "timeout_ms": 1000},
                     {"id": "done", "type": "succeed"}]}  # fmt: skip
    t0 = await db.now()
    later = t0 + timedelta(seconds=5)
    name = await flow.publish(doc)
    status, inst = await flow.start_named(name, None, now=t0)
    assert status == 201
    iid, ns = inst["id"], flow.t.namespace_id
    await instances.pause_instance(db, ns, iid, now=t0)
    for i in range(3):  # deferred advances that change nothing (no wait for "noise")
        await flow.signal(iid, "noise", i, now=t0)
    assert await flow.timers.run_once(now=later) == 1  # the timeout fires while paused
    await Advancer(db, settings=AdvancerSettings(batch=100)).run_once(now=later)  # all deferred
    assert (await instances.resume_instance(db, ns, iid, now=later)).state == "RUNNING"
    await flow.signal(iid, "go", "too late", now=later)  # arrives after the timer fired
    small = Advancer(db, settings=AdvancerSettings(batch=2))
    for _ in range(6):
        await small.run_once(now=later)
    got = await flow.instance(iid)
    assert {s["step"]: s["state"] for s in got["steps"]}["w"] == "TIMED_OUT", got
    hist = await flow.history(iid)
    go = [s for s in hist["signals"] if s["name"] == "go"]
    assert go and go[0]["matched_wait_id"] is None


async def test_business_key_with_trailing_space_is_not_another_instances_key(
    db: Database, tenant
) -> None:
    """utf8mb4_bin pads with spaces: "order-1 " would silently return the instance of
    "order-1" as a deduplicated start. It is refused (400), as Pulse refuses such dedup keys."""
    flow = await Flow.create(db, await tenant())
    name = await flow.publish({"steps": [{"id": "w", "type": "wait_signal", "signal": "go"}]})
    status, first = await flow.start_named(name, None, business_key="order-1")
    assert status == 201
    with pytest.raises(InvalidRequest) as exc:
        await flow.start_named(name, None, business_key="order-1 ")
    assert exc.value.details["field"] == "business_key"
    status, again = await flow.start_named(name, None, business_key="order-1")
    assert status == 200 and again["id"] == first["id"]


@pytest.mark.parametrize("field", ["signal_id", "correlation_key"])
async def test_signal_keys_with_trailing_space_are_refused(
    db: Database, tenant, field: str
) -> None:
    """A signal_id "s-1 " would replay the signal "s-1" (200) and a correlation key "k "
    would match a wait for "k": both are refused (400) instead."""
    flow = await Flow.create(db, await tenant())
    name = await flow.publish({"steps": [{"id": "w", "type": "wait_signal", "signal": "go"}]})
    _, inst = await flow.start_named(name, None)
    status, _ = await flow.signal(inst["id"], "go", 1, signal_id="s-1", correlation_key="k")
    assert status == 201
    kw = {"signal_id": "s-1", "correlation_key": "k"}
    kw[field] = kw[field] + " "
    with pytest.raises(InvalidRequest) as exc:
        await flow.signal(inst["id"], "go", 1, **kw)
    assert exc.value.details["field"] == field
