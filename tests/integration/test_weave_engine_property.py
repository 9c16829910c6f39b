"""Hypothesis over random valid definitions (the generator of tests/unit/test_weave_graphs.py):
whatever the definition and whatever its tasks, signals and timers do, an instance whose tasks
complete always ends in a terminal state, with nothing left running behind it."""

from __future__ import annotations

import importlib.util
import random
import sys
from datetime import timedelta
from pathlib import Path
from types import ModuleType
from typing import Any

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from pulse_fixtures import make_tenant
from weave_engine_support import Fail, Flow

from orbit.storage import Database

GRAPHS = Path(__file__).resolve().parents[1] / "unit" / "test_weave_graphs.py"


def _load(path: Path) -> ModuleType:
    spec = importlib.util.spec_from_file_location("weave_graphs_for_engine", path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module


graphs = _load(GRAPHS)
INPUT = {"a": 1, "n": 5, "k": 1, "x": 0}
TERMINAL = {"SUCCEEDED", "FAILED", "CANCELLED"}


def handler(rng: random.Random) -> Any:
    def run(kind: str, payload: Any) -> Any:
        if kind == "status":  # poll rounds: output_schema {"done": bool}
            return {"done": rng.random() < 0.4}
        return Fail("random") if rng.random() < 0.25 else {"ok": payload}

    return run


@settings(
    max_examples=30,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture],
)
@given(doc=graphs.definitions(max_units=4), seed=st.integers(0, 2**32))
async def test_instances_of_random_definitions_always_end(
    db: Database, doc: dict[str, Any], seed: int
) -> None:
    rng = random.Random(seed)
    t = await make_tenant(db, queue="q", retry={"max_attempts": 1})
    flow = await Flow.create(db, t, queues=[])
    flow.queues = ["q"]
    now = await db.now()
    name = await flow.publish(doc)
    status, inst = await flow.start_named(name, INPUT, now=now)
    assert status == 201
    iid = inst["id"]
    work = handler(rng)
    for _ in range(300):
        moved = await flow.timers.run_once(now=now)
        moved += (await flow.advancer.run_once(now=now)).processed
        moved += await flow.work(work, now=now)
        state = (await flow.instance(iid))["state"]
        if state in TERMINAL:
            break
        waits = await flow.rows(
            "SELECT signal_name, correlation_key FROM weave_waits WHERE namespace_id = %s"
            " AND instance_id = %s AND state = 'OPEN' AND kind = 'signal'",
            bytes.fromhex(iid),
        )
        for w in waits:
            if rng.random() < 0.5:
                await flow.signal(iid, w["signal_name"], {"s": 1}, now=now)
                moved += 1
        if not moved:
            now += timedelta(seconds=11)  # fires every sleep and signal timeout
    else:
        raise AssertionError(f"instance did not end: {await flow.instance(iid)}")

    # Nothing is left running behind a terminal instance.
    await flow.settle(work, now=now)
    got = await flow.instance(iid)
    assert got["state"] in TERMINAL
    assert all(s["state"] != "RUNNING" for s in got["steps"]), got["steps"]
    if got["state"] != "SUCCEEDED":
        assert got["output"] is None and got["error"] is not None
    left = await flow.rows(
        "SELECT (SELECT COUNT(*) FROM weave_waits WHERE namespace_id = %s AND instance_id = %s"
        "        AND state = 'OPEN') AS waits,"
        " (SELECT COUNT(*) FROM weave_activations WHERE namespace_id = %s AND instance_id = %s"
        "        AND state = 'RUNNING') AS acts,"
        " (SELECT COUNT(*) FROM weave_inbox WHERE namespace_id = %s AND instance_id = %s"
        "        AND processed_at IS NULL) AS events",
        bytes.fromhex(iid), t.namespace_id, bytes.fromhex(iid), t.namespace_id, bytes.fromhex(iid),
    )  # fmt: skip
    assert left[0] == {"waits": 0, "acts": 0, "events": 0}
    tasks = await flow.tasks_of(iid)
    assert all(x["state"] in TERMINAL for x in tasks), tasks
    # Each step ran at most once; its steps appear in history order.
    seqs = [s["seq"] for s in got["steps"]]
    assert seqs == sorted(seqs) and len(set(s["step"] for s in got["steps"])) == len(seqs)
