"""Property: under random interleavings of submit / dispatch / start / complete / fail /
lose (recovery) / offer expiry / limit changes, no permit counter ever drifts from the rows
it counts (recount after every step), the limits hold at every grant, and keyed tokens
strictly increase per key."""

from __future__ import annotations

from datetime import timedelta
from typing import Any

import pytest
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st
from permits_support import (
    check_permit_counters,
    complete,
    fail,
    rows,
    set_app_limits,
    start_all,
)
from pulse_fixtures import make_tenant
from pulse_worker_support import check_invariants, connect, open_session

from orbit.ids import parse_id
from orbit.storage import Database
from pulse import wire
from pulse.dispatch import Dispatcher
from pulse.hub import Hub
from pulse.recovery import recover_attempt

KEYS = [None, "a", "b", "é", "e\u0301"]  # the last two: NFC vs NFD, different keys
OPS = st.lists(
    st.tuples(
        st.sampled_from(
            ["submit", "submit", "submit", "dispatch", "dispatch", "start", "start", "start",
             "complete", "complete", "fail", "lose", "expire_offer", "limit"]
        ),
        st.integers(0, 10_000),
    ),
    min_size=10,
    max_size=50,
)  # fmt: skip


#: Keyed grants per example (a sanity check that the examples exercise keys).
STATS: list[int] = []


async def _running_by_queue(db: Database, ns: bytes) -> dict[bytes, int]:
    found = await rows(
        db,
        "SELECT queue_id, COUNT(*) AS n FROM pulse_tasks WHERE namespace_id = %s"
        " AND state = 'RUNNING' GROUP BY queue_id",
        ns,
    )
    return {r["queue_id"]: int(r["n"]) for r in found}


@settings(
    max_examples=25,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture],
)
@given(ops=OPS)
# Always run (whatever Hypothesis draws): two keyed tasks of one key, one after the other.
@example(ops=[("submit", 1), ("submit", 1), ("dispatch", 0), ("start", 3), ("complete", 0),
              ("dispatch", 0), ("start", 3), ("lose", 0), ("submit", 2), ("dispatch", 0),
              ("start", 0), ("fail", 1)])  # fmt: skip
async def test_permit_counters_never_drift(db: Database, ops: list[tuple[str, int]]) -> None:
    hub = Hub("node-permits-property")
    t = await make_tenant(db, max_concurrency=2)
    rated = await t.add_queue("rated", max_starts_per_second=2)
    app_limit = 3
    await set_app_limits(db, t, max_active_attempts=app_limit)
    limits: dict[bytes, int | None] = {t.queue_id: 2, rated: None}
    conns = []
    for _ in range(2):
        info, _ = await open_session(
            db, t, queues=[t.queue, "rated"], max_concurrency=6, concurrency_keys=True
        )
        conns.append(await connect(db, hub, info))
    offered: list[tuple[Any, wire.Offer]] = []
    running: list[wire.Started] = []
    tokens: dict[str, list[int]] = {}
    key_of: dict[str, str | None] = {}
    for op, n in ops:
        if op == "submit":
            key = KEYS[n % len(KEYS)]
            queue = t.queue if (n // 7) % 2 == 0 else "rated"
            task = await t.submit(concurrency_key=key, queue=queue, retry_safe=bool(n % 2))
            key_of[task["id"]] = key
        elif op == "dispatch":
            for c in conns:
                await Dispatcher(db, hub).dispatch_to(c)
                offered += [(c, o) for o in c.take_offers()]
        elif op == "start" and offered:
            k = 1 + n % 4
            batch, offered = offered[:k], offered[k:]
            by_conn: dict[int, list[wire.Offer]] = {}
            for c, o in batch:
                by_conn.setdefault(id(c), []).append(o)
            for c in conns:
                if id(c) not in by_conn:
                    continue
                before = await _running_by_queue(db, t.namespace_id)
                replies = await start_all(db, t, c, by_conn[id(c)])
                after = await _running_by_queue(db, t.namespace_id)
                for qid, limit in limits.items():
                    if limit is not None:  # a lowered limit revokes nothing, grants nothing
                        assert after.get(qid, 0) <= max(limit, before.get(qid, 0))
                assert sum(after.values()) <= max(app_limit, sum(before.values()))
                for o, r in zip(by_conn[id(c)], replies, strict=True):
                    if isinstance(r, wire.Started):
                        running.append(r)
                        key = key_of[o.task.id]
                        assert (r.concurrency_token is None) == (key is None)
                        if key is not None:
                            assert r.concurrency_token is not None
                            seen = tokens.setdefault(key, [])
                            assert not seen or r.concurrency_token > seen[-1]
                            seen.append(r.concurrency_token)
        elif op in ("complete", "fail", "lose") and running:
            s = running.pop(n % len(running))
            # Every attempt in ``running`` is current: a stale token here would be a bug.
            if op == "complete":
                await complete(db, t, s)
            elif op == "fail":
                await fail(db, t, s, retryable=bool(n % 2))
            else:
                late = await db.now() + timedelta(minutes=30)
                outcome = await recover_attempt(
                    db, t.namespace_id, parse_id(s.attempt_id), reason="lease_expired", now=late
                )
                assert outcome == "lost"
        elif op == "expire_offer" and offered:
            c, o = offered.pop(n % len(offered))
            late = await db.now() + timedelta(minutes=30)
            await recover_attempt(
                db, t.namespace_id, parse_id(o.attempt_id), reason="offer_expired", now=late
            )
        elif op == "limit":
            new = 1 + n % 3
            await t.add_queue(t.queue, max_concurrency=new)
            limits[t.queue_id] = new
        await check_permit_counters(db, [t.namespace_id], t.application_id)
    await check_invariants(db, t.namespace_id)
    # Stored tokens per key: strictly increasing in start order, never reused.
    stored = await rows(
        db,
        "SELECT t.concurrency_key_digest AS k, a.concurrency_token AS token FROM pulse_attempts a"
        " JOIN pulse_tasks t ON t.namespace_id = a.namespace_id AND t.id = a.task_id"
        " WHERE a.namespace_id = %s AND a.concurrency_token IS NOT NULL"
        " ORDER BY a.started_at, a.concurrency_token",
        t.namespace_id,
    )
    per_key: dict[bytes, list[int]] = {}
    for r in stored:
        per_key.setdefault(bytes(r["k"]), []).append(int(r["token"]))
    for seq in per_key.values():
        assert seq == sorted(set(seq))
    assert sorted(len(v) for v in per_key.values()) == sorted(
        len(v) for v in tokens.values()
    )  # every token handed out is stored on its attempt
    STATS.append(sum(len(v) for v in tokens.values()))


def test_the_property_exercised_keyed_grants() -> None:
    """Runs after the property (file order): keyed starts were granted (at least by the
    explicit example: the harness really exercises keys with the current dispatcher)."""
    if not STATS:
        pytest.skip("runs only after the property above: run the whole file")
    assert STATS and max(STATS) >= 2, STATS
