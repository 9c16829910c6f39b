"""Group commit of worker messages against the real database: a batch of starts or reports
is one transaction, yet every item gets exactly the outcome it would get alone; a failing
item does not poison the others; counters equal a recount after concurrent batches from
several server processes."""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
from pathlib import Path

import msgspec
import pytest
from event_rows import raw_events
from pulse_worker_support import FakeConn, check_invariants, connect, open_session, task_row

from orbit.errors import InvalidRequest, StaleToken
from orbit.ids import id_hex, new_id, parse_id
from orbit.storage import Database, Tx
from pulse import attempts, wire
from pulse.attempts import Report
from pulse.batcher import GroupCommit, WorkerBatches
from pulse.dispatch import Dispatcher
from pulse.errors import AttemptNotFound
from pulse.hub import Hub

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture
def hub() -> Hub:
    return Hub("node-batcher")


async def offers_for(db: Database, hub: Hub, conn: FakeConn, n: int) -> list[wire.Offer]:
    assert await Dispatcher(db, hub).dispatch_to(conn) == n
    return conn.take_offers()


async def result_seqs(db: Database, ns: bytes) -> list[int]:
    async def run(tx: Tx) -> list[int]:
        rows = await tx.fetchall(
            "SELECT seq FROM orbit_result_events WHERE namespace_id = %s ORDER BY seq", (ns,)
        )
        return [int(r["seq"]) for r in rows]

    return await db.read(run)


async def test_a_batch_of_starts_gives_each_item_its_own_answer(db, tenant, hub) -> None:
    t = await tenant()
    for _ in range(4):
        await t.submit()
    info, _ = await open_session(db, t, max_concurrency=4)
    other, _ = await open_session(db, t, max_concurrency=1)
    conn = await connect(db, hub, info)
    offers = await offers_for(db, hub, conn, 4)
    a = [parse_id(o.attempt_id) for o in offers]
    items = [
        (info.session_id, a[0]),
        (other.session_id, a[1]),  # another session's attempt: not_found, and untouched
        (info.session_id, a[1]),
        (info.session_id, a[0]),  # the same start again (next tx): token rotated
        (info.session_id, new_id()),  # no such attempt
        (info.session_id, a[2]),
    ]
    replies = await attempts.start_many(db, t.namespace_id, items)
    assert isinstance(replies[0], wire.Started) and replies[0].generation == 1
    assert isinstance(replies[1], wire.StartDenied) and replies[1].reason == "not_found"
    assert isinstance(replies[2], wire.Started)
    assert isinstance(replies[3], wire.Started) and replies[3].generation == 1
    assert isinstance(replies[4], wire.StartDenied) and replies[4].reason == "not_found"
    assert isinstance(replies[5], wire.Started)
    assert len({r.execution_token for r in replies if isinstance(r, wire.Started)}) == 4
    assert [r.attempt_id for r in replies] == [id_hex(aid) for _, aid in items]
    for o in offers[:3]:
        assert (await task_row(db, t, o.task.id))["state"] == "RUNNING"
    assert (await task_row(db, t, offers[3].task.id))["state"] == "LEASED"
    await check_invariants(db, t.namespace_id)  # counters: reservations -3, active +3


async def test_a_batch_of_reports_gives_each_item_its_own_outcome(db, tenant, hub) -> None:
    t = await tenant(retry={"max_attempts": 3, "backoff_initial_ms": 10})
    for _ in range(4):
        await t.submit(retry_safe=True)
    info, _ = await open_session(db, t, max_concurrency=4)
    conn = await connect(db, hub, info)
    offers = await offers_for(db, hub, conn, 4)
    a = [parse_id(o.attempt_id) for o in offers]
    started = await attempts.start_many(db, t.namespace_id, [(info.session_id, x) for x in a])
    tok = [s.execution_token for s in started if isinstance(s, wire.Started)]
    assert len(tok) == 4
    ok = msgspec.Raw(b'{"n": 1.50}')
    err = wire.FailError(type="Boom", message="boom")
    reps = [
        Report("complete", a[0], tok[0], result=ok),
        Report("complete", a[1], "ext_not-the-token", result=ok),  # stale: only this fails
        Report("fail", a[2], tok[2], error=err, retryable=True),
        Report("complete", a[0], tok[0], result=msgspec.Raw(b'{ "n" : 1.50 }')),  # same report
        Report("fail", a[0], tok[0], error=err),  # a different report after it: stale
        Report("complete", new_id(), tok[0], result=ok),  # no such attempt
        Report("complete", a[3], tok[3], result=ok),
    ]
    out = await attempts.report_many(db, t.namespace_id, reps)
    assert isinstance(out[0], wire.Receipt) and out[0].outcome == "applied"
    assert out[0].task_state == "SUCCEEDED"
    assert isinstance(out[1], StaleToken)
    assert isinstance(out[2], wire.Receipt) and out[2].task_state == "WAITING"  # retried
    assert isinstance(out[3], wire.Receipt) and out[3].outcome == "replayed"
    assert out[3].receipt_id == out[0].receipt_id
    assert isinstance(out[4], StaleToken) and out[4].details["applied"] == "complete"
    assert isinstance(out[5], AttemptNotFound)
    assert isinstance(out[6], wire.Receipt) and out[6].task_state == "SUCCEEDED"
    row = await task_row(db, t, offers[0].task.id)
    assert row["state"] == "SUCCEEDED" and row["result"] == '{"n": 1.50}'  # byte-exact
    assert (await task_row(db, t, offers[1].task.id))["state"] == "RUNNING"  # untouched
    assert (await task_row(db, t, offers[2].task.id))["state"] == "WAITING"
    # The stale report's right token still works afterwards.
    again = await attempts.report(db, t.namespace_id, Report("complete", a[1], tok[1], result=ok))
    assert again.outcome == "applied"
    assert await result_seqs(db, t.namespace_id) == [1, 2, 3]  # gap-free, one range per batch
    await check_invariants(db, t.namespace_id)


async def test_a_poisoned_report_does_not_fail_the_others(db, tenant, hub) -> None:
    """A report whose result the database refuses (JSON nested deeper than MariaDB's
    JSON_VALID accepts: the CHECK fails the whole transaction) is re-applied alone by the
    group commit; the others of its batch apply."""
    t = await tenant()
    for _ in range(3):
        await t.submit()
    info, _ = await open_session(db, t, max_concurrency=3)
    conn = await connect(db, hub, info)
    offers = await offers_for(db, hub, conn, 3)
    a = [parse_id(o.attempt_id) for o in offers]
    started = await attempts.start_many(db, t.namespace_id, [(info.session_id, x) for x in a])
    tok = [s.execution_token for s in started if isinstance(s, wire.Started)]
    batches = WorkerBatches(db, max_batch=8)
    gate = asyncio.Event()
    real = batches.reports._apply  # hold the first batch so the others queue behind it

    async def held(ns: bytes, reps: list[Report]):  # type: ignore[no-untyped-def]
        await gate.wait()
        return await real(ns, reps)

    batches.reports._apply = held  # type: ignore[assignment]
    good = msgspec.Raw(b'{"ok": true}')
    bad = msgspec.Raw(b"[" * 40 + b"]" * 40)  # valid JSON, too deep for the database's CHECK
    first = asyncio.create_task(
        batches.report(t.namespace_id, Report("complete", a[0], tok[0], result=good))
    )
    await asyncio.sleep(0.05)
    rest = [
        asyncio.create_task(batches.report(t.namespace_id, r))
        for r in (
            Report("complete", a[1], tok[1], result=bad),
            Report("complete", a[2], tok[2], result=good),
        )
    ]
    await asyncio.sleep(0.05)
    gate.set()
    assert (await first).outcome == "applied"
    out = await asyncio.gather(*rest, return_exceptions=True)
    assert not isinstance(out[0], wire.Receipt)  # the poisoned item fails, alone
    assert isinstance(out[1], wire.Receipt) and out[1].outcome == "applied"
    assert batches.reports.stats.isolated == 1  # the batch failed whole, then item by item
    assert (await task_row(db, t, offers[1].task.id))["state"] == "RUNNING"
    assert (await task_row(db, t, offers[2].task.id))["state"] == "SUCCEEDED"
    await check_invariants(db, t.namespace_id)


async def test_an_unreadable_report_fails_alone(db, tenant, hub) -> None:
    t = await tenant()
    for _ in range(2):
        await t.submit()
    info, _ = await open_session(db, t, max_concurrency=2)
    conn = await connect(db, hub, info)
    offers = await offers_for(db, hub, conn, 2)
    a = [parse_id(o.attempt_id) for o in offers]
    started = await attempts.start_many(db, t.namespace_id, [(info.session_id, x) for x in a])
    tok = [s.execution_token for s in started if isinstance(s, wire.Started)]
    out = await attempts.report_many(db, t.namespace_id, [
        Report("complete", a[0], tok[0], result=msgspec.Raw(b'{"ok": tru')),
        Report("complete", a[1], tok[1], result=msgspec.Raw(b"true")),
    ])  # fmt: skip
    assert isinstance(out[0], InvalidRequest)
    assert isinstance(out[1], wire.Receipt) and out[1].outcome == "applied"
    await check_invariants(db, t.namespace_id)


async def test_group_commit_over_real_transactions_batches_under_load(db, tenant, hub) -> None:
    t = await tenant()
    n = 24
    for _ in range(n):
        await t.submit()
    info, _ = await open_session(db, t, max_concurrency=n)
    conn = await connect(db, hub, info)
    offers = await offers_for(db, hub, conn, n)
    batches = WorkerBatches(db, max_batch=64)
    started = await asyncio.gather(
        *(batches.start(t.namespace_id, info.session_id, parse_id(o.attempt_id)) for o in offers)
    )
    assert all(isinstance(s, wire.Started) for s in started)
    reps = [
        Report("complete", parse_id(s.attempt_id), s.execution_token, result=msgspec.Raw(b"1"))
        for s in started
    ]
    receipts = await asyncio.gather(*(batches.report(t.namespace_id, r) for r in reps))
    assert all(r.task_state == "SUCCEEDED" for r in receipts)
    # Concurrent messages shared transactions (the first alone, the rest together).
    assert batches.starts.stats.batches < n and batches.reports.stats.batches < n
    assert batches.starts.stats.largest > 1 and batches.reports.stats.largest > 1
    assert await result_seqs(db, t.namespace_id) == list(range(1, n + 1))
    await check_invariants(db, t.namespace_id)


async def test_batching_off_is_one_transaction_per_message(db, tenant, hub) -> None:
    t = await tenant()
    for _ in range(3):
        await t.submit()
    info, _ = await open_session(db, t, max_concurrency=3)
    conn = await connect(db, hub, info)
    offers = await offers_for(db, hub, conn, 3)
    batches = WorkerBatches(db, enabled=False)
    started = await asyncio.gather(
        *(batches.start(t.namespace_id, info.session_id, parse_id(o.attempt_id)) for o in offers)
    )
    assert all(isinstance(s, wire.Started) for s in started)
    assert batches.starts.stats.batches == 3 and batches.starts.stats.largest == 1
    assert isinstance(batches.starts, GroupCommit)


CHILD = r"""
import asyncio, json, os, sys
sys.path[:0] = [os.environ["ORBIT_ROOT"], os.path.join(os.environ["ORBIT_ROOT"], "tests"),
                os.path.join(os.environ["ORBIT_ROOT"], "tests", "integration")]
import msgspec
from orbit.errors import StaleToken
from orbit.ids import parse_id
from orbit.storage import DSN, Database
from pulse import sessions, wire
from pulse.attempts import Report
from pulse.batcher import WorkerBatches
from pulse.dispatch import Dispatcher
from pulse.hub import Hub
from pulse_fixtures import Tenant
from pulse_worker_support import FakeConn, open_session

async def main():
    a = json.loads(sys.argv[1])
    db = await Database.connect(DSN.parse(a["dsn"]), maxsize=6)
    t = Tenant(db=db, application_id=bytes.fromhex(a["app"]), application="x",
               namespace_id=bytes.fromhex(a["ns"]), namespace=a["ns_name"],
               credential_id=bytes.fromhex(a["cred"]), key="", queue=a["queue"])
    ns = t.namespace_id
    hub = Hub(f"proc-{os.getpid()}")
    batches = WorkerBatches(db, max_batch=16)
    conns = []
    for _ in range(2):
        info, _ = await open_session(db, t, max_concurrency=20)
        queues = await sessions.resolve_queues(db, info.namespace_id, info.queues)
        conn = FakeConn(info, queues)
        await sessions.attach_node(db, ns, info.session_id, hub.node_id)
        hub.register(conn)
        conns.append(conn)
    d = Dispatcher(db, hub)
    done = stale = 0
    loop = asyncio.get_running_loop()
    deadline = loop.time() + 90
    while loop.time() < deadline:
        offers = []
        for conn in conns:
            await d.dispatch_to(conn)
            offers += [(conn, o) for o in conn.take_offers()]
        if not offers:
            n = await db.fetchone("SELECT COUNT(*) AS n FROM pulse_tasks WHERE namespace_id = %s"
                                  " AND state = 'SUCCEEDED'", (ns,))
            if n["n"] >= a["total"]:
                break
            await asyncio.sleep(0.02)
            continue
        started = await asyncio.gather(*(
            batches.start(ns, c.info.session_id, parse_id(o.attempt_id)) for c, o in offers))
        reports = []
        for s in started:
            if isinstance(s, wire.Started):
                aid = parse_id(s.attempt_id)
                reports.append(batches.report(ns, Report("complete", aid, s.execution_token,
                                                         result=msgspec.Raw(b'{"ok": 1}'))))
                reports.append(batches.report(ns, Report("complete", aid, "ext_wrong-token",
                                                         result=msgspec.Raw(b'{"ok": 2}'))))
        for r in await asyncio.gather(*reports, return_exceptions=True):
            if isinstance(r, wire.Receipt):
                done += r.outcome == "applied"
            elif isinstance(r, StaleToken):
                stale += 1
            else:
                raise r
    await db.close()
    print(json.dumps({"done": done, "stale": stale,
                      "largest": [batches.starts.stats.largest, batches.reports.stats.largest]}))

asyncio.run(main())
"""


@pytest.mark.process
async def test_counters_equal_recount_after_batches_from_three_processes(db, dsn, tenant) -> None:
    t = await tenant()
    n_tasks = 150
    for _ in range(n_tasks):
        await t.submit()
    args = json.dumps({
        "dsn": dsn.url(hide_password=False), "app": id_hex(t.application_id),
        "ns": id_hex(t.namespace_id), "ns_name": t.namespace,
        "cred": id_hex(t.credential_id), "queue": t.queue, "total": n_tasks,
    })  # fmt: skip
    env = {**os.environ, "ORBIT_ROOT": str(ROOT)}
    procs = [
        await asyncio.create_subprocess_exec(
            sys.executable,
            "-c",
            CHILD,
            args,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            env=env,
        )
        for _ in range(3)
    ]
    figures = []
    for p in procs:
        out, err = await asyncio.wait_for(p.communicate(), 110)
        assert p.returncode == 0, err.decode()[-3000:]
        figures.append(json.loads(out.decode().strip().splitlines()[-1]))
    assert sum(f["done"] for f in figures) == n_tasks  # each applied exactly once
    assert sum(f["stale"] for f in figures) == n_tasks  # every wrong token failed alone
    assert max(max(f["largest"]) for f in figures) > 1  # messages did share transactions

    async def summary(tx: Tx) -> dict:
        return await tx.fetchone(
            "SELECT COUNT(*) AS n, SUM(state = 'SUCCEEDED') AS ok, MAX(attempts) AS a"
            " FROM pulse_tasks WHERE namespace_id = %s",
            (t.namespace_id,),
        )

    s = await db.read(summary)
    assert int(s["n"]) == n_tasks and int(s["ok"]) == n_tasks and int(s["a"]) == 1
    assert await result_seqs(db, t.namespace_id) == list(range(1, n_tasks + 1))
    await check_invariants(db, t.namespace_id)  # usage counters == recount, and the rest


async def test_events_carry_the_rows_as_written(db, tenant, hub) -> None:
    """Start and report batches do not re-read the rows they wrote: the events must still
    carry exactly what the database holds (state version, attempts, finish time, result)."""
    t = await tenant(retry={"max_attempts": 2, "backoff_initial_ms": 10})
    for _ in range(2):
        await t.submit(retry_safe=True)
    info, _ = await open_session(db, t, max_concurrency=2)
    conn = await connect(db, hub, info)
    offers = await offers_for(db, hub, conn, 2)
    a = [parse_id(o.attempt_id) for o in offers]
    started = await attempts.start_many(db, t.namespace_id, [(info.session_id, x) for x in a])
    tok = [s.execution_token for s in started if isinstance(s, wire.Started)]
    err = wire.FailError(type="Boom", message="boom")
    await attempts.report_many(db, t.namespace_id, [
        Report("complete", a[0], tok[0], result=msgspec.Raw(b'{"v": 1.10}')),
        Report("fail", a[1], tok[1], error=err, retryable=True),
    ])  # fmt: skip

    async def read(tx: Tx) -> tuple[list[dict], list[dict], list[dict]]:
        tasks = await tx.fetchall(
            "SELECT * FROM pulse_tasks WHERE namespace_id = %s ORDER BY id", (t.namespace_id,)
        )
        raw = await raw_events(tx, t.namespace_id, subject_kind="task")
        res = await tx.fetchall(
            "SELECT * FROM orbit_result_events WHERE namespace_id = %s", (t.namespace_id,)
        )
        return tasks, raw, res

    tasks, raw, res = await db.read(read)
    for row in tasks:
        last = [json.loads(e["data"]) for e in raw if e["subject_id"] == row["id"]][-1]
        assert last["state"] == row["state"]
        assert last["state_version"] == row["state_version"]
        assert last["attempts"] == row["attempts"]
        assert last["report"] in ("complete", "fail")
    (ev,) = res
    done = next(r for r in tasks if r["state"] == "SUCCEEDED")
    assert ev["task_id"] == done["id"] and ev["result"] == done["result"] == '{"v": 1.10}'
    assert ev["finished_at"] == done["finished_at"] and ev["attempts"] == done["attempts"] == 1
    retried = next(r for r in tasks if r["state"] == "WAITING")
    started_ev = [json.loads(e["data"]) for e in raw if e["type"] == "task.started"]
    assert all(e["state"] == "RUNNING" for e in started_ev)
    assert retried["available_at"] > retried["state_changed_at"]  # backoff applied
    await check_invariants(db, t.namespace_id)


def _body(**fields):  # type: ignore[no-untyped-def]
    from pulse.types import TaskSubmit

    fields.setdefault("queue", "default")
    fields.setdefault("kind", "k")
    return msgspec.json.decode(msgspec.json.encode(fields), type=TaskSubmit)


async def test_grouped_single_submits_answer_each_as_alone(db, tenant) -> None:
    from pulse_fixtures import recount

    from orbit.errors import InvalidRequest as Invalid
    from pulse import submit
    from pulse.errors import QueueNotFound, QueueQuotaExceeded

    t = await tenant(max_unfinished_tasks=3)
    items = [
        submit.SingleSubmit(_body(payload={"a": 1}), None, "req-1"),
        submit.SingleSubmit(_body(dedup_key="d1"), None, "req-2"),
        submit.SingleSubmit(_body(dedup_key="d1"), None, "req-3"),  # twin: 200, same task
        submit.SingleSubmit(_body(queue="nope"), None, "req-4"),  # unknown queue: 404
        submit.SingleSubmit(_body(deadline_at="not a time"), None, "req-5"),  # 400
        submit.SingleSubmit(_body(), None, "req-6"),  # the third task: admitted
        submit.SingleSubmit(_body(), None, "req-7"),  # over the queue quota: 429
    ]
    out = await submit.submit_singles(db, t.namespace_id, t.application_id, items)
    assert [getattr(o, "status", None) for o in out[:3]] == [201, 201, 200]
    assert out[2].json()["id"] == out[1].json()["id"] and out[2].json()["deduplicated"]
    assert isinstance(out[3], QueueNotFound)
    assert isinstance(out[4], Invalid)
    assert out[5].status == 201
    assert isinstance(out[6], QueueQuotaExceeded)
    assert out[0].new_work == frozenset({t.queue_id}) and out[2].new_work == frozenset()
    counts = await recount(db, t)
    assert counts["usage"] == counts["rows"] and counts["rows"]["unfinished_tasks"] == 3

    async def events(tx: Tx) -> dict:
        rows = await raw_events(tx, t.namespace_id, type="task.accepted")
        return {id_hex(r["subject_id"]): r["request_id"] for r in rows}

    by_task = await db.read(events)
    assert by_task == {
        out[0].json()["id"]: "req-1",
        out[1].json()["id"]: "req-2",
        out[5].json()["id"]: "req-6",
    }
