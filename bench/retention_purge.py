"""Dispatch latency while the retention purge deletes a large history.

``python -m bench.retention_purge [--tasks 1000000] [--seconds 30] [--dsn DSN]``

Builds a fresh database on the given server (default the shared one at 127.0.0.1:3306; it
is dropped at the end), one tenant, and ``--tasks`` SUCCEEDED tasks finished 40 days ago,
each with its attempt and its result event, plus raw event rows (one per 60 tasks, as node
rounds write them) — inserted with set-based SQL (MariaDB's sequence engine). Then it runs
the real task lifecycle in a loop (submit, dispatch to a session, start, complete: the
service functions a node runs, in-process) and records each step's latency:

1. ``baseline``: ``--seconds`` without the purge;
2. ``purging``: the same while :class:`orbit.retention_purge.RetentionPurge` deletes the
   history (``finished_tasks_days`` and ``events_days`` of 7), until it has caught up or
   ``--seconds`` passed; the purge's rows per second are reported too.

Prints one JSON object (p50/p95/p99/max per step and phase, rows purged, purge rate).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import secrets
import statistics
import time
from datetime import datetime
from typing import Any

import msgspec

from orbit import retention
from orbit.audit import CLI_ACTOR
from orbit.bootstrap import bootstrap
from orbit.context import AppContext
from orbit.migrate import up
from orbit.retention import RetentionPut
from orbit.retention_purge import RetentionPurge
from orbit.settings import Settings
from orbit.storage import DSN, Database, Tx
from pulse import attempts, sessions, submit, wire
from pulse import queues as queue_service
from pulse.attempts import Report
from pulse.dispatch import Dispatcher
from pulse.hub import Connection, Hub
from pulse.store import tasks as task_store
from pulse.task_purge import TaskPurge, oldest_unfinished_task
from pulse.types import QueuePut, TaskSubmit
from weave.retention import oldest_running_instance, running_instance_tasks

CHUNK = 50_000


class _Conn(Connection):
    kind = "bench"

    def __init__(self, info: Any, queues: Any) -> None:
        super().__init__(info, queues)
        self.frames: list[Any] = []

    async def send(self, frame: Any) -> bool:
        self.frames.append(frame)
        return True

    def take_offers(self) -> list[wire.Offer]:
        out = [f for f in self.frames if isinstance(f, wire.Offer)]
        self.frames = [f for f in self.frames if not isinstance(f, wire.Offer)]
        return out


async def _populate(db: Database, ns: bytes, owner: bytes, queue_id: bytes, n: int) -> float:
    """``n`` finished tasks 40 days old with attempts, result events and raw events."""
    started = time.monotonic()
    salt = secrets.token_hex(4)
    for lo in range(0, n, CHUNK):
        hi = min(n, lo + CHUNK)
        args = {"ns": ns, "owner": owner, "queue_id": queue_id, "lo": lo + 1, "hi": hi,
                "salt": salt}  # fmt: skip

        async def chunk(tx: Tx, args: dict[str, Any] = args) -> None:
            # Times spread over a day, 40 days ago; ids derived from the sequence number.
            await tx.execute(
                "INSERT INTO pulse_tasks (namespace_id, id, owner_id, queue_id, queue_name, kind,"
                " payload, available_at, max_attempts, retry_backoff_initial_ms,"
                " retry_backoff_max_ms, retry_backoff_multiplier, state, attempts, result,"
                " created_at, state_changed_at, started_at, finished_at)"
                " SELECT %(ns)s, UNHEX(MD5(CONCAT('t', %(salt)s, seq))), %(owner)s, %(queue_id)s,"
                " 'default', 'bench', '{}', t, 3, 1000, 60000, 2, 'SUCCEEDED', 1, '{}',"
                " t, t, t, t FROM (SELECT seq, UTC_TIMESTAMP(6) - INTERVAL 40 DAY"
                " + INTERVAL seq * 80 MICROSECOND AS t FROM seq_1_to_100000000"
                " WHERE seq BETWEEN %(lo)s AND %(hi)s) s",
                args,
            )
            await tx.execute(
                "INSERT INTO pulse_attempts (namespace_id, id, task_id, generation, session_id,"
                " state, lease_expires_at, offered_at, started_at, finished_at, result)"
                " SELECT %(ns)s, UNHEX(MD5(CONCAT('a', %(salt)s, seq))),"
                " UNHEX(MD5(CONCAT('t', %(salt)s, seq))), 1, UNHEX(MD5('session')), 'SUCCEEDED',"
                " t, t, t, t, '{}' FROM (SELECT seq, UTC_TIMESTAMP(6) - INTERVAL 40 DAY"
                " + INTERVAL seq * 80 MICROSECOND AS t FROM seq_1_to_100000000"
                " WHERE seq BETWEEN %(lo)s AND %(hi)s) s",
                args,
            )
            await tx.execute(
                "INSERT INTO orbit_result_events (namespace_id, seq, event_id, type, task_id,"
                " queue, kind, owner_id, state, result, attempts, finished_at, created_at)"
                " SELECT %(ns)s, seq, UNHEX(MD5(CONCAT('e', %(salt)s, seq))), 'task.succeeded',"
                " UNHEX(MD5(CONCAT('t', %(salt)s, seq))), 'default', 'bench', %(owner)s,"
                " 'SUCCEEDED', '{}', 1, t, t FROM (SELECT seq, UTC_TIMESTAMP(6) - INTERVAL 40 DAY"
                " + INTERVAL seq * 80 MICROSECOND AS t FROM seq_1_to_100000000"
                " WHERE seq BETWEEN %(lo)s AND %(hi)s) s",
                args,
            )
            await tx.execute(
                "INSERT INTO orbit_event_batches (namespace_id, id, type, subject_kind, subjects,"
                " entries, created_at)"
                " SELECT %(ns)s, UNHEX(MD5(CONCAT('b', %(salt)s, seq))), 'task.succeeded', 'task',"
                " 60, '[]', UTC_TIMESTAMP(6) - INTERVAL 40 DAY + INTERVAL seq * 80 MICROSECOND"
                " FROM seq_1_to_100000000 WHERE seq BETWEEN %(lo)s AND %(hi)s AND seq %% 60 = 0",
                args,
            )

        await db.transaction(chunk)

    async def stream(tx: Tx) -> None:
        await tx.execute(
            "INSERT INTO orbit_event_streams (namespace_id, last_seq, updated_at)"
            " VALUES (%s, %s, UTC_TIMESTAMP(6))", (ns, n),
        )  # fmt: skip

    await db.transaction(stream)
    return time.monotonic() - started


def _summary(samples: list[float]) -> dict[str, float]:
    if not samples:
        return {}
    s = sorted(samples)

    def pct(p: float) -> float:
        return round(s[min(len(s) - 1, int(p * len(s)))] * 1000, 2)

    return {"n": len(s), "p50_ms": pct(0.50), "p95_ms": pct(0.95), "p99_ms": pct(0.99),
            "max_ms": round(s[-1] * 1000, 2), "mean_ms": round(statistics.fmean(s) * 1000, 2)}  # fmt: skip


async def _lifecycle(
    db: Database, ns: bytes, owner: bytes, conn: _Conn, dispatcher: Dispatcher,
    stop: asyncio.Event, out: dict[str, list[float]],
) -> None:  # fmt: skip
    body = msgspec.json.decode(b'{"queue": "default", "kind": "probe", "payload": {}}',
                               type=TaskSubmit)
    while not stop.is_set():
        t0 = time.monotonic()
        await submit.submit_one(db, ns, owner, body)
        t1 = time.monotonic()
        # A claim skips rows another transaction holds (SKIP LOCKED); a node's dispatcher
        # tries again on its next round, so does this loop (counted in "dispatch_retries").
        while await dispatcher.dispatch_to(conn) != 1:
            out["dispatch_retries"].append(0.0)
            await asyncio.sleep(0.001)
        t2 = time.monotonic()
        (offer,) = conn.take_offers()
        aid = bytes.fromhex(offer.attempt_id)
        started = await attempts.start(db, ns, conn.info.session_id, aid)
        assert isinstance(started, wire.Started)
        t3 = time.monotonic()
        await attempts.report(
            db, ns, Report("complete", aid, started.execution_token, result=msgspec.Raw(b"{}"))
        )
        t4 = time.monotonic()
        out["submit"].append(t1 - t0)
        out["dispatch"].append(t2 - t1)
        out["start"].append(t3 - t2)
        out["complete"].append(t4 - t3)
        out["cycle"].append(t4 - t0)


async def _phase(
    db: Database, ns: bytes, owner: bytes, conn: _Conn, dispatcher: Dispatcher, seconds: float,
    purge: RetentionPurge | None,
) -> dict[str, Any]:  # fmt: skip
    out: dict[str, list[float]] = {k: [] for k in ("submit", "dispatch", "start", "complete",
                                                   "cycle", "dispatch_retries")}  # fmt: skip
    stop = asyncio.Event()
    probe = asyncio.create_task(_lifecycle(db, ns, owner, conn, dispatcher, stop, out))
    started = time.monotonic()
    purged = 0
    if purge is None:
        await asyncio.sleep(seconds)
    else:
        while time.monotonic() - started < seconds:
            res = await purge.purge_namespace(ns)
            purged += sum(res.deleted.values())
            if res.lag_s == 0 and not res.deleted:
                break
    elapsed = time.monotonic() - started
    stop.set()
    await probe
    retries = len(out.pop("dispatch_retries"))
    phase: dict[str, Any] = {k: _summary(v) for k, v in out.items()}
    phase["dispatch_retries"] = retries
    phase["seconds"] = round(elapsed, 1)
    if purge is not None:
        phase["rows_purged"] = purged
        phase["purge_rows_per_s"] = round(purged / elapsed) if elapsed else 0
    return phase


async def main(args: argparse.Namespace) -> dict[str, Any]:
    server = DSN.parse(args.dsn)
    name = f"orbit_bench_retention_{secrets.token_hex(4)}"
    dsn = server.with_database(name)
    up(dsn, migrations_dir=args.migrations_dir or "migrations")
    db = await Database.connect(dsn, maxsize=8)
    try:
        boot = await bootstrap(db, f"bench-{secrets.token_hex(3)}", "bench")
        ns, owner = boot.namespace_id, boot.application_id
        q = await queue_service.put_queue(db, ns, "default", QueuePut())
        queue_id = bytes.fromhex(q.queue["id"])
        populate_s = await _populate(db, ns, owner, queue_id, args.tasks)
        hub = Hub("bench-node")
        created = await sessions.create_session(
            db, namespace_id=ns, application_id=owner, credential_id=boot.credential_id,
            allowed_queues=None, settings=sessions.WorkerSettings(session_lease_ms=24 * 3_600_000),
            body=wire.SessionCreate(instance=wire.InstanceInfo(host="bench", pid=1, sdk="bench"),
                                    queues=["default"], max_concurrency=4),
        )  # fmt: skip
        info = await sessions.authenticate(
            db, "bench", created.session_token, created.session_id
        )
        conn = _Conn(info, await sessions.resolve_queues(db, ns, info.queues))
        assert await sessions.attach_node(db, ns, info.session_id, hub.node_id)
        hub.register(conn)
        dispatcher = Dispatcher(db, hub)
        baseline = await _phase(db, ns, owner, conn, dispatcher, args.seconds, None)
        await retention.put_retention(
            db, CLI_ACTOR, ns, RetentionPut(finished_tasks_days=7, events_days=7)
        )
        purge = RetentionPurge(
            AppContext(db=db, settings=Settings(retention_purge_duty=args.duty)),
            parts=[TaskPurge(running_instance_tasks)],
            holders=[oldest_unfinished_task, oldest_running_instance],
        )  # fmt: skip
        plan = await db.fetchall(
            "EXPLAIN " + task_store.Q.task_purge_candidates,
            {"namespace_id": ns, "state": "SUCCEEDED", "cutoff": datetime(2100, 1, 1),
             "after_t": datetime(1970, 1, 1), "after_id": b"", "limit": 500},
        )  # fmt: skip
        purging = await _phase(db, ns, owner, conn, dispatcher, args.purge_seconds, purge)
        purging["candidate_plan"] = [{k: r[k] for k in ("key", "rows", "Extra")} for r in plan]
        return {"tasks": args.tasks, "duty": args.duty, "populate_s": round(populate_s, 1),
                "baseline": baseline, "purging": purging}  # fmt: skip
    finally:
        await db.close()
        import pymysql

        c = pymysql.connect(**server.connect_kwargs())
        with c.cursor() as cur:
            cur.execute(f"DROP DATABASE IF EXISTS `{name}`")
        c.close()


def cli() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--tasks", type=int, default=1_000_000)
    p.add_argument("--seconds", type=float, default=30.0, help="baseline phase length")
    p.add_argument("--purge-seconds", type=float, default=600.0,
                   help="purging phase: at most this long (ends when the purge caught up)")
    p.add_argument("--duty", type=float, default=Settings().retention_purge_duty,
                   help="ORBIT_RETENTION_PURGE_DUTY: share of the time spent in purge batches")
    p.add_argument("--dsn", default="mysql://root@127.0.0.1:3306/mysql")
    p.add_argument("--migrations-dir", default=None)
    print(json.dumps(asyncio.run(main(p.parse_args())), indent=1))


if __name__ == "__main__":
    cli()
