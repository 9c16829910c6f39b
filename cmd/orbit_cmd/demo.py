"""The README's first command (``scripts/demo``): a local server, a worker, tasks, results.

    python -m orbit_cmd.demo [--tasks 1000] [--workers 2] [--concurrency 32]

1. starts ``orbit-server --dev`` on a free port (a private MariaDB under ``.orbit/`` when
   nothing answers at the DSN; default database ``orbit_demo``), which migrates and
   bootstraps the ``demo`` application and prints its key;
2. creates the queue ``demo`` and a subscription to its results;
3. starts worker processes (``python -m orbit_cmd.demo worker``) using the SDK: a handler
   that squares a number, fails retryably once for some tasks and permanently for a few;
4. submits the tasks in batches over HTTP and follows the results as they arrive over the
   subscription's WebSocket, with a progress bar;
5. prints a summary (throughput, succeeded, failed, retried) and stops everything.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import signal
import socket
import subprocess
import sys
import time
from typing import Any

import httpx

QUEUE = "demo"
NAMESPACE = "default"


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _say(msg: str) -> None:
    print(f"demo: {msg}", file=sys.stderr, flush=True)


async def _start_server(dsn: str, port: int) -> tuple[subprocess.Popen[bytes], dict[str, Any]]:
    cmd = [
        sys.executable, "-m", "orbit_cmd.server", "--dev", "--dsn", dsn,
        "--port", str(port), "--plain-logs", "--log-level", "warning",
    ]
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, start_new_session=True)  # noqa: ASYNC220
    assert proc.stdout is not None
    loop = asyncio.get_running_loop()
    deadline = time.monotonic() + 180
    while time.monotonic() < deadline:
        line = await loop.run_in_executor(None, proc.stdout.readline)
        if not line:
            raise SystemExit(f"demo: orbit-server exited with {proc.wait()} before it was ready")
        text = line.decode().strip()
        if text.startswith("{") and '"key"' in text:
            return proc, json.loads(text)
    proc.kill()
    raise SystemExit("demo: orbit-server did not print its key in time")


async def _wait_ready(url: str) -> None:
    async with httpx.AsyncClient(timeout=2) as http:
        for _ in range(300):
            with contextlib.suppress(httpx.HTTPError):
                if (await http.get(f"{url}/readyz")).status_code == 200:
                    return
            await asyncio.sleep(0.1)
    raise SystemExit("demo: server never became ready")


def _bar(done: int, total: int, ok: int, failed: int, retried: int, t0: float) -> str:
    width = 30
    filled = int(width * done / max(total, 1))
    rate = done / max(time.monotonic() - t0, 1e-6)
    return (f"\r[{'#' * filled}{'.' * (width - filled)}] {done}/{total}  succeeded {ok}  "
            f"failed {failed}  retried {retried}  {rate:7.1f} tasks/s")


async def run_demo(args: argparse.Namespace) -> int:
    from orbit_sdk import OrbitClient, RetryPolicy, TaskSpec
    from orbit_sdk.subscriber import Subscriber

    port = args.port or _free_port()
    url = f"http://127.0.0.1:{port}"
    _say(f"starting orbit-server --dev on {url} (database {args.dsn})")
    server, boot = await _start_server(args.dsn, port)
    workers: list[subprocess.Popen[bytes]] = []
    try:
        await _wait_ready(url)
        key = boot["key"]
        _say(f"application {boot['application_id']} namespace {boot['namespace']!r} ready")
        async with OrbitClient(url, key, namespace=NAMESPACE) as client:
            await client.queues.put(QUEUE, retry=RetryPolicy(
                max_attempts=3, backoff_initial_ms=50, backoff_max_ms=500, backoff_multiplier=2))
            sub_name = f"demo-results-{os.getpid()}"
            async with httpx.AsyncClient(base_url=url, headers={"Authorization": f"Bearer {key}"}) as http:
                r = await http.put(
                    f"/v1/namespaces/{NAMESPACE}/subscriptions/{sub_name}",
                    json={"filter": {"queues": [QUEUE]}, "start": "latest", "ack_timeout_ms": 30000,
                          "max_deliveries": 5, "max_in_flight": 500})
                r.raise_for_status()
            for i in range(args.workers):
                workers.append(subprocess.Popen(  # noqa: ASYNC220
                    [sys.executable, "-m", "orbit_cmd.demo", "worker", "--url", url,
                     "--concurrency", str(args.concurrency), "--name", f"w{i}"],
                    env={**os.environ, "ORBIT_KEY": key}, start_new_session=True))
            _say(f"{args.workers} worker process(es) started; submitting {args.tasks} tasks")
            counts = {"ok": 0, "failed": 0, "retried": 0, "done": 0}
            seen: set[str] = set()
            t0 = time.monotonic()
            sub = Subscriber(url, key, NAMESPACE, sub_name)
            await sub.start()

            async def consume() -> None:
                async for d in sub:
                    ev = d.event
                    if ev.task_id not in seen:
                        seen.add(ev.task_id)
                        counts["done"] += 1
                        counts["ok" if ev.state == "SUCCEEDED" else "failed"] += 1
                        counts["retried"] += 1 if ev.attempts > 1 else 0
                    await d.ack()
                    if counts["done"] >= args.tasks:
                        return

            consumer = asyncio.create_task(consume())
            for start in range(0, args.tasks, 500):
                specs = [TaskSpec(queue=QUEUE, kind="square", payload={"n": n},
                                  dedup_key=f"run-{os.getpid()}-{n}", retry_safe=True)
                         for n in range(start, min(args.tasks, start + 500))]
                await client.tasks.submit_batch(specs)
            while not consumer.done():
                if sys.stderr.isatty():
                    print(_bar(counts["done"], args.tasks, counts["ok"], counts["failed"],
                               counts["retried"], t0), end="", file=sys.stderr, flush=True)
                await asyncio.wait({consumer}, timeout=0.25)
                if time.monotonic() - t0 > args.timeout:
                    consumer.cancel()
                    break
            elapsed = time.monotonic() - t0
            print(_bar(counts["done"], args.tasks, counts["ok"], counts["failed"],
                       counts["retried"], t0), file=sys.stderr, flush=True)
            await sub.aclose()
        summary = {
            "tasks": args.tasks, "finished": counts["done"], "succeeded": counts["ok"],
            "failed": counts["failed"], "retried": counts["retried"],
            "seconds": round(elapsed, 2), "tasks_per_s": round(counts["done"] / elapsed, 1),
        }
        print(json.dumps(summary))
        _say(f"{counts['done']} of {args.tasks} tasks finished in {elapsed:.1f} s "
             f"({summary['tasks_per_s']} tasks/s): {counts['ok']} succeeded, "
             f"{counts['failed']} failed permanently (by design), {counts['retried']} retried")
        return 0 if counts["done"] == args.tasks else 1
    finally:
        for w in workers:
            with contextlib.suppress(ProcessLookupError):
                w.send_signal(signal.SIGTERM)
        for w in workers:
            try:
                w.wait(timeout=15)
            except subprocess.TimeoutExpired:
                w.kill()
        server.send_signal(signal.SIGTERM)
        try:
            server.wait(timeout=20)
        except subprocess.TimeoutExpired:
            server.kill()


async def run_worker(args: argparse.Namespace) -> int:
    import random

    from orbit_sdk import PermanentError, RetryableError, TaskContext, Worker

    worker = Worker(args.url, os.environ["ORBIT_KEY"], namespace=NAMESPACE,
                    max_concurrency=args.concurrency)

    @worker.task(QUEUE, "square")
    async def square(ctx: TaskContext, payload: dict[str, int]) -> dict[str, int]:
        n = payload["n"]
        await asyncio.sleep(random.uniform(0, 0.005))
        if n % 97 == 13:
            raise PermanentError(f"{n} is unlucky")
        if n % 10 == 3 and ctx.generation == 1:
            raise RetryableError("flaky downstream, try again")
        return {"n": n, "square": n * n}

    await worker.run()
    return 0


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="orbit-demo", description=__doc__.split("\n")[0])
    sub = p.add_subparsers(dest="cmd")
    w = sub.add_parser("worker", help="run one demo worker process")
    w.add_argument("--url", required=True)
    w.add_argument("--concurrency", type=int, default=32)
    w.add_argument("--name", default="w")
    p.add_argument("--tasks", type=int, default=1000)
    p.add_argument("--workers", type=int, default=2)
    p.add_argument("--concurrency", type=int, default=32)
    p.add_argument("--port", type=int, default=0)
    p.add_argument("--timeout", type=float, default=600.0, help="give up after this many seconds")
    p.add_argument("--dsn", default=os.environ.get("ORBIT_DSN", "mysql://root@127.0.0.1:3306/orbit_demo"))
    args = p.parse_args(argv)
    if args.cmd == "worker":
        return asyncio.run(run_worker(args))
    return asyncio.run(run_demo(args))


if __name__ == "__main__":
    sys.exit(main())
