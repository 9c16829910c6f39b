"""Start-time permits against the real database (pulse.permits): queue max_concurrency,
application max_active_attempts, start-rate windows on the database clock, keyed
concurrency with fencing tokens, denials counted, and release with every attempt end."""

from __future__ import annotations

import asyncio
import hashlib
import unicodedata
from datetime import timedelta

import msgspec
import pytest
from permits_support import (
    check_permit_counters,
    complete,
    denials,
    denied,
    fail,
    key_limit,
    offers,
    rows,
    set_app_limits,
    start_all,
    started,
)
from pulse_worker_support import check_invariants, connect, open_session, task_row

from orbit.ids import parse_id
from pulse import attempts, permits, queues, tasks, wire
from pulse.attempts import Report
from pulse.dispatch import Dispatcher
from pulse.hub import Hub
from pulse.recovery import recover_attempt


@pytest.fixture
def hub() -> Hub:
    return Hub("node-permits")


async def session(db, hub, t, *, keys: bool = False, queues_: list[str] | None = None, n=16):
    info, _ = await open_session(db, t, max_concurrency=n, concurrency_keys=keys, queues=queues_)
    return await connect(db, hub, info)


# -- queue permits ---------------------------------------------------------------------------


async def test_queue_max_concurrency_is_never_exceeded_in_one_batch_or_one_by_one(
    db, tenant, hub
) -> None:
    t = await tenant()
    conn = await session(db, hub, t)
    for _ in range(5):
        await t.submit()
    offered = await offers(db, hub, conn)
    assert len(offered) == 5
    # The limit comes after the offers (the dispatcher offers no more than it leaves:
    # docs/dispatch.md "Capacity from permits"); the start judges it all the same.
    await t.add_queue(t.queue, max_concurrency=2)
    replies = await start_all(db, t, conn, offered[:3])  # one transaction
    assert len(started(replies)) == 2 and denied(replies) == [permits.DENY_PERMITS]
    for o in offered[3:]:  # one transaction each
        r = await attempts.start(db, t.namespace_id, conn.info.session_id, parse_id(o.attempt_id))
        assert isinstance(r, wire.StartDenied) and r.reason == permits.DENY_PERMITS
    assert await denials(db, t) == {"permits": 3, "rate": 0, "key": 0, "application": 0}
    # The denied tasks went back to WAITING (available at once: a permit frees any time).
    denied_task = await task_row(db, t, offered[2].task.id)
    assert denied_task["state"] == "WAITING" and denied_task["current_attempt_id"] is None
    view = await queues.get_queue(db, t.namespace_id, t.queue)
    assert view["usage"]["active_attempts"] == 2
    assert view["usage"]["denials"]["permits"] == 3
    await check_permit_counters(db, [t.namespace_id], t.application_id)
    # A permit is released with the attempt's end: the next start goes through.
    await complete(db, t, started(replies)[0])
    (again,) = (await offers(db, hub, conn))[:1]
    ok = await attempts.start(db, t.namespace_id, conn.info.session_id, parse_id(again.attempt_id))
    assert isinstance(ok, wire.Started)
    await check_invariants(db, t.namespace_id)
    await check_permit_counters(db, [t.namespace_id], t.application_id)


async def test_concurrent_start_transactions_never_exceed_the_queue_limit(db, tenant, hub) -> None:
    t = await tenant()
    conns = [await session(db, hub, t, n=4) for _ in range(4)]
    for _ in range(16):
        await t.submit()
    offered = [(c, o) for c in conns for o in await offers(db, hub, c)]
    assert len(offered) == 16
    await t.add_queue(t.queue, max_concurrency=3)  # after the offers (see above)
    replies = await asyncio.gather(*(
        attempts.start(db, t.namespace_id, c.info.session_id, parse_id(o.attempt_id))
        for c, o in offered
    ))  # fmt: skip
    assert len(started(replies)) == 3
    assert set(denied(replies)) == {permits.DENY_PERMITS}
    await check_permit_counters(db, [t.namespace_id], t.application_id)


async def test_lowering_a_limit_revokes_nothing_and_config_changes_keep_usage(
    db, tenant, hub
) -> None:
    t = await tenant(max_concurrency=4)
    conn = await session(db, hub, t)
    for _ in range(4):
        await t.submit()
    offered = await offers(db, hub, conn)
    running = started(await start_all(db, t, conn, offered[:3]))
    assert len(running) == 3
    await t.add_queue(t.queue, max_concurrency=1)  # lower it below what runs
    view = await queues.get_queue(db, t.namespace_id, t.queue)
    assert view["max_concurrency"] == 1 and view["usage"]["active_attempts"] == 3
    for o in offered[:3]:  # nothing is revoked
        assert (await task_row(db, t, o.task.id))["state"] == "RUNNING"
    r = await start_all(db, t, conn, offered[3:])
    assert denied(r) == [permits.DENY_PERMITS]
    await complete(db, t, running[0])
    await complete(db, t, running[1])
    assert await offers(db, hub, conn) == []  # 1 running >= 1: not even offered
    await complete(db, t, running[2])
    (o,) = await offers(db, hub, conn)
    assert len(started(await start_all(db, t, conn, [o]))) == 1
    await check_permit_counters(db, [t.namespace_id], t.application_id)


# -- application quota -----------------------------------------------------------------------


async def test_application_max_active_attempts_is_shared_by_its_namespaces(db, tenant, hub) -> None:
    t = await tenant()
    other = await t.other_namespace()
    c1 = await session(db, hub, t)
    c2 = await session(db, hub, other)
    await t.submit()
    await other.submit()
    (o1,) = await offers(db, hub, c1)
    (o2,) = await offers(db, hub, c2)
    await set_app_limits(db, t, max_active_attempts=1)  # after the offers (see above)
    first = started(await start_all(db, t, c1, [o1]))
    assert len(first) == 1
    assert denied(await start_all(db, other, c2, [o2])) == [permits.DENY_APPLICATION]
    assert (await denials(db, other))["application"] == 1
    await check_permit_counters(db, [t.namespace_id, other.namespace_id], t.application_id)
    await complete(db, t, first[0])
    (o2,) = await offers(db, hub, c2)
    assert len(started(await start_all(db, other, c2, [o2]))) == 1
    await check_permit_counters(db, [t.namespace_id, other.namespace_id], t.application_id)


# -- start-rate windows ----------------------------------------------------------------------


async def test_rate_window_allows_n_then_denies_until_the_next_window(db, tenant, hub) -> None:
    t = await tenant(max_starts_per_second=2)
    conn = await session(db, hub, t)
    for _ in range(4):
        await t.submit()
    offered = await offers(db, hub, conn)
    t0 = await db.now()
    assert len(started(await start_all(db, t, conn, offered[:1], now=t0))) == 1
    half = t0 + timedelta(milliseconds=500)
    r = await start_all(db, t, conn, offered[1:3], now=half)  # 2nd granted, 3rd denied
    assert len(started(r)) == 1 and denied(r) == [permits.DENY_RATE]
    (usage,) = await rows(
        db, "SELECT window_start, window_starts FROM pulse_queue_usage"
        " WHERE namespace_id = %s AND queue_id = %s", t.namespace_id, t.queue_id,
    )  # fmt: skip
    assert usage["window_start"] == t0 and usage["window_starts"] == 2
    # The refused task waits for the window's end instead of a hot re-offer loop.
    refused = await task_row(db, t, offered[2].task.id)
    assert refused["state"] == "WAITING"
    assert refused["available_at"] == t0 + timedelta(seconds=1)
    assert (await denials(db, t))["rate"] == 1
    # Just before the window ends: still denied. At its end: a new window.
    almost = t0 + timedelta(microseconds=999_999)
    assert denied(await start_all(db, t, conn, offered[3:], now=almost)) == [permits.DENY_RATE]
    # Neither refused task is dispatched before the window's end (pinned dispatch clock)...
    assert await Dispatcher(db, hub).dispatch_to(conn, now=almost) == 0
    # ... and both are from then on; the window that opens at t0 + 1 s grants them.
    edge = t0 + timedelta(seconds=1)
    assert await Dispatcher(db, hub).dispatch_to(conn, now=edge) == 2
    again = conn.take_offers()
    assert len(started(await start_all(db, t, conn, again, now=edge))) == 2
    (usage,) = await rows(
        db, "SELECT window_start, window_starts FROM pulse_queue_usage"
        " WHERE namespace_id = %s AND queue_id = %s", t.namespace_id, t.queue_id,
    )  # fmt: skip
    assert usage["window_start"] == edge and usage["window_starts"] == 2
    await check_permit_counters(db, [t.namespace_id], t.application_id)


async def test_rate_window_runs_on_the_database_clock(db, tenant, hub) -> None:
    t = await tenant(max_starts_per_second=1000)
    conn = await session(db, hub, t)
    await t.submit()
    offered = await offers(db, hub, conn)
    before = await db.now()
    assert len(started(await start_all(db, t, conn, offered))) == 1  # unpinned: DB clock
    after = await db.now()
    (usage,) = await rows(
        db, "SELECT window_start, window_starts FROM pulse_queue_usage"
        " WHERE namespace_id = %s AND queue_id = %s", t.namespace_id, t.queue_id,
    )  # fmt: skip
    assert before <= usage["window_start"] <= after and usage["window_starts"] == 1


async def test_application_rate_window_spans_its_queues(db, tenant, hub) -> None:
    t = await tenant()
    await t.add_queue("second")
    await set_app_limits(db, t, max_starts_per_second=1)
    conn = await session(db, hub, t, queues_=[t.queue, "second"])
    await t.submit()
    await t.submit(queue="second")
    offered = await offers(db, hub, conn)
    assert len(offered) == 2
    t0 = await db.now()
    r = await start_all(db, t, conn, offered, now=t0)
    assert len(started(r)) == 1 and denied(r) == [permits.DENY_RATE]
    loser = next(o for o, x in zip(offered, r, strict=True) if isinstance(x, wire.StartDenied))
    row = await task_row(db, t, loser.task.id)
    assert row["available_at"] == t0 + timedelta(seconds=1)
    assert (await denials(db, t, row["queue_id"]))["rate"] == 1


# -- keyed concurrency -----------------------------------------------------------------------


async def test_one_running_attempt_per_key_and_tokens_strictly_increase(db, tenant, hub) -> None:
    t = await tenant()
    conn = await session(db, hub, t, keys=True)
    key_of = {}
    for key in ("acct-1", "acct-1", "acct-1", "acct-2"):
        key_of[(await t.submit(concurrency_key=key))["id"]] = key
    offered = await offers(db, hub, conn)
    by_key = {o.task.id: o for o in offered}
    assert len(by_key) == 4
    r = await start_all(db, t, conn, offered)
    ok = started(r)
    assert len(ok) == 2  # one per key
    assert sorted(denied(r)) == [permits.DENY_KEY_BUSY] * 2
    assert (await denials(db, t))["key"] == 2
    assert sorted(s.concurrency_token for s in ok) == [1, 1]  # different keys: independent
    await check_permit_counters(db, [t.namespace_id], t.application_id)
    lim = await key_limit(db, t, "acct-1")
    assert lim is not None and lim["held"] == 1 and lim["grant_revision"] == 1
    tokens = []
    # Run the rest of acct-1 one after the other: every grant gets the next token.
    current = next(
        s for s, o in zip(r, offered, strict=True)
        if isinstance(s, wire.Started) and key_of[o.task.id] == "acct-1"
    )  # fmt: skip
    tokens.append(current.concurrency_token)
    for _ in range(2):
        await complete(db, t, current)
        nxt = await offers(db, hub, conn)
        granted = started(await start_all(db, t, conn, nxt))
        assert len(granted) == 1
        current = granted[0]
        tokens.append(current.concurrency_token)
        await check_permit_counters(db, [t.namespace_id], t.application_id)
    assert tokens == [1, 2, 3]
    stored = await rows(
        db, "SELECT a.concurrency_token FROM pulse_attempts a JOIN pulse_tasks t"
        " ON t.namespace_id = a.namespace_id AND t.id = a.task_id WHERE a.namespace_id = %s"
        " AND t.concurrency_key = 'acct-1' AND a.state <> 'RELEASED' ORDER BY a.started_at",
        t.namespace_id,
    )  # fmt: skip
    assert [x["concurrency_token"] for x in stored] == [1, 2, 3]


async def test_key_bytes_are_exact_nfc_and_nfd_are_different_keys(db, tenant, hub) -> None:
    t = await tenant()
    conn = await session(db, hub, t, keys=True)
    nfc, nfd = unicodedata.normalize("NFC", "café"), unicodedata.normalize("NFD", "café")
    assert nfc != nfd
    a = await t.submit(concurrency_key=nfc)
    b = await t.submit(concurrency_key=nfd)
    r = await start_all(db, t, conn, await offers(db, hub, conn))
    assert len(started(r)) == 2  # both run at once: two keys
    digests = {
        bytes(x["key_digest"])
        for x in await rows(
            db, "SELECT key_digest FROM pulse_concurrency_limits WHERE namespace_id = %s",
            t.namespace_id,
        )
    }  # fmt: skip
    assert digests == {hashlib.sha256(k.encode()).digest() for k in (nfc, nfd)}
    assert (await task_row(db, t, a["id"]))["state"] == "RUNNING"
    assert (await task_row(db, t, b["id"]))["state"] == "RUNNING"
    await check_permit_counters(db, [t.namespace_id], t.application_id)


async def test_a_key_is_scoped_to_its_namespace(db, tenant, hub) -> None:
    t = await tenant()
    other = await t.other_namespace()
    c1, c2 = await session(db, hub, t, keys=True), await session(db, hub, other, keys=True)
    await t.submit(concurrency_key="k")
    await other.submit(concurrency_key="k")
    assert len(started(await start_all(db, t, c1, await offers(db, hub, c1)))) == 1
    assert len(started(await start_all(db, other, c2, await offers(db, hub, c2)))) == 1


async def test_the_token_never_wraps(db, tenant, hub) -> None:
    t = await tenant()
    conn = await session(db, hub, t, keys=True)
    await t.submit(concurrency_key="old")
    (o,) = await offers(db, hub, conn)
    (s,) = started(await start_all(db, t, conn, [o]))
    await complete(db, t, s)

    async def set_revision(value: int) -> None:
        async def run(tx):
            await tx.execute(
                "UPDATE pulse_concurrency_limits SET grant_revision = %s"
                " WHERE namespace_id = %s AND concurrency_key = 'old'",
                (value, t.namespace_id),
            )

        await db.transaction(run)

    await set_revision(permits.MAX_TOKEN - 1)
    await t.submit(concurrency_key="old")
    (o,) = await offers(db, hub, conn)
    (s,) = started(await start_all(db, t, conn, [o]))
    assert s.concurrency_token == permits.MAX_TOKEN  # the last one
    await complete(db, t, s)
    await t.submit(concurrency_key="old")
    (o,) = await offers(db, hub, conn)
    assert denied(await start_all(db, t, conn, [o])) == [permits.DENY_KEY_EXHAUSTED]
    lim = await key_limit(db, t, "old")
    assert lim is not None and lim["grant_revision"] == permits.MAX_TOKEN and lim["held"] == 0
    assert (await denials(db, t))["key"] == 1


async def test_first_grant_race_on_a_new_key_creates_one_row(db, tenant, hub) -> None:
    t = await tenant()
    conns = [await session(db, hub, t, keys=True, n=1) for _ in range(6)]
    for _ in range(6):
        await t.submit(concurrency_key="fresh")
    offered = [(c, o) for c in conns for o in await offers(db, hub, c)]
    assert len(offered) == 6
    replies = await asyncio.gather(*(
        attempts.start(db, t.namespace_id, c.info.session_id, parse_id(o.attempt_id))
        for c, o in offered
    ))  # fmt: skip
    assert len(started(replies)) == 1
    assert set(denied(replies)) == {permits.DENY_KEY_BUSY}
    assert len(await rows(
        db, "SELECT id FROM pulse_concurrency_limits WHERE namespace_id = %s", t.namespace_id
    )) == 1  # fmt: skip
    await check_permit_counters(db, [t.namespace_id], t.application_id)


# -- release with every end of a running attempt ---------------------------------------------


async def _one_running_keyed(db, hub, t, **submit):
    conn = await session(db, hub, t, keys=True)
    task = await t.submit(concurrency_key="r", **submit)
    (o,) = await offers(db, hub, conn)
    (s,) = started(await start_all(db, t, conn, [o]))
    assert s.concurrency_token is not None
    lim = await key_limit(db, t, "r")
    assert lim is not None and lim["held"] == 1
    return conn, task, s


async def _released(db, t) -> None:
    lim = await key_limit(db, t, "r")
    assert lim is not None and lim["held"] == 0
    assert not await rows(
        db, "SELECT id FROM pulse_permits WHERE namespace_id = %s", t.namespace_id
    )
    result = await check_permit_counters(db, [t.namespace_id], t.application_id)
    assert result["app_running"] == 0
    await check_invariants(db, t.namespace_id)


async def test_permits_released_on_complete(db, tenant, hub) -> None:
    t = await tenant(max_concurrency=1)
    _, _, s = await _one_running_keyed(db, hub, t)
    await complete(db, t, s)
    await _released(db, t)


@pytest.mark.parametrize("retryable", [True, False])
async def test_permits_released_on_fail(db, tenant, hub, retryable: bool) -> None:
    t = await tenant(max_concurrency=1)
    _, task, s = await _one_running_keyed(db, hub, t)
    await fail(db, t, s, retryable=retryable)
    assert (await task_row(db, t, task["id"]))["state"] == ("WAITING" if retryable else "FAILED")
    await _released(db, t)


async def test_permits_released_on_cancelled(db, tenant, hub) -> None:
    t = await tenant(max_concurrency=1)
    _, task, s = await _one_running_keyed(db, hub, t)
    res = await tasks.cancel_task(db, t.namespace_id, task["id"])
    assert res.status == 202
    rep = Report("cancelled", parse_id(s.attempt_id), s.execution_token)
    await attempts.report(db, t.namespace_id, rep)
    assert (await task_row(db, t, task["id"]))["state"] == "CANCELLED"
    await _released(db, t)


@pytest.mark.parametrize("retry_safe", [True, False])
async def test_permits_released_when_recovery_loses_the_attempt(
    db, tenant, hub, retry_safe: bool
) -> None:
    t = await tenant(max_concurrency=1)
    _, task, s = await _one_running_keyed(db, hub, t, retry_safe=retry_safe)
    late = await db.now() + timedelta(minutes=10)
    outcome = await recover_attempt(
        db, t.namespace_id, parse_id(s.attempt_id), reason="lease_expired", now=late
    )
    assert outcome == "lost"
    state = (await task_row(db, t, task["id"]))["state"]
    assert state == ("WAITING" if retry_safe else "NEEDS_REVIEW")
    await _released(db, t)


async def test_one_report_batch_releases_every_key_it_ends(db, tenant, hub) -> None:
    t = await tenant()
    conn = await session(db, hub, t, keys=True)
    for key in ("x", "y", "z"):
        await t.submit(concurrency_key=key)
    await t.submit()  # unkeyed, in the same batch
    ok = started(await start_all(db, t, conn, await offers(db, hub, conn)))
    assert len(ok) == 4
    reps = [
        Report("complete", parse_id(s.attempt_id), s.execution_token, result=msgspec.Raw(b"1"))
        for s in ok
    ]
    receipts = await attempts.report_many(db, t.namespace_id, reps)
    assert all(isinstance(r, wire.Receipt) for r in receipts)
    for key in ("x", "y", "z"):
        lim = await key_limit(db, t, key)
        assert lim is not None and lim["held"] == 0 and lim["grant_revision"] == 1
    result = await check_permit_counters(db, [t.namespace_id], t.application_id)
    assert result["app_running"] == 0
