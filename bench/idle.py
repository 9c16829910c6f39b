"""S7 (what 1,000 idle tenants cost) and S8 (what a subscription created from ``earliest``
on a 1M-event namespace writes). Each runs on its own fresh scratch database and server
process, so nothing of the earlier scenarios (S4's backlog, S5's owners) is counted.

* **S7**: 1,000 namespaces (each its own application, key, queue and subscription), each
  with one idle SDK worker session (4 worker processes of 250 sessions) and one subscription
  stream over WebSocket (SDK Subscribers in the bench process), each kind connected 20 a
  second (the worker sessions spread over their processes). One
  probe task per namespace proves every session and stream works (``probes_answered``: how
  many came back within 300 s); after the probes' results are acked and
  the connections have settled (10 s), a window at rest measures the server's and MariaDB's
  CPU (fraction of one core) and the ledger (statements, transactions, rows written per
  second).
* **S8**: a namespace whose result stream holds 1M events: one real task's result event,
  copied by SQL (``INSERT … SELECT`` from it, 50k rows a statement, kept out of the binary
  log; the stream row's ``last_seq`` kept equal to the highest sequence), then the level
  waits until MariaDB has flushed the insert (as S4 does) and then until its write counters
  are quiet (redo + data-file bytes grew by less than 16 KiB a second for 3 seconds in a
  row), so no background flush or purge of the seeding is counted. A control window of
  ``control_s`` with nothing happening shows what MariaDB writes on its own. Window 1: the
  subscription is created with ``"start": "earliest"`` and nothing consumes it; window 2
  (right after): one SDK Subscriber consumes and acks. Per window: rows written
  (``Handler_write``, ``Innodb_rows_inserted`` where the server has it, per table from the
  binary log), redo bytes (``Innodb_os_log_written``), data-file bytes
  (``Innodb_data_written``), and their sum as the bytes MariaDB wrote; the exact row counts
  of the subscription's tables before the PUT and after each window.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import time
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import httpx
import msgspec

from bench import ledger
from bench.env import ScratchDatabase, Server, WorkerProcs
from bench.fairness import make_owners
from bench.lean_http import LeanClient
from bench.scenarios import (
    Results,
    S1Config,
    Tenant,
    _finish_profile,
    _start_profile,
    put_queue,
    put_subscription,
    settle,
)

_ENC = msgspec.json.Encoder()


@contextlib.asynccontextmanager
async def fresh_stack(
    log_path: Path | None = None, tree: Path | None = None, env: dict[str, str] | None = None
) -> AsyncIterator[tuple[ScratchDatabase, Server, Tenant]]:
    """A new scratch database (migrated, bootstrapped) and server process; dropped after."""
    db = ScratchDatabase(tree=tree)
    await asyncio.to_thread(db.create)
    server: Server | None = None
    try:
        await asyncio.to_thread(db.migrate)
        boot = await asyncio.to_thread(db.bootstrap, "bench", "bench", True)
        server = Server(db.url(), log_path=log_path, tree=tree, env=env or {})
        await server.start()
        yield db, server, Tenant(server.url, boot["key"], boot["namespace"],
                                 boot["application_id"])  # fmt: skip
    finally:
        if server is not None:
            await server.stop()
        await asyncio.to_thread(db.drop)


def _rates(led: dict[str, Any], seconds: float) -> dict[str, float | None]:
    tot = led.get("totals") or {}
    return {
        f"{k}_per_s": (round(v / seconds, 2) if isinstance(v, int | float) else None)
        for k, v in tot.items()
        if k in ("statements", "transactions", "row_writes", "index_entries_written",
                 "fsyncs", "redo_bytes")
    }  # fmt: skip


async def s7(*, namespaces: int = 1000, processes: int = 4, settle_s: float = 10.0,
             window_s: float = 30.0, probe_limit_s: float = 300.0,
             log_path: Path | None = None, tree: Path | None = None,
             profile: str | None = None) -> dict[str, Any]:  # fmt: skip
    queue = "idle"
    sub = "sub-idle"
    async with fresh_stack(log_path, tree) as (db, server, admin):
        began = time.monotonic()
        owners = await make_owners(server.url, admin.key, namespaces)
        sem = asyncio.Semaphore(8)
        async with httpx.AsyncClient(timeout=60.0) as client:

            async def setup(t: Tenant) -> None:
                async with sem:
                    await put_queue(client, t, queue)
                    await put_subscription(client, t, sub, queue)

            await asyncio.gather(*(setup(t) for t in owners))
        setup_s = time.monotonic() - began
        streams = [Results(t, sub) for t in owners]
        workers = WorkerProcs()
        workers.start(url=server.url, key="", namespace="", queue=queue, processes=processes,
                      sessions=0, concurrency=1, stagger_s=0.05 * processes,
                      targets=[{"key": t.key, "namespace": t.namespace} for t in owners])  # fmt: skip
        for i, r in enumerate(streams):  # a few at a time: a burst of 1,000 connects is not idle
            r.start()
            if i % 20 == 19:
                await asyncio.sleep(1.0)
        try:
            body = _ENC.encode({"queue": queue, "kind": "noop", "payload": {}})
            async with LeanClient(server.url, 8) as lean:

                async def probe(t: Tenant, r: Results) -> bool:
                    async with sem:
                        resp = await lean.post(f"{t.base()}/tasks", headers=t.headers, content=body)
                    if resp.status_code != 201:
                        return False
                    try:
                        await r.wait_for(resp.json()["id"], probe_limit_s)
                    except TimeoutError:
                        return False
                    return True

                answered = await asyncio.gather(
                    *(probe(t, r) for t, r in zip(owners, streams, strict=True))
                )
            ready_s = time.monotonic() - began
            await asyncio.sleep(settle_s)
            s0 = server.sample()
            mark = await ledger.current().begin(s0.cpu_s)
            t0 = time.monotonic()
            spy = _start_profile(server, S1Config(seconds=window_s, profile=profile))
            await asyncio.sleep(window_s)
            s1 = server.sample()
            closed = await ledger.current().end(mark, s1.cpu_s)
            prof = await _finish_profile(spy)
            window = time.monotonic() - t0
            rss = s1.rss_kb
        finally:
            tails = await workers.stop()
            for r in streams:
                await r.stop()
        led = await ledger.current().report(closed, db.name, None)
    mcpu = (led.get("totals") or {}).get("mariadb_cpu_ms")
    return {
        "namespaces": namespaces,
        "worker_processes": processes,
        "setup_s": round(setup_s, 1),
        "ready_s": round(ready_s, 1),
        # Namespaces whose probe task came back through their stream in time: fewer than
        # all means the window measured a system still connecting.
        "probes_answered": sum(answered),
        "window_s": round(window, 1),
        "server_core": round((s1.cpu_s - s0.cpu_s) / window, 4),
        "mariadb_core": round(mcpu / 1000 / window, 4) if isinstance(mcpu, int | float) else None,
        "server_rss_mb": round(rss / 1024, 1),
        "rates": _rates(led, window),
        "ledger": led,
        "profile": prof,
        "load_avg": [round(x, 2) for x in os.getloadavg()],
        "subscriber_errors": [repr(r.error) for r in streams if r.error][:3],
        "worker_stderr_tail": [x[-500:] for x in tails if x.strip()][:2],
    }


WRITE_KEYS = ("Handler_write", "Innodb_rows_inserted", "Innodb_os_log_written",
              "Innodb_data_written", "Innodb_pages_written", "Binlog_bytes_written")  # fmt: skip


def written(led: dict[str, Any]) -> dict[str, Any]:
    """What MariaDB wrote in a window: the status counters of :data:`WRITE_KEYS`, the rows
    per table (binary log) and ``mb_written`` = (redo + data-file bytes) / 2^20 (the binary
    log is the bench's instrument, not counted)."""
    st = led.get("status") or {}
    out: dict[str, Any] = {k: st.get(k) for k in WRITE_KEYS}
    redo, data = st.get("Innodb_os_log_written") or 0, st.get("Innodb_data_written") or 0
    out["mb_written"] = round((redo + data) / 2**20, 3)
    if "per_table" in led:
        out["rows_by_table"] = {
            t: v["inserted"] + v["updated"] + v["deleted"] for t, v in led["per_table"].items()
        }
    if led.get("notes"):
        out["notes"] = led["notes"]
    return out


async def _backlog_events(db: ScratchDatabase, namespace: str, n: int) -> float:
    """Copy the namespace's one result event until its stream holds ``n`` (see module doc)."""

    def run() -> float:
        began = time.monotonic()
        conn = db.connect(unlogged=True)
        try:
            with conn.cursor() as cur:
                cur.execute("SELECT id FROM orbit_namespaces WHERE name = %s", (namespace,))
                (ns,) = cur.fetchone()
                cur.execute(
                    "SELECT COLUMN_NAME FROM information_schema.COLUMNS WHERE TABLE_SCHEMA ="
                    " DATABASE() AND TABLE_NAME = 'orbit_result_events'"
                    " AND EXTRA NOT LIKE '%%GENERATED%%' ORDER BY ORDINAL_POSITION"
                )
                cols = [r[0] for r in cur.fetchall()]
                cur.execute("SELECT MAX(seq) FROM orbit_result_events WHERE namespace_id = %s",
                            (ns,))  # fmt: skip
                (top,) = cur.fetchone()
                if top is None:
                    raise RuntimeError("S8: the template task left no result event")
                top = int(top)
                unique = "UNHEX(CONCAT('ffff5e8e', LPAD(HEX(%(base)s + s.seq), 24, '0')))"
                select = ", ".join(
                    "%(base)s + s.seq" if c == "seq"
                    else unique if c in ("event_id", "task_id")
                    else f"t.{c}" for c in cols
                )  # fmt: skip
                have = top
                while have < n:
                    chunk = min(50_000, n - have)
                    conn.begin()
                    cur.execute(
                        f"INSERT INTO orbit_result_events ({', '.join(cols)}) SELECT {select}"
                        f" FROM orbit_result_events t JOIN seq_1_to_{chunk} s"
                        " WHERE t.namespace_id = %(ns)s AND t.seq = %(top)s",
                        {"base": have, "ns": ns, "top": top},
                    )
                    have += chunk
                    cur.execute(
                        "UPDATE orbit_event_streams SET last_seq = %s WHERE namespace_id = %s",
                        (have, ns),
                    )
                    conn.commit()
        finally:
            conn.close()
        return time.monotonic() - began

    return await asyncio.to_thread(run)


_QUIET_KEYS = ("Innodb_os_log_written", "Innodb_data_written")

#: The tables a subscription and its deliveries write (exact counts, outside the windows).
SUBSCRIPTION_TABLES = ("orbit_subscriptions", "orbit_deliveries", "orbit_delivery_ranges",
                       "orbit_audit_events")  # fmt: skip


async def quiet(db: ScratchDatabase, *, limit_s: float = 120.0, bytes_per_s: int = 16_384,
                seconds: int = 3) -> dict[str, Any]:  # fmt: skip
    """Wait until MariaDB's redo + data-file bytes grew by less than ``bytes_per_s`` in each
    of ``seconds`` consecutive seconds (or ``limit_s`` passed). Returns what it saw."""

    async def sample() -> int:
        got = await db.query(
            "SHOW GLOBAL STATUS WHERE Variable_name IN ('Innodb_os_log_written',"
            " 'Innodb_data_written')"
        )
        return sum(int(v) for _, v in got)

    began = time.monotonic()
    last = await sample()
    calm = 0
    rates: list[int] = []
    while time.monotonic() - began < limit_s and calm < seconds:
        await asyncio.sleep(1.0)
        now = await sample()
        rates.append(now - last)
        last = now
        calm = calm + 1 if rates[-1] < bytes_per_s else 0
    return {"waited_s": round(time.monotonic() - began, 1), "quiet": calm >= seconds,
            "last_bytes_per_s": rates[-seconds:]}  # fmt: skip


async def table_rows(db: ScratchDatabase) -> dict[str, int]:
    """Exact row counts of :data:`SUBSCRIPTION_TABLES` (the ones the schema has)."""
    have = {r[0] for r in await db.query(
        "SELECT TABLE_NAME FROM information_schema.TABLES WHERE TABLE_SCHEMA = DATABASE()")}  # fmt: skip
    out: dict[str, int] = {}
    for t in SUBSCRIPTION_TABLES:
        if t in have:
            ((n,),) = await db.query(f"SELECT COUNT(*) FROM {t}")
            out[t] = int(n)
    return out


async def s8(*, events: int = 1_000_000, window_s: float = 30.0, consumer_s: float = 10.0,
             control_s: float = 10.0, log_path: Path | None = None,
             tree: Path | None = None) -> dict[str, Any]:  # fmt: skip
    queue = "s8"
    sub = "sub-s8-earliest"
    async with fresh_stack(log_path, tree) as (db, _server, t), \
            httpx.AsyncClient(timeout=600.0) as client:  # fmt: skip
        await put_queue(client, t, queue)
        workers = WorkerProcs()
        workers.start(url=t.url, key=t.key, namespace=t.namespace, queue=queue, processes=1,
                      sessions=1, concurrency=1)  # fmt: skip
        try:
            r = await client.post(f"{t.base()}/tasks", headers=t.headers,
                                  content=_ENC.encode({"queue": queue, "kind": "noop",
                                                       "payload": {}}))  # fmt: skip
            r.raise_for_status()
            tid = r.json()["id"]
            for _ in range(600):
                got = await client.get(f"{t.base()}/tasks/{tid}", headers=t.headers)
                if got.status_code == 200 and got.json().get("state") == "SUCCEEDED":
                    break
                await asyncio.sleep(0.1)
            else:
                raise RuntimeError("S8: the template task did not finish")
        finally:
            await workers.stop()
        await asyncio.sleep(1.0)  # its result event committed with the completion
        insert_s = await _backlog_events(db, t.namespace, events)
        settled = await settle(db)
        calm = await quiet(db)
        mark0 = await ledger.current().begin()
        await asyncio.sleep(control_s)
        closed0 = await ledger.current().end(mark0)
        rows_before = await table_rows(db)
        body = {"filter": {"queues": [queue]}, "start": "earliest", "ack_timeout_ms": 60_000,
                "max_deliveries": 10, "max_in_flight": 1000}  # fmt: skip
        mark = await ledger.current().begin()
        put_began = time.monotonic()
        put = asyncio.create_task(
            client.put(f"{t.base()}/subscriptions/{sub}", headers=t.headers, json=body)
        )
        done, _ = await asyncio.wait({put}, timeout=window_s)
        put_s = round(time.monotonic() - put_began, 2) if done else None
        await asyncio.sleep(max(0.0, window_s - (time.monotonic() - put_began)))
        closed1 = await ledger.current().end(mark)
        if not done:
            await put  # the consumer needs the subscription
            put_s = round(time.monotonic() - put_began, 2)
        put_status = put.result().status_code
        rows_after_put = await table_rows(db)
        consumer = Results(t, sub)
        mark2 = await ledger.current().begin()
        consumer.start()
        await asyncio.sleep(consumer_s)
        closed2 = await ledger.current().end(mark2)
        received = consumer.count
        await consumer.stop()
        rows_after_consumer = await table_rows(db)
        led0 = await ledger.current().report(closed0, db.name, None)
        led1 = await ledger.current().report(closed1, db.name, None)
        led2 = await ledger.current().report(closed2, db.name, None)
    return {
        "events": events,
        "backlog_insert_s": round(insert_s, 1),
        "settle": settled,
        "quiet": calm,
        "control": {"window_s": control_s, **written(led0)},
        "put_status": put_status,
        "put_s": put_s,
        "no_consumer": {"window_s": window_s, **written(led1)},
        "one_consumer": {"window_s": consumer_s, "received": received, **written(led2)},
        "table_rows": {
            "before": rows_before,
            "after_put_window": rows_after_put,
            "after_consumer_window": rows_after_consumer,
        },
        "subscriber_error": repr(consumer.error) if consumer.error else None,
        "load_avg": [round(x, 2) for x in os.getloadavg()],
    }
