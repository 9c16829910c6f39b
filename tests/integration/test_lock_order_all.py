"""The lock order (docs/invariants.md#5-compare-and-swap: application resources → queue →
task/attempt → permit) in EVERY transaction that changes a usage counter.

``test_every_transaction_locks_usage_rows_first`` records the statements each transaction
sends (``Tx.execute`` / ``executemany`` / ``execute_batch`` wrapped, one list per run of a
transaction) and checks, for dispatch (one owner, several owners, a reservation quota, an
owner the dispatcher never saw), start (unlimited, limited, keyed), report (complete, fail,
cancelled), submit (single and batch, with and without a quota), cancel (waiting, running,
bulk), resolve, recovery (lost offer, lost running), session close, the deadline sweep and a
workflow advance that creates tasks in two queues:

* every usage row (``orbit_application_resources``, ``pulse_queue_usage``) the transaction
  locks or writes is locked before its first statement that locks or writes a
  ``pulse_tasks`` / ``pulse_attempts`` row (a counter update after the task rows only
  touches rows locked before them);
* key permit rows (``pulse_concurrency_limits``, ``pulse_permits``) come after the first
  task/attempt lock.

``test_cancel_and_resolve_racing_the_worker_side_never_deadlock`` runs cancels and resolves
against dispatch → start → report on one queue with several connections and asserts that
no transaction was a deadlock victim (``Database.stats.retries[1213]`` of a Database of its
own). With the usage rows updated last ("counters last") it fails.
"""

from __future__ import annotations

import asyncio
import contextvars
import random
import re
import secrets
import sys
from collections.abc import Awaitable, Callable, Sequence
from datetime import timedelta
from pathlib import Path
from typing import Any

import msgspec
import pytest
from fair_dispatch_support import add_owner, set_max_reservations, submit_as
from pulse_fixtures import Tenant, force_state
from pulse_worker_support import check_invariants, connect, open_session

from orbit.audit import Actor
from orbit.ids import parse_id
from orbit.storage import Database, Tx
from orbit.times import format_time
from pulse import attempts, recovery, sessions, tasks, wire
from pulse import submit as submit_service
from pulse.attempts import Report
from pulse.dispatch import Dispatcher
from pulse.hub import Hub
from pulse.types import Resolve, ResolveAction

sys.path.insert(0, str(Path(__file__).resolve().parent))
from weave_engine_support import Flow

from weave import instances as weave_instances

USAGE = ("orbit_application_resources", "pulse_queue_usage")
TASKS = ("pulse_tasks", "pulse_attempts")
PERMITS = ("pulse_concurrency_limits", "pulse_permits")
DEADLOCK = 1213

Stmt = tuple[str, Any]

# -- statement recording ---------------------------------------------------------------------

_current: contextvars.ContextVar[list[Stmt] | None] = contextvars.ContextVar(
    "lock_order_tx", default=None
)


class Recorder:
    """One list of (sql, args) per run of a transaction (a retried one counts twice)."""

    def __init__(self) -> None:
        self.txs: list[list[Stmt]] = []

    def take(self) -> list[list[Stmt]]:
        out, self.txs = self.txs, []
        return out


def install(monkeypatch: pytest.MonkeyPatch) -> Recorder:
    rec = Recorder()
    run_once = Database._run_once
    execute = Tx.execute
    executemany = Tx.executemany
    execute_batch = Tx.execute_batch

    async def rec_run_once(self: Database, fn: Any, readonly: bool) -> Any:
        stmts: list[Stmt] = []
        token = _current.set(stmts)
        try:
            return await run_once(self, fn, readonly)
        finally:
            _current.reset(token)
            rec.txs.append(stmts)

    def note(sql: str, args: Any) -> None:
        cur = _current.get()
        if cur is not None:
            cur.append((sql, args))

    async def rec_execute(self: Tx, sql: str, args: Any = None) -> int:
        note(sql, args)
        return await execute(self, sql, args)

    async def rec_executemany(self: Tx, sql: str, args: Any) -> int:
        args = list(args)
        for a in args[:1]:
            note(sql, a)
        return await executemany(self, sql, args)

    async def rec_execute_batch(self: Tx, statements: Sequence[tuple[str, Any]]) -> list[int]:
        if len(statements) > 1:  # one statement goes through execute (recorded there)
            for sql, args in statements:
                note(sql, args)
        return await execute_batch(self, statements)

    monkeypatch.setattr(Database, "_run_once", rec_run_once)
    monkeypatch.setattr(Tx, "execute", rec_execute)
    monkeypatch.setattr(Tx, "executemany", rec_executemany)
    monkeypatch.setattr(Tx, "execute_batch", rec_execute_batch)
    return rec


_COMMENT = re.compile(r"--[^\n]*")


def classify(sql: str) -> tuple[str, str] | None:
    """(verb, table) of a statement that locks or writes rows; None for a plain read."""
    s = " ".join(_COMMENT.sub(" ", sql).lower().split()).lstrip("( ")
    verb = s.split(" ", 1)[0]
    if verb == "update":
        m = re.match(r"update (\w+)", s)
    elif verb in ("insert", "replace"):
        m = re.search(r"into (\w+)", s)
    elif verb == "delete":
        m = re.search(r"from (\w+)", s)
    elif verb == "select":
        if "for update" not in s and "lock in share mode" not in s and "for share" not in s:
            return None
        # The table of the outermost FROM: a scalar subquery of the select list (a held
        # count, a limit) is a plain read, which a locking read never locks.
        return _top_from(s, verb)
    else:
        return None
    return (verb, m.group(1)) if m else None


def _top_from(s: str, verb: str) -> tuple[str, str] | None:
    depth = 0
    for i, ch in enumerate(s):
        if ch == "(":
            depth += 1
        elif ch == ")":
            depth -= 1
        elif depth <= 0 and s.startswith("from ", i) and (i == 0 or not s[i - 1].isalnum()):
            m = re.match(r"from (\w+)", s[i:])
            return (verb, m.group(1)) if m else None
    return None


def _keys(args: Any, single: str, many: str) -> set[bytes] | None:
    if not isinstance(args, dict):
        return None
    if many in args:
        return {bytes(k) for k in args[many]}
    if single in args:
        return {bytes(args[single])}
    return None


def usage_keys(table: str, args: Any) -> set[tuple[str, bytes]] | None:
    """The usage rows a statement names (None: cannot tell).

    A statement of a node round has positional arguments (orbit/storage/keys.py): every id
    it names (16 bytes: applications, namespaces, queues) is taken as a key of either kind,
    so an update after the first task lock must name no id the usage lock did not name."""
    out: set[tuple[str, bytes]] = set()
    if isinstance(args, list | tuple):
        ids = {bytes(a) for a in args if isinstance(a, bytes | bytearray) and len(a) == 16}
        return {(kind, i) for i in ids for kind in ("a", "q")}
    if isinstance(args, dict) and "app_ids" in args and "queue_ids" in args:
        out |= {("a", bytes(k)) for k in args["app_ids"]}
        out |= {("q", bytes(k)) for k in args["queue_ids"]}
        return out
    if table == "orbit_application_resources":
        keys = _keys(args, "application_id", "app_ids")
        return None if keys is None else {("a", k) for k in keys}
    keys = _keys(args, "queue_id", "queue_ids")
    return None if keys is None else {("q", k) for k in keys}


def violations(stmts: list[Stmt]) -> list[str]:
    """Lock-order problems of one transaction (empty: it follows the order)."""
    marked = [(i, classify(sql), sql, args) for i, (sql, args) in enumerate(stmts)]
    first_task = next((i for i, c, _, _ in marked if c and c[1] in TASKS), None)
    first_permit = next((i for i, c, _, _ in marked if c and c[1] in PERMITS), None)
    problems: list[str] = []
    if first_task is None:
        return problems
    held: set[tuple[str, bytes]] = set()
    for i, c, sql, args in marked:
        if c is None or c[1] not in USAGE:
            continue
        keys = usage_keys(c[1], args)
        if i < first_task:
            held |= keys or set()
        elif keys is None or not keys <= held:
            head = " ".join(_COMMENT.sub(" ", sql).split())[:90]
            problems.append(f"usage row {c[0]} after the first task lock (#{first_task}): {head}")
    if first_permit is not None and first_permit < first_task:
        problems.append(f"permit row (#{first_permit}) before the first task lock")
    return problems


def touches_usage(stmts: list[Stmt]) -> bool:
    return any((c := classify(sql)) is not None and c[1] in USAGE for sql, _ in stmts)


class Checker:
    def __init__(self, rec: Recorder) -> None:
        self.rec = rec
        self.failures: dict[str, list[str]] = {}
        self.counted: dict[str, int] = {}

    async def check(self, name: str, op: Awaitable[Any]) -> Any:
        """Run ``op``; record which of its transactions changed usage rows out of order."""
        self.rec.take()
        result = await op
        txs = [s for s in self.rec.take() if touches_usage(s)]
        assert txs, f"{name}: no transaction touched a usage row (the test would prove nothing)"
        self.counted[name] = len(txs)
        for stmts in txs:
            for p in violations(stmts):
                self.failures.setdefault(name, []).append(p)
        return result


# -- helpers ---------------------------------------------------------------------------------


async def offers_of(d: Dispatcher, conn: Any, n: int | None = None) -> list[wire.Offer]:
    got = await d.dispatch_to(conn)
    if n is not None:
        assert got == n
    return conn.take_offers()  # type: ignore[no-any-return]


def aid_of(offer: wire.Offer) -> bytes:
    aid = parse_id(offer.attempt_id)
    assert aid is not None
    return aid


def body(t: Tenant, **fields: Any) -> bytes:
    fields.setdefault("queue", t.queue)
    fields.setdefault("kind", "k")
    return msgspec.json.encode({**fields, "payload": fields.pop("payload", None)})


async def start_one(db: Database, t: Tenant, info: Any, offer: wire.Offer) -> wire.Started:
    started = await attempts.start(db, t.namespace_id, info.session_id, aid_of(offer))
    assert isinstance(started, wire.Started), started
    return started


# -- the order of every transaction ----------------------------------------------------------


async def test_every_transaction_locks_usage_rows_first(
    db: Database, tenant: Callable[..., Awaitable[Tenant]], monkeypatch: pytest.MonkeyPatch
) -> None:
    t = await tenant()
    await t.add_queue("quota", max_unfinished_tasks=1_000)
    await t.add_queue("limited", max_concurrency=50, max_starts_per_second=1_000)
    hub = Hub(f"lock-order-{secrets.token_hex(4)}")
    actor = Actor(t.credential_id, t.application_id)
    ns = t.namespace_id
    rec = install(monkeypatch)
    c = Checker(rec)

    # Submit: single and batch, without and with a quota.
    await c.check("submit single", t.submit())
    await c.check("submit single (queue quota)", t.submit(queue="quota"))
    await c.check(
        "submit batch",
        submit_service.submit_batch(db, ns, t.application_id, [body(t) for _ in range(3)]),
    )
    await c.check(
        "submit batch (two queues, quota)",
        submit_service.submit_batch(
            db, ns, t.application_id, [body(t, queue="quota"), body(t), body(t, queue="quota")]
        ),
    )

    # Dispatch: one owner (the queue-wide claim).
    info, _ = await open_session(
        db, t, queues=["default", "quota", "limited"], max_concurrency=64, concurrency_keys=True
    )
    conn = await connect(db, hub, info)
    d = Dispatcher(db, hub)
    offers = await c.check("dispatch (one owner)", offers_of(d, conn))
    assert len(offers) == 8

    # Start (no limit in play): a batch of two.
    started = await c.check(
        "start (unlimited)",
        attempts.start_many(db, ns, [(info.session_id, aid_of(o)) for o in offers[:2]]),
    )
    assert all(isinstance(s, wire.Started) for s in started)
    run1, run2 = started
    # Report: complete, fail, cancelled (after a cancel request).
    await c.check(
        "report complete",
        attempts.report(
            db,
            ns,
            Report(
                "complete",
                parse_id(run1.attempt_id),
                run1.execution_token,
                result=msgspec.Raw(b"1"),
            ),
        ),
    )
    s3 = await start_one(db, t, info, offers[2])
    await c.check(
        "report fail",
        attempts.report(
            db,
            ns,
            Report(
                "fail",
                parse_id(s3.attempt_id),
                s3.execution_token,
                error=wire.FailError(type="boom"),
            ),
        ),
    )
    run2_task = offers[1].task.id
    await c.check("cancel running", tasks.cancel_task(db, ns, run2_task, hub=hub))
    await c.check(
        "report cancelled",
        attempts.report(
            db, ns, Report("cancelled", parse_id(run2.attempt_id), run2.execution_token)
        ),
    )
    # Cancel a LEASED task (its offer is released), then a WAITING one, then in bulk.
    await c.check("cancel leased", tasks.cancel_task(db, ns, offers[3].task.id, hub=hub))
    waiting = await t.submit()
    await c.check("cancel waiting", tasks.cancel_task(db, ns, waiting["id"], hub=hub))
    for _ in range(3):
        await t.submit(kind="bulk")
    out = await c.check("cancel bulk", tasks.cancel_bulk(db, ns, kind="bulk", hub=hub))
    assert out["cancelled"] == 3

    # Start with limits in play (queue concurrency and start rate) and with a concurrency key
    # (its permit row is locked last).
    await t.submit(queue="limited")
    await t.submit(queue="limited", concurrency_key="acct-1")
    lim = await offers_of(d, conn, 2)
    for o in lim:
        await c.check(
            f"start (limited{', keyed' if o.task.concurrency_key else ''})",
            attempts.start_many(db, ns, [(info.session_id, aid_of(o))]),
        )

    # Resolve a task under review.
    review = await t.submit()
    await force_state(db, t, review["id"], "NEEDS_REVIEW")
    rec.take()
    await c.check(
        "resolve",
        tasks.resolve_task(
            db, ns, review["id"], Resolve(action=ResolveAction.RETRY, note="again"), actor=actor
        ),
    )

    # A session's own dispatch (the node round over it) with several owners, with a
    # reservation quota, and with an owner new on an idle queue.
    b, q_owner, late = await add_owner(db), await add_owner(db), await add_owner(db)
    for _ in range(2):
        await submit_as(db, t, b)
        await t.submit()
    await set_max_reservations(db, q_owner, 1)
    for _ in range(3):
        await submit_as(db, t, q_owner)
    d2 = Dispatcher(db, hub)
    info2, _ = await open_session(db, t, max_concurrency=64)
    conn2 = await connect(db, hub, info2)
    fair = await c.check("dispatch (several owners, a quota)", offers_of(d2, conn2))
    assert len(fair) >= 5
    # An owner new on an idle queue: the round's look names it, so its row is locked first.
    await t.add_queue("fresh")
    info3, _ = await open_session(db, t, queues=["fresh"], max_concurrency=8)
    conn3 = await connect(db, hub, info3)
    assert await d2.dispatch_to(conn3) == 0  # the look: no work on the idle queue
    await submit_as(db, t, late, queue="fresh")
    new = await c.check("dispatch (an owner never seen)", offers_of(d2, conn3))
    assert len(new) == 1

    # The node dispatch round: every session of a node, two namespaces, several owners (one
    # with a quota), fairness keys and a keyed task, in ONE transaction.
    node = Hub(f"lock-order-node-{secrets.token_hex(4)}")
    t2 = await t.other_namespace()
    for ns_t in (t, t2):
        for key in ("u1", "u2", None):
            await ns_t.submit(fairness_key=key)
        await ns_t.submit(concurrency_key="node-key")
    await submit_as(db, t, q_owner)
    await submit_as(db, t, b)
    node_conns = [
        await connect(db, node, (await open_session(db, ns_t, max_concurrency=16,
                                                      concurrency_keys=True))[0])
        for ns_t in (t, t2)
    ]  # fmt: skip
    nd = Dispatcher(db, node)
    got = await c.check("dispatch (node round, two namespaces)", nd.run_once())
    assert got >= 6 and all(nc.offers() for nc in node_conns)
    # The next round of a busy node looks inside its transaction, after the session locks.
    for ns_t in (t, t2):
        await ns_t.submit(fairness_key="u3")
    again = await c.check("dispatch (node round, the look inside)", nd.run_once())
    assert again == 2
    for nc in node_conns:
        nc.take_offers()
        await sessions.close_session(db, nc.info.namespace_id, nc.info.session_id)

    # Recovery: a lost offer (its lease passed) and a lost running attempt.
    now = await db.now()
    lost_offer = fair[0]
    assert (
        await c.check(
            "recovery (lost offer)",
            recovery.recover_attempt(
                db, ns, aid_of(lost_offer), reason="lease_expired", now=now + timedelta(minutes=5)
            ),
        )
        == "released"
    )
    await start_one(db, t, info2, fair[1])
    assert (
        await c.check(
            "recovery (lost running)",
            recovery.recover_attempt(
                db, ns, aid_of(fair[1]), reason="lease_expired", now=now + timedelta(minutes=5)
            ),
        )
        == "lost"
    )

    # Session close: its offers released and its running attempts lost.
    await start_one(db, t, info2, fair[2])
    await c.check("session close", sessions.close_session(db, ns, info2.session_id))

    # The deadline sweep.
    soon = format_time(await db.now() + timedelta(seconds=2))
    await t.submit(deadline_at=soon, kind="deadline")
    swept = await c.check(
        "deadline expiry",
        tasks.expire_deadlines_once(db, now=await db.now() + timedelta(seconds=10)),
    )
    assert swept >= 1

    # A workflow advance creating tasks in two queues (a parallel step).
    flow = await Flow.create(db, t, queues=["wf-a", "wf-b"])
    doc = {
        "steps": [
            {
                "id": "fan",
                "type": "parallel",
                "branches": [
                    {
                        "name": "a",
                        "steps": [{"id": "ta", "type": "task", "queue": "wf-a", "kind": "a"}],
                    },
                    {
                        "name": "b",
                        "steps": [{"id": "tb", "type": "task", "queue": "wf-b", "kind": "b"}],
                    },
                ],
            },
            {"id": "j", "type": "join", "parallel": "fan"},
        ]
    }
    name = await flow.publish(doc)
    status, inst = await c.check("workflow start (tasks in two queues)", flow.start_named(name))
    assert status == 201, inst
    # ... and a workflow cancel (the engine cancels its tasks in the same transaction).
    await c.check(
        "workflow cancel",
        weave_instances.cancel_instance(db, ns, inst["id"], actor=flow.actor, hub=hub),
    )

    assert not c.failures, "lock order broken:\n" + "\n".join(
        f"{name}: {p}" for name, ps in c.failures.items() for p in ps
    )
    await check_invariants(db, ns)


# -- no deadlock under a race ----------------------------------------------------------------


async def test_cancel_and_resolve_racing_the_worker_side_never_deadlock(
    dsn: Any, db: Database, tenant: Callable[..., Awaitable[Tenant]]
) -> None:
    t = await tenant()
    ns = t.namespace_id
    actor = Actor(t.credential_id, t.application_id)
    hub = Hub(f"lock-race-{secrets.token_hex(4)}")
    # Tasks under review for the resolver (set up before the race).
    review_ids = []
    for _ in range(30):
        r = await t.submit(kind="review")
        await force_state(db, t, r["id"], "NEEDS_REVIEW")
        review_ids.append(r["id"])
    race = Database(dsn, minsize=1, maxsize=12, max_retries=20)
    await race.open()
    stop = asyncio.Event()
    task_ids: list[str] = []
    rng = random.Random(7)
    counts = {
        "submitted": 0,
        "offered": 0,
        "started": 0,
        "reported": 0,
        "cancelled": 0,
        "resolved": 0,
    }

    async def producer() -> None:
        while not stop.is_set():
            res = await submit_service.submit_batch(
                race, ns, t.application_id, [body(t, kind="race") for _ in range(8)]
            )
            for item in msgspec.json.decode(res.body)["items"]:
                if "task" in item:
                    task_ids.append(item["task"]["id"])
            counts["submitted"] += 8
            await asyncio.sleep(0.005)

    async def worker() -> None:
        info, _ = await open_session(race, t, max_concurrency=32)
        conn = await connect(race, hub, info)
        d = Dispatcher(race, hub)
        while not stop.is_set():
            await d.dispatch_to(conn)
            offers = conn.take_offers()
            counts["offered"] += len(offers)
            if not offers:
                await asyncio.sleep(0.002)
                continue
            started = await attempts.start_many(
                race, ns, [(info.session_id, aid_of(o)) for o in offers]
            )
            reports = [
                Report(
                    "complete", parse_id(s.attempt_id), s.execution_token, result=msgspec.Raw(b"1")
                )
                for s in started
                if isinstance(s, wire.Started)
            ]
            counts["started"] += len(reports)
            for i in range(0, len(reports), 4):
                await attempts.report_many(race, ns, reports[i : i + 4])
                counts["reported"] += len(reports[i : i + 4])

    async def canceller() -> None:
        while not stop.is_set():
            if len(task_ids) < 4:
                await asyncio.sleep(0.002)
                continue
            picks = rng.sample(task_ids[-40:], 3)
            for tid in picks:
                try:
                    await tasks.cancel_task(race, ns, tid, hub=hub)
                    counts["cancelled"] += 1
                except Exception as exc:  # a finished task: 409
                    if getattr(exc, "status", None) != 409:
                        raise

    async def resolver() -> None:
        for tid in review_ids:
            if stop.is_set():
                return
            await tasks.resolve_task(
                race, ns, tid, Resolve(action=ResolveAction.RETRY, note="race"), actor=actor
            )
            counts["resolved"] += 1
            await asyncio.sleep(0.01)

    workers = [
        asyncio.create_task(w()) for w in (producer, worker, worker, canceller, canceller, resolver)
    ]
    try:
        await asyncio.sleep(6)
    finally:
        stop.set()
        results = await asyncio.gather(*workers, return_exceptions=True)
        await race.close()
    errors = [r for r in results if isinstance(r, BaseException)]
    assert not errors, errors
    assert counts["reported"] > 20 and counts["cancelled"] > 20 and counts["resolved"] > 10, counts
    deadlocks = race.stats.retries.get(DEADLOCK, 0)
    assert deadlocks == 0, f"{deadlocks} deadlock victim(s) in the race: {counts}"
    await check_invariants(db, ns)
