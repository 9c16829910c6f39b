"""A noisy tenant's large results cannot make one hand-out huge: a subscription pull or a
stream hand-out stops adding deliveries once their stored results reach the page budget
(``max_page_bytes``, 4 MiB), always carries at least one, and what it leaves out stays
available — not leased, no attempt counted, no gap — so the next pull or hand-out goes on
from it, and every delivery is acked exactly once."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from typing import Any

import httpx
import msgspec
import pytest
from sdk_server import eventually
from subscription_fixtures import LiveServer, SubTenant, append_results, make_tenant
from websockets.asyncio.client import connect

from orbit import deliveries, delivery_history, delivery_pump, subscriptions
from orbit.audit import CLI_ACTOR
from orbit.list_bytes import ListBytes
from orbit.pagination import MAX_PAGE_BYTES
from orbit.storage import Database, Tx
from orbit.store import delivery_ranges as range_store
from orbit.subscriptions import SubscriptionPut

KIB = 1024
#: A result of about 300 KiB of stored JSON: 13 fit in the 4 MiB budget.
BIG = {"blob": "x" * (300 * KIB)}
BIG_BYTES = len(msgspec.json.encode(BIG))
PER_BUDGET = MAX_PAGE_BYTES // BIG_BYTES
EVENTS = 40


async def _big_events(db: Database, t: SubTenant, n: int = EVENTS) -> list[int]:
    seqs: list[int] = []
    for start in range(0, n, 10):  # a few MiB per transaction
        seqs += await append_results(db, t.namespace_id, min(10, n - start), result=BIG)
    return seqs


async def _sub(db: Database, t: SubTenant, **kw: Any) -> bytes:
    body = msgspec.convert({"start": "earliest", "max_in_flight": 1000, **kw}, SubscriptionPut)
    row, *_ = await subscriptions.put_subscription(db, CLI_ACTOR, t.namespace_id, "s", body)
    return row.id


def _stored_bytes(batch: list[deliveries.Leased]) -> int:
    return sum(len(d.event.result or "") + len(d.event.error or "") for d in batch)


async def _ranges(db: Database, t: SubTenant, sub_id: bytes) -> list[range_store.RangeRow]:
    async def run(tx: Tx) -> list[range_store.RangeRow]:
        return await range_store.range_list_page(tx, t.namespace_id, sub_id, 0, 500)

    return await db.read(run)


async def _backlog(db: Database, t: SubTenant) -> subscriptions.Backlog:
    _, backlog = await subscriptions.get_subscription_with_backlog(db, t.namespace_id, "s")
    return backlog


async def test_a_lease_stops_at_the_byte_budget_and_the_next_goes_on(db: Database) -> None:
    t = await make_tenant(db)
    seqs = await _big_events(db, t)
    sub_id = await _sub(db, t)
    got: list[deliveries.Leased] = []
    while len(got) < EVENTS:
        batch = await delivery_pump.lease(db, t.namespace_id, sub_id, 500)
        assert 1 <= len(batch.deliveries) <= PER_BUDGET
        assert _stored_bytes(batch.deliveries) <= MAX_PAGE_BYTES
        # Only what was handed out is leased: the rest is still after the cursor.
        assert (await _backlog(db, t)).in_flight == len(got) + len(batch.deliveries)
        assert batch.behind == (len(got) + len(batch.deliveries) < EVENTS)
        got += batch.deliveries
    assert [d.seq for d in got] == seqs  # in order, no gap, no duplicate
    assert all(d.attempt == 1 for d in got)
    ranges = await _ranges(db, t, sub_id)
    assert [r.n for r in ranges] == [PER_BUDGET] * (EVENTS // PER_BUDGET) + [EVENTS % PER_BUDGET]
    assert not (await delivery_pump.lease(db, t.namespace_id, sub_id, 500)).deliveries
    for d in got:
        assert (
            await deliveries.ack(db, t.namespace_id, d.delivery_id, d.proof)
        ).outcome == "applied"
    backlog = await _backlog(db, t)
    assert (backlog.acked, backlog.in_flight, backlog.pending) == (EVENTS, 0, 0)


async def test_one_result_larger_than_the_budget_is_still_handed_out(db: Database) -> None:
    t = await make_tenant(db)
    await _big_events(db, t, 3)
    sub_id = await _sub(db, t)
    small = 100 * KIB  # a budget smaller than one result
    for _ in range(3):
        batch = await delivery_pump.lease(db, t.namespace_id, sub_id, 500, max_bytes=small)
        assert len(batch.deliveries) == 1


async def test_redeliveries_are_bounded_and_the_rest_stay_pending(db: Database) -> None:
    t = await make_tenant(db)
    seqs = await _big_events(db, t, 30)
    sub_id = await _sub(db, t)
    first: list[deliveries.Leased] = []
    while len(first) < 30:
        first += (await delivery_pump.lease(db, t.namespace_id, sub_id, 500)).deliveries
    released = await deliveries.release_many(
        db, t.namespace_id, [(d.delivery_id, d.proof) for d in first]
    )
    assert released == 30
    again: list[deliveries.Leased] = []
    while len(again) < 30:
        batch = await delivery_pump.lease(db, t.namespace_id, sub_id, 500)
        assert 1 <= len(batch.deliveries) <= PER_BUDGET
        assert _stored_bytes(batch.deliveries) <= MAX_PAGE_BYTES
        backlog = await _backlog(db, t)
        assert backlog.in_flight == len(again) + len(batch.deliveries)
        assert backlog.pending == 30 - backlog.in_flight  # not leased, no attempt counted
        again += batch.deliveries
    assert sorted(d.seq for d in again) == seqs
    assert {d.delivery_id for d in again} == {d.delivery_id for d in first}
    assert all(d.attempt == 2 for d in again)
    for d in first[:3]:  # the old proofs are stale, the new ones work
        with pytest.raises(deliveries.StaleProof):
            await deliveries.ack(db, t.namespace_id, d.delivery_id, d.proof)
    for d in again:
        assert (
            await deliveries.ack(db, t.namespace_id, d.delivery_id, d.proof)
        ).outcome == "applied"
    history = await delivery_history.list_history(
        db, t.namespace_id, sub_id, state="ACKED", after_seq=0, limit=500
    )
    assert [r.seq for r in history] == seqs


async def test_a_filter_passes_over_large_events_it_does_not_select(db: Database) -> None:
    t = await make_tenant(db)
    for _ in range(2):  # 6 MiB of results the subscription does not select, then 5 it does
        await append_results(db, t.namespace_id, 10, queue="other", result=BIG)
    wanted = await append_results(db, t.namespace_id, 5, queue="q")
    sub_id = await _sub(db, t, filter={"queues": ["q"]})
    got: list[deliveries.Leased] = []
    for _ in range(10):
        batch = await delivery_pump.lease(db, t.namespace_id, sub_id, 500)
        got += batch.deliveries
        if not batch.behind:
            break
    assert [d.seq for d in got] == wanted
    assert (await _backlog(db, t)).unscanned_events == 0


async def test_asks_of_one_round_each_get_their_own_budget(db: Database) -> None:
    t = await make_tenant(db)
    seqs = await _big_events(db, t)
    sub_id = await _sub(db, t)
    asks = [delivery_pump.LeaseAsk(t.namespace_id, sub_id, 500) for _ in range(2)]
    a, b = await delivery_pump.lease_round(db, asks)
    assert isinstance(a, delivery_pump.LeaseBatch) and isinstance(b, delivery_pump.LeaseBatch)
    assert len(a.deliveries) == len(b.deliveries) == PER_BUDGET
    assert [d.seq for d in a.deliveries + b.deliveries] == seqs[: 2 * PER_BUDGET]
    assert (await _backlog(db, t)).in_flight == 2 * PER_BUDGET  # nothing leased for no one


# ----------------------------------------------------------------------------- over the wire


@pytest.fixture
async def server(db: Database) -> AsyncIterator[LiveServer]:
    live = await LiveServer(db).start()
    try:
        yield live
    finally:
        await live.stop()


def _path(t: SubTenant) -> str:
    return f"/v1/namespaces/{t.namespace}/subscriptions/s"


async def test_a_pull_of_500_answers_one_budget_and_the_rest_next(
    db: Database, server: LiveServer
) -> None:
    t = await make_tenant(db)
    seqs = await _big_events(db, t)
    await _sub(db, t)
    got: list[dict[str, Any]] = []
    async with httpx.AsyncClient(base_url=server.base_url, timeout=30) as http:
        while len(got) < EVENTS:
            r = await http.post(f"{_path(t)}/pull", json={"max": 500}, headers=t.auth)
            assert r.status_code == 200, r.text
            batch = r.json()["deliveries"]
            assert 1 <= len(batch) <= PER_BUDGET
            results = sum(len(msgspec.json.encode(d["event"]["result"])) for d in batch)
            assert results <= MAX_PAGE_BYTES
            assert len(r.content) <= MAX_PAGE_BYTES + 2 * KIB * len(batch)
            got += batch
        r = await http.post(f"{_path(t)}/pull", json={"max": 500}, headers=t.auth)
        assert r.json()["deliveries"] == []
        for d in got:
            r = await http.post(
                f"/v1/namespaces/{t.namespace}/deliveries/{d['delivery_id']}/ack",
                json={"proof": d["proof"]}, headers=t.auth,
            )  # fmt: skip
            assert r.status_code == 200 and r.json()["outcome"] == "applied", r.text
    assert [d["seq"] for d in got] == seqs
    assert (await _backlog(db, t)).acked == EVENTS


async def test_a_stream_hands_out_in_budgets_and_loses_nothing(
    db: Database, server: LiveServer
) -> None:
    t = await make_tenant(db)
    seqs = await _big_events(db, t)
    sub_id = await _sub(db, t)
    got: list[dict[str, Any]] = []
    url = f"{server.ws_base}{_path(t)}/stream"
    async with connect(url, additional_headers=t.auth, max_size=None, compression=None) as ws:
        async with asyncio.timeout(60):
            while len(got) < EVENTS:
                frame = msgspec.json.decode(await ws.recv())
                if frame["type"] == "ping":
                    await ws.send('{"type": "pong"}')
                    continue
                assert frame["type"] == "delivery", frame
                got.append(frame)
                await ws.send(msgspec.json.encode(
                    {"type": "ack", "delivery_id": frame["delivery_id"], "proof": frame["proof"]}
                ).decode())  # fmt: skip

    async def all_acked() -> bool:  # the stream applies acks in rounds
        return (await _backlog(db, t)).acked == EVENTS

    assert await eventually(all_acked)
    assert [d["seq"] for d in got] == seqs
    ranges = await _ranges(db, t, sub_id)
    assert sum(r.n for r in ranges) == EVENTS
    assert all(r.n <= PER_BUDGET for r in ranges)  # every hand-out within the budget


async def test_a_stream_to_a_reader_that_stops_holds_about_two_budgets(
    db: Database, server: LiveServer
) -> None:
    t = await make_tenant(db)
    await _big_events(db, t, 200)  # 60 MiB of results
    await _sub(db, t)
    url = f"{server.ws_base}{_path(t)}/stream"
    async with connect(url, additional_headers=t.auth, max_size=None, compression=None) as ws:
        await ws.recv()  # the stream is serving; from now on the client reads nothing

        async def waiting() -> Any:  # the feed waits for the queued frames to be sent
            return next((c for c in server.streams if c.stats.drain_waits), None)

        conn = await eventually(waiting)
        queued = conn.queue.qsize()
        assert MAX_PAGE_BYTES // BIG_BYTES <= queued <= 2 * PER_BUDGET + 1
        assert conn._queued_bytes <= 2 * MAX_PAGE_BYTES + BIG_BYTES
        assert conn.stats.leased < 200  # not the whole backlog


# ----------------------------------------------------------------------------- byte rate


def _slow_budget(server: LiveServer) -> None:
    """This node's list-bytes budget at 1 byte a second, bursts of 1 MiB: one hand-out of big
    results spends the burst, the next puts the application in debt for good."""
    server.ctx.list_bytes = ListBytes(1, 1024 * KIB)


async def test_pulls_pay_from_the_applications_byte_rate(db: Database, server: LiveServer) -> None:
    t = await make_tenant(db)
    await _big_events(db, t)
    await _sub(db, t)
    _slow_budget(server)
    async with httpx.AsyncClient(base_url=server.base_url, timeout=30) as http:
        for _ in range(2):  # the first empties the bucket, the second puts it in debt
            r = await http.post(f"{_path(t)}/pull", json={"max": 500}, headers=t.auth)
            assert r.status_code == 200 and len(r.json()["deliveries"]) == PER_BUDGET
        r = await http.post(f"{_path(t)}/pull", json={"max": 500}, headers=t.auth)
        assert r.status_code == 429, r.text
        assert r.json()["error"]["code"] == "rate_limited"
        assert int(r.headers["Retry-After"]) >= 1
    backlog = await _backlog(db, t)
    assert backlog.in_flight == 2 * PER_BUDGET  # the refused pull leased nothing
    assert backlog.unscanned_events == EVENTS - 2 * PER_BUDGET


async def test_a_stream_waits_for_the_applications_byte_rate(
    db: Database, server: LiveServer
) -> None:
    t = await make_tenant(db)
    await _big_events(db, t)
    await _sub(db, t)
    _slow_budget(server)
    url = f"{server.ws_base}{_path(t)}/stream"
    async with connect(url, additional_headers=t.auth, max_size=None, compression=None) as ws:
        async with asyncio.timeout(30):
            for _ in range(2 * PER_BUDGET):
                while msgspec.json.decode(await ws.recv())["type"] != "delivery":
                    pass

        async def throttled() -> Any:
            return next((c for c in server.streams if c.stats.throttled), None)

        conn = await eventually(throttled)
        assert conn.stats.leased == 2 * PER_BUDGET  # the third hand-out waits, leasing nothing
        assert (await _backlog(db, t)).in_flight == 2 * PER_BUDGET
