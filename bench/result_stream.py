"""Measure the result-stream hot spot: N concurrent producers appending result events to ONE
namespace, whose sequence row (``orbit_event_streams``) every appending transaction locks
from its increment to COMMIT.

Shapes (each transaction looks like a task completion: raw events, then the result events
LAST, as ``orbit.events.append_result_events`` requires):

* ``baseline``   — 1 raw event per transaction, no result event (what the row lock costs
  is the difference with ``single``);
* ``single``     — 1 raw event + 1 result event per transaction (one sequence number taken
  per transaction);
* ``batch-B``    — B raw events + B result events per transaction (one range of B numbers
  taken with one statement).

Usage::

    python bench/result_stream.py [--dsn mysql://root@127.0.0.1:3306/mysql] [--seconds 3]
        [--producers 1,4,8,16] [--batches 10,100] [--out reports/result-stream.md]

It creates a throw-away database, migrates it, runs every case, checks the stream is
gap-free and unique afterwards, writes the report and drops the database.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import platform
import secrets
import statistics
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import pymysql

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from orbit import migrate  # noqa: E402
from orbit.bootstrap import bootstrap  # noqa: E402
from orbit.events import NewEvent, ResultSnapshot, append_events, append_result_events  # noqa: E402
from orbit.ids import new_id  # noqa: E402
from orbit.storage import DSN, Database, Tx  # noqa: E402


@dataclass
class Case:
    name: str
    producers: int
    batch: int  # result events per transaction (0 = baseline: none)
    events: int = 0
    commits: int = 0
    seconds: float = 0.0
    retries: int = 0
    p50_ms: float = 0.0
    p99_ms: float = 0.0

    @property
    def events_per_s(self) -> float:
        return self.events / self.seconds if self.seconds else 0.0

    @property
    def commits_per_s(self) -> float:
        return self.commits / self.seconds if self.seconds else 0.0


async def run_case(db: Database, ns: bytes, case: Case, seconds: float) -> Case:
    owner = new_id()
    rows = max(case.batch, 1)
    latencies: list[float] = []
    retries_before = sum(db.stats.retries.values())

    async def tx_body(tx: Tx) -> None:
        raw = [
            NewEvent(type="task.finished", subject_kind="task", subject_id=new_id(), data={"b": 1})
        ]
        await append_events(tx, ns, raw * rows)  # one multi-row INSERT
        if case.batch:
            snaps = [
                ResultSnapshot(task_id=new_id(), queue="bench", kind="k", owner_id=owner,
                               state="SUCCEEDED", result='{"ok":true}', attempts=1)
                for _ in range(case.batch)
            ]  # fmt: skip
            await append_result_events(tx, ns, snaps)

    async def producer(deadline: float) -> None:
        while time.perf_counter() < deadline:
            started = time.perf_counter()
            await db.transaction(tx_body)
            latencies.append((time.perf_counter() - started) * 1000)
            case.commits += 1
            case.events += case.batch

    started = time.perf_counter()
    deadline = started + seconds
    await asyncio.gather(*(producer(deadline) for _ in range(case.producers)))
    case.seconds = time.perf_counter() - started
    case.retries = sum(db.stats.retries.values()) - retries_before
    if latencies:
        latencies.sort()
        case.p50_ms = statistics.median(latencies)
        case.p99_ms = latencies[min(len(latencies) - 1, int(len(latencies) * 0.99))]
    return case


async def check_stream(db: Database, ns: bytes) -> tuple[int, bool]:
    async def run(tx: Tx) -> tuple[int, bool]:
        row = await tx.fetchone(
            "SELECT COUNT(*) AS n, COUNT(DISTINCT seq) AS d, COALESCE(MIN(seq), 0) AS lo, "
            "COALESCE(MAX(seq), 0) AS hi FROM orbit_result_events WHERE namespace_id = %s",
            (ns,),
        )
        assert row is not None
        n = int(row["n"])
        return n, n == int(row["d"]) and (n == 0 or (int(row["lo"]) == 1 and int(row["hi"]) == n))

    return await db.read(run)


def render(cases: list[Case], args: argparse.Namespace, total: int, ok: bool) -> str:
    cpu = os.cpu_count()
    lines = [
        "# Result stream hot spot (measured)",
        "",
        "Produced by `python bench/result_stream.py` "
        f"(`--seconds {args.seconds} --producers {args.producers} --batches {args.batches}`).",
        f"Machine: {cpu} cores, {platform.python_implementation()} {platform.python_version()}, "
        "MariaDB from `--dsn`, durable commits (server defaults), READ COMMITTED. "
        f"Load average before/after: {args.load_before} / {args.load_after} "
        "(other work on the machine shows up in the absolute numbers; compare rows).",
        "",
        "All producers write to ONE namespace, so every transaction that appends result events",
        "locks the same `orbit_event_streams` row from its increment to COMMIT. Each transaction",
        "writes its raw events first and the result events last (the rule in `orbit/events.py`).",
        "",
        "| shape | producers | result events / tx | commits/s | result events/s | p50 ms | p99 ms | retries |",
        "| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: |",
    ]
    for c in cases:
        lines.append(
            f"| {c.name} | {c.producers} | {c.batch} | {c.commits_per_s:,.0f} | "
            f"{c.events_per_s:,.0f} | {c.p50_ms:.1f} | {c.p99_ms:.1f} | {c.retries} |"
        )
    lines += ["", "## Reading", ""]
    lines += [
        "| producers | single ÷ baseline (commits/s) | best batch ÷ single (result events/s) |",
        "| ---: | ---: | ---: |",
    ]
    for n in sorted({c.producers for c in cases}):
        row = {c.name: c for c in cases if c.producers == n}
        base, single = row.get("baseline"), row.get("single")
        batches = [c for c in row.values() if c.name.startswith("batch-")]
        if base and single and base.commits_per_s and single.events_per_s:
            best = max((c.events_per_s for c in batches), default=single.events_per_s)
            lines.append(
                f"| {n} | {single.commits_per_s / base.commits_per_s:.2f} | "
                f"{best / single.events_per_s:.1f}× |"
            )
    by = {(c.name, c.producers): c for c in cases}
    ns_ = sorted({c.producers for c in cases})
    first, last = ns_[0], ns_[-1]
    s0, s1 = by.get(("single", first)), by.get(("single", last))
    b0, b1 = by.get(("baseline", first)), by.get(("baseline", last))
    if s0 and s1 and b0 and b1 and s0.commits_per_s and b0.commits_per_s and first != last:
        best = max(
            (c.events_per_s / s.events_per_s for c in cases for s in cases
             if c.name.startswith("batch-") and s.name == "single"
             and c.producers == s.producers and s.events_per_s),
            default=1.0,
        )  # fmt: skip
        lines += [
            "",
            f"Measured here: from {first} to {last} producers, `single` went "
            f"{s0.commits_per_s:,.0f} → {s1.commits_per_s:,.0f} commits/s "
            f"(×{s1.commits_per_s / s0.commits_per_s:.1f}) while `baseline` went "
            f"{b0.commits_per_s:,.0f} → {b1.commits_per_s:,.0f} "
            f"(×{b1.commits_per_s / b0.commits_per_s:.1f}); the p50 latency of `single` went "
            f"{s0.p50_ms:.1f} → {s1.p50_ms:.1f} ms. One range per batch carried up to "
            f"{best:.0f}× the result events per second of one number per transaction.",
        ]
    lines += [
        "",
        "* `single ÷ baseline` is what one sequence number per transaction costs: the three",
        "  extra statements (stream upsert, re-read, event insert) plus the wait for the stream",
        "  row, which is held from the increment to COMMIT. If the row capped throughput, the",
        "  ratio would fall as producers are added, and `single` commits/s would stop growing.",
        "* Why it can cap: transactions that take numbers in one namespace queue on the row",
        "  from their increment until their commit releases it, one after another; more",
        "  producers make a longer queue, not more throughput. How much of the commit path",
        "  runs while the row is held depends on the engine: the measurement is what counts.",
        "* `best batch ÷ single` is what taking one range per batch of changes buys: the row is",
        "  locked once per transaction, whatever the number of events in it, so the same",
        "  serial commits carry many events. Namespaces do not share a row: the bound is per",
        "  namespace.",
        "* Ordering is never weakened: every case ends with the gap-free, unique check below.",
        "",
        f"Stream check after all cases: {total} result events, sequence "
        f"{'gap-free and unique (1..n)' if ok else 'BROKEN'}.",
        "",
    ]
    return "\n".join(lines)


async def run_all(dsn: DSN, args: argparse.Namespace) -> tuple[list[Case], int, bool]:
    producers = [int(p) for p in args.producers.split(",")]
    batches = [int(b) for b in args.batches.split(",") if b]
    db = await Database.connect(dsn, maxsize=max(producers) + 2)
    try:
        ns = (await bootstrap(db, "bench", "bench")).namespace_id
        cases: list[Case] = []
        for n in producers:
            cases.append(Case("baseline", n, 0))
            cases.append(Case("single", n, 1))
            cases.extend(Case(f"batch-{b}", n, b) for b in batches)
        for case in cases:
            await run_case(db, ns, case, args.seconds)
            print(
                f"{case.name:>10} x{case.producers:<3} {case.commits_per_s:8,.0f} commits/s "
                f"{case.events_per_s:9,.0f} events/s p99 {case.p99_ms:6.1f} ms",
                flush=True,
            )
        total, ok = await check_stream(db, ns)
        return cases, total, ok
    finally:
        await db.close()


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument(
        "--dsn", default=os.environ.get("ORBIT_TEST_DSN", "mysql://root@127.0.0.1:3306/mysql")
    )
    p.add_argument("--seconds", type=float, default=3.0)
    p.add_argument("--producers", default="1,4,8,16")
    p.add_argument("--batches", default="10,100")
    p.add_argument("--out", default=str(ROOT / "reports" / "result-stream.md"))
    args = p.parse_args()
    server = DSN.parse(args.dsn)
    name = f"orbit_bench_{secrets.token_hex(4)}"
    admin = pymysql.connect(autocommit=True, **server.connect_kwargs(with_database=False))
    try:
        with admin.cursor() as cur:
            cur.execute(f"CREATE DATABASE `{name}` CHARACTER SET utf8mb4 COLLATE utf8mb4_bin")
        dsn = server.with_database(name)
        migrate.up(dsn)
        args.load_before = f"{os.getloadavg()[0]:.1f}"
        cases, total, ok = asyncio.run(run_all(dsn, args))
        args.load_after = f"{os.getloadavg()[0]:.1f}"
    finally:
        with admin.cursor() as cur:
            cur.execute(f"DROP DATABASE IF EXISTS `{name}`")
        admin.close()
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(render(cases, args, total, ok), encoding="utf-8")
    print(f"wrote {out}")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
