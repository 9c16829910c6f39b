"""A nightly report at 02:30 Berlin time, through daylight-saving changes.

``publish`` puts the schedule (``PUT /v1/namespaces/{ns}/schedules/{name}``): cron
``30 2 * * *`` in ``Europe/Berlin``. 02:30 does not exist on the last Sunday of March (the
clocks jump from 02:00 to 03:00) and happens twice on the last Sunday of October. Orbit's
policy (docs/api/schedules.md): a missing local time fires once at the first instant after
the gap (03:00 CEST); a repeated one fires once, at its first instance (02:30 CEST). Either
way there is exactly one report per night.

Each occurrence creates a task whose ``dedup_key`` is ``nightly-report:{fire_at_local}``:
the night it is for, in local time. The handler reads it back to know which night to
report on (not "now": after downtime the catch-up window may fire it hours late), and the
key makes the task unique per night even if the schedule is published again.

``worker`` runs the handler; the report is a JSON line in ``--out`` written through
``ctx.effect`` (at most once per task).

    export ORBIT_URL=... ORBIT_KEY=... ORBIT_NAMESPACE=default
    orbit queues put reports
    python docs/examples/nightly_cron/nightly.py publish
    python docs/examples/nightly_cron/nightly.py worker --out /tmp/reports.jsonl
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import sys
from typing import Any

import httpx
from orbit_sdk import OrbitClient, TaskContext, Worker

SCHEDULE = "nightly-report"
QUEUE = "reports"
KIND = "nightly_report"


def schedule_body(cron: str, timezone: str, start_at: str | None) -> dict[str, Any]:
    return {
        "queue": QUEUE,
        "cron": cron,
        "timezone": timezone,
        "task": {
            "kind": KIND,
            "payload": {"report": "daily-sales"},
            "dedup_key": "nightly-report:{fire_at_local}",
            "deadline_ms": 6 * 3600 * 1000,  # a report that could not start by 08:30 is moot
        },
        # After downtime, fire times up to 6 h old still fire (late); older ones are
        # recorded as skipped.
        "catchup_window_ms": 6 * 3600 * 1000,
        "grace_ms": 60_000,
        **({"start_at": start_at} if start_at else {}),
    }


def publish(args: argparse.Namespace) -> int:
    url = os.environ.get("ORBIT_URL", "http://127.0.0.1:8080")
    ns = os.environ.get("ORBIT_NAMESPACE", "default")
    r = httpx.put(
        f"{url}/v1/namespaces/{ns}/schedules/{args.name}",
        json=schedule_body(args.cron, args.timezone, args.start_at),
        headers={"Authorization": f"Bearer {os.environ['ORBIT_KEY']}"},
        timeout=30,
    )
    if r.status_code >= 400:
        print(f"publish failed: {r.status_code} {r.text}", file=sys.stderr)
        return 1
    s = r.json()
    print(json.dumps({k: s[k] for k in ("name", "version", "next_fire_at", "next_fire_at_local")}))
    return 0


def build_worker(out: str, client: OrbitClient) -> Worker:
    worker = Worker(max_concurrency=2)  # ORBIT_URL / ORBIT_KEY / ORBIT_NAMESPACE

    @worker.task(QUEUE, KIND)
    async def nightly_report(ctx: TaskContext, payload: dict[str, Any]) -> dict[str, Any]:
        task = await client.tasks.get(ctx.task_id)
        fire_at_local = (task.dedup_key or "").removeprefix("nightly-report:")
        night = fire_at_local[:10]  # the local date the report is for

        def write() -> str:
            line = {"night": night, "fire_at_local": fire_at_local, "task_id": ctx.task_id,
                    "report": payload["report"]}  # fmt: skip
            with open(out, "a", encoding="utf-8") as f:
                f.write(json.dumps(line) + "\n")
            return night

        await ctx.effect("write-report", write)
        return {"night": night}

    return worker


def run_worker(args: argparse.Namespace) -> int:
    async def run() -> Any:
        async with OrbitClient() as client:  # reads each task's dedup_key
            worker = build_worker(args.out, client)
            return await worker.run(until_idle=args.burst, idle_timeout=3.0)

    stats = asyncio.run(run())
    print(json.dumps({"succeeded": stats.succeeded, "failed": stats.failed}))
    return 0


def main() -> int:
    p = argparse.ArgumentParser(description="nightly report at 02:30 Europe/Berlin")
    sub = p.add_subparsers(dest="cmd", required=True)
    pub = sub.add_parser("publish", help="publish (a new version of) the schedule")
    pub.add_argument("--name", default=SCHEDULE)
    pub.add_argument("--cron", default="30 2 * * *")
    pub.add_argument("--timezone", default="Europe/Berlin")
    pub.add_argument("--start-at", help="RFC 3339: no fire time before it")
    pub.set_defaults(func=publish)
    work = sub.add_parser("worker", help="run the report handler")
    work.add_argument("--out", required=True, help="JSON-lines file of reports")
    work.add_argument("--burst", action="store_true", help="exit once idle for 3 s")
    work.set_defaults(func=run_worker)
    args = p.parse_args()
    return int(args.func(args))


if __name__ == "__main__":
    sys.exit(main())
