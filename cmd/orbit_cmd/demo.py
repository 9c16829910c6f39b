"""The README's first command (``scripts/demo``): a local server, workers, tasks, results —
then, when run from a terminal, a live platform to watch in the web console.

    python -m orbit_cmd.demo [--tasks 1000] [--workers 2] [--concurrency 32]
                             [--serve | --exit] [--port N] [--dsn DSN]

1. starts ``orbit-server --dev`` on a free port (a private MariaDB under ``.orbit/`` when
   nothing answers at the DSN; default database ``orbit_demo``), which migrates and
   bootstraps the ``demo`` application and prints its key;
2. creates the queue ``demo`` and a subscription to its results;
3. starts worker processes (``python -m orbit_cmd.demo worker``) using the SDK: a handler
   that squares a number, fails retryably once for some tasks and permanently for a few;
4. submits the tasks in batches over HTTP and follows the results as they arrive over the
   subscription's WebSocket, with a progress bar;
5. prints a summary (throughput, succeeded, failed, retried);
6. **serves** when stdin is a terminal (or with ``--serve``; ``--exit`` never serves): prints
   the console address (``/ui/``) and the demo key to sign in with, keeps the workers running
   and keeps every console view busy —

   * schedule ``demo-tick``: a task every 10 s (cron ``* * * * * */10``, seconds
     last, in Europe/Berlin);
   * workflow ``demo-order``: reserve → wait for the ``approved`` signal (with a timeout) →
     pack and invoice in parallel → choice on the amount (``vip`` thank-you above 100) →
     done; a new order every 8 s, approved by the demo 2 s later, except every fourth
     order, which times out and fails ``approval_timeout``;
   * a trickle of ``square`` tasks (some retried, a few failing for good);
   * one ``post`` task on queue ``demo-ledger`` whose worker stalls past its lease, so the
     task lands in NEEDS_REVIEW (effect uncertain) for the review inbox;

   until Ctrl-C / SIGTERM: the schedule is paused, the workers drain, the server stops (and
   with it the private database it started, if any). Exit code 0.

Only the public SDK (``orbit_sdk``) talks to the server (plus a ``/readyz`` probe).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import itertools
import json
import logging
import os
import shutil
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Awaitable, Callable
from datetime import UTC, datetime
from typing import Any

import httpx

QUEUE = "demo"
NAMESPACE = "default"
# What the serving phase adds (docs/ui.md "The demo").
CRON_QUEUE = "demo-cron"
FLOW_QUEUE = "demo-flow"
LEDGER_QUEUE = "demo-ledger"
SCHEDULE = "demo-tick"
SCHEDULE_CRON = "* * * * * */10"  # 6 fields: the sixth is seconds, so every 10 s
SCHEDULE_ZONE = "Europe/Berlin"
WORKFLOW = "demo-order"
SIGNAL = "approved"
ORDER_EVERY_S = 8.0
APPROVE_AFTER_S = 2.0
APPROVAL_TIMEOUT_MS = 15_000
TRICKLE_EVERY_S = 2.0
TRICKLE_BATCH = 3
LEDGER_LEASE_MS = 1_000
STALL_S = 4.0
AMOUNTS = (42.5, 180.0, 75.0, 120.0)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _port_is_free(port: int) -> bool:
    """Whether the server could listen on ``port`` now. SO_REUSEADDR as uvicorn binds: the
    closed connections of a previous run (TIME_WAIT, about a minute) do not hold the port."""
    with socket.socket() as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            s.bind(("127.0.0.1", port))
        except OSError:
            return False
        return True


def _say(msg: str) -> None:
    print(f"demo: {msg}", file=sys.stderr, flush=True)


class Processes:
    """The child processes (server, workers), each in its own session so a terminal's Ctrl-C
    reaches only the demo, which stops them in order: workers drain first, then the server."""

    def __init__(self) -> None:
        self.server: subprocess.Popen[bytes] | None = None
        self.workers: list[subprocess.Popen[bytes]] = []
        self.force = asyncio.Event()

    async def _stop(self, procs: list[subprocess.Popen[bytes]], grace_s: float) -> None:
        for p in procs:
            if p.poll() is None:
                with contextlib.suppress(ProcessLookupError):
                    p.send_signal(signal.SIGTERM)
        deadline = time.monotonic() + grace_s
        while any(p.poll() is None for p in procs):
            if self.force.is_set() or time.monotonic() > deadline:
                for p in procs:
                    if p.poll() is None:
                        with contextlib.suppress(ProcessLookupError):
                            p.kill()
                for p in procs:
                    with contextlib.suppress(subprocess.TimeoutExpired):
                        p.wait(timeout=5)
                return
            await asyncio.sleep(0.05)

    async def stop(self) -> None:
        await self._stop(self.workers, 20.0)
        if self.server is not None:
            await self._stop([self.server], 25.0)


async def _start_server(dsn: str, port: int, procs: Processes) -> dict[str, Any]:
    cmd = [
        # --rotate-key: the demo's own dev application gets a fresh key each run (a second
        # run on the same database would otherwise see the first run's key as null).
        sys.executable, "-m", "orbit_cmd.server", "--dev", "--rotate-key", "--dsn", dsn,
        "--port", str(port), "--plain-logs", "--log-level", "warning",
    ]  # fmt: skip
    proc = subprocess.Popen(  # noqa: ASYNC220
        cmd, stdout=subprocess.PIPE, stdin=subprocess.DEVNULL, start_new_session=True
    )
    procs.server = proc
    assert proc.stdout is not None
    loop = asyncio.get_running_loop()
    deadline = time.monotonic() + 180
    while time.monotonic() < deadline:
        line = await loop.run_in_executor(None, proc.stdout.readline)
        if not line:
            raise SystemExit(f"demo: orbit-server exited with {proc.wait()} before it was ready")
        text = line.decode().strip()
        if text.startswith("{") and '"key"' in text:
            return json.loads(text)  # type: ignore[no-any-return]
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


def order_workflow() -> Any:
    """The ``demo-order`` definition: task → wait_signal (timeout) → parallel → choice."""
    from orbit_sdk.workflow import Retry, T, Workflow, concat, input, output, when

    wf = Workflow(
        description="demo order: reserve, wait for approval, pack and invoice, route by amount",
        input_schema=T.object(order_id=T.string, amount=T.number),
    )
    wf.task("reserve", queue=FLOW_QUEUE, kind="reserve", retry_safe=True,
            payload={"order": input("order_id"), "amount": input("amount")},
            output_schema=T.object(reservation=T.string))  # fmt: skip
    wf.wait_signal("approval", signal=SIGNAL, correlation_key=input("order_id"),
                   timeout_ms=APPROVAL_TIMEOUT_MS, on_timeout="expired")  # fmt: skip
    fulfil = wf.parallel("fulfil")
    fulfil.branch("warehouse").task(
        "pack", queue=FLOW_QUEUE, kind="pack", retry_safe=True,
        payload={"reservation": output("reserve", "reservation")},
    )  # fmt: skip
    fulfil.branch("billing").task(
        "invoice", queue=FLOW_QUEUE, kind="invoice", retry_safe=True,
        payload={"order": input("order_id"), "amount": input("amount")},
        retry=Retry(max_attempts=3, backoff_initial_ms=200, backoff_max_ms=1000),
        output_schema=T.object(invoice=T.string),
    )  # fmt: skip
    wf.choice("route", [when(input("amount") > 100, "vip")], default="done")
    wf.task("vip", queue=FLOW_QUEUE, kind="thank", retry_safe=True,
            payload={"order": input("order_id")})  # fmt: skip
    wf.succeed("done", output={"order": input("order_id"),
                               "invoice": output("invoice", "invoice")})  # fmt: skip
    wf.fail("expired", error="approval_timeout",
            message=concat("order ", input("order_id"), " was not approved in time"))  # fmt: skip
    return wf


class Live:
    """The serving phase: schedule, workflow orders, a trickle of tasks, one review case."""

    def __init__(self, client: Any, run_id: str, first_n: int) -> None:
        self.client = client
        self.run_id = run_id
        self.numbers = itertools.count(first_n)
        self.order_numbers = itertools.count()
        self.started = datetime.now(UTC)
        self.counts = {"submitted": 0, "orders": 0, "signals": 0, "ticks": 0,
                       "orders_ok": 0, "orders_failed": 0}  # fmt: skip
        self.open_orders: dict[str, str] = {}  # instance id -> order id
        self.review_task: str | None = None
        self._pending: set[asyncio.Future[None]] = set()

    async def setup(self) -> None:
        from orbit_sdk import ScheduleTaskSpec

        c = self.client
        await c.schedules.put(
            SCHEDULE, queue=CRON_QUEUE, cron=SCHEDULE_CRON, timezone=SCHEDULE_ZONE,
            task=ScheduleTaskSpec(kind="tick", payload={"zone": SCHEDULE_ZONE}, retry_safe=True),
            catchup_window_ms=60_000, grace_ms=5_000,
        )  # fmt: skip
        await c.schedules.resume(SCHEDULE)  # a previous serve paused it when it stopped
        await c.workflows.publish(WORKFLOW, order_workflow())
        # Not retry_safe: its worker stalls past the 1 s lease, the attempt is lost, and
        # nobody can know whether the posting happened -> NEEDS_REVIEW, effect uncertain.
        task = await c.tasks.submit(
            LEDGER_QUEUE, "post", {"entry": f"ledger-{self.run_id}", "cents": 4200},
            dedup_key=f"ledger-{self.run_id}", retry_safe=False,
        )  # fmt: skip
        self.review_task = task.id

    async def orders(self) -> None:
        for i in self.order_numbers:  # kept across a restart of this loop (_supervise)
            order = f"o-{self.run_id}-{i + 1}"
            inst = await self.client.instances.start(
                WORKFLOW, {"order_id": order, "amount": AMOUNTS[i % len(AMOUNTS)]},
                business_key=order,
            )  # fmt: skip
            self.counts["orders"] += 1
            self.open_orders[inst.id] = order
            if i % 4 != 3:  # every fourth order is never approved: it times out
                asyncio.get_running_loop().call_later(
                    APPROVE_AFTER_S, lambda i=inst.id, o=order: self._spawn(self._approve(i, o))
                )
            await asyncio.sleep(ORDER_EVERY_S)

    async def _approve(self, instance_id: str, order: str) -> None:
        try:
            await self.client.instances.signal(
                instance_id, SIGNAL, {"by": "demo"}, signal_id=f"approve-{order}",
                correlation_key=order,
            )  # fmt: skip
        except Exception as exc:  # the order goes the timeout path instead
            _say(f"approving {order}: {type(exc).__name__}: {exc}")
            return
        self.counts["signals"] += 1

    def _spawn(self, coro: Awaitable[None]) -> None:
        task = asyncio.ensure_future(coro)
        self._pending.add(task)
        task.add_done_callback(self._pending.discard)

    async def trickle(self) -> None:
        from orbit_sdk import TaskSpec

        while True:
            specs = [TaskSpec(queue=QUEUE, kind="square", payload={"n": n},
                              dedup_key=f"run-{self.run_id}-{n}", retry_safe=True)
                     for n in itertools.islice(self.numbers, TRICKLE_BATCH)]  # fmt: skip
            await self.client.tasks.submit_batch(specs)
            self.counts["submitted"] += len(specs)
            await asyncio.sleep(TRICKLE_EVERY_S)

    async def watch(self) -> None:
        """Follow what the demo started (for the status line): orders ending, ticks firing."""
        while True:
            for inst_id in list(self.open_orders)[:20]:
                inst = await self.client.instances.get(inst_id)
                if inst.is_terminal:
                    del self.open_orders[inst_id]
                    key = "orders_ok" if inst.state == "SUCCEEDED" else "orders_failed"
                    self.counts[key] += 1
            page = await self.client.schedules.occurrences(SCHEDULE, outcome="created", limit=100)
            self.counts["ticks"] = sum(
                1 for o in page.items
                if o.fire_at is not None and o.fire_at.replace(tzinfo=UTC) >= self.started
            )  # fmt: skip
            await asyncio.sleep(2.0)

    def status(self, results: dict[str, int]) -> str:
        """One terminal line (cut to the terminal's width), rewritten in place."""
        c = self.counts
        ticks = f"{c['ticks']}+" if c["ticks"] >= 100 else str(c["ticks"])  # one page counted
        text = (f"tasks {results['ok']} ok/{results['failed']} failed · ticks {ticks} · "
                f"orders {c['orders_ok']} ok/{c['orders_failed']} failed/"
                f"{len(self.open_orders)} running · Ctrl-C stops")  # fmt: skip
        width = shutil.get_terminal_size((80, 24)).columns - 1
        return "\r" + text[:width] + "\x1b[K"

    async def stop(self) -> None:
        for t in list(self._pending):
            t.cancel()
        with contextlib.suppress(Exception):
            await asyncio.wait_for(self.client.schedules.pause(SCHEDULE), 5)


async def _supervise(name: str, fn: Callable[[], Awaitable[None]]) -> None:
    """Run one activity of the serving phase; a failed call is reported, then retried."""
    while True:
        try:
            await fn()
            return
        except asyncio.CancelledError:
            raise
        except Exception as exc:  # the server is restarting, a timeout...: keep serving
            _say(f"{name}: {type(exc).__name__}: {exc} (retrying in 5 s)")
            await asyncio.sleep(5)


async def _demo(args: argparse.Namespace, serving: bool, procs: Processes,
                stop: asyncio.Event, phase: list[str]) -> int:  # fmt: skip
    from orbit_sdk import OrbitClient, RetryPolicy, TaskSpec
    from orbit_sdk.subscriber import Subscriber

    port = args.port or (8080 if serving and _port_is_free(8080) else _free_port())
    url = f"http://127.0.0.1:{port}"
    _say(f"starting orbit-server --dev on {url} (database {args.dsn})")
    boot = await _start_server(args.dsn, port, procs)
    await _wait_ready(url)
    key = boot["key"]
    _say(f"application {boot['application_id']} namespace {boot['namespace']!r} ready")
    run_id = f"{os.getpid()}-{int(time.time())}"
    async with OrbitClient(url, key, namespace=NAMESPACE) as client:
        await client.queues.put(QUEUE, retry=RetryPolicy(
            max_attempts=3, backoff_initial_ms=50, backoff_max_ms=500, backoff_multiplier=2))
        if serving:
            await client.queues.put(CRON_QUEUE)
            await client.queues.put(FLOW_QUEUE, retry=RetryPolicy(
                max_attempts=3, backoff_initial_ms=200, backoff_max_ms=1000, backoff_multiplier=2))
            await client.queues.put(LEDGER_QUEUE, lease_ms=LEDGER_LEASE_MS)
        sub_name = f"demo-results-{os.getpid()}"
        await client.subscriptions.put(
            sub_name, filter={"queues": [QUEUE]}, start="latest", ack_timeout_ms=30000,
            max_deliveries=5, max_in_flight=500,
        )  # fmt: skip
        roles = ["serve" if serving else "batch"] * args.workers + (["stall"] if serving else [])
        for i, role in enumerate(roles):
            procs.workers.append(subprocess.Popen(  # noqa: ASYNC220
                [sys.executable, "-m", "orbit_cmd.demo", "worker", "--url", url,
                 "--concurrency", str(args.concurrency), "--name", f"w{i}", "--role", role],
                env={**os.environ, "ORBIT_KEY": key}, stdin=subprocess.DEVNULL,
                start_new_session=True))  # fmt: skip
        _say(f"{args.workers} worker process(es) started; submitting {args.tasks} tasks")
        counts = {"ok": 0, "failed": 0, "retried": 0, "done": 0}
        live_counts = {"ok": 0, "failed": 0}
        seen: set[str] = set()
        t0 = time.monotonic()
        sub = Subscriber(url, key, NAMESPACE, sub_name)
        await sub.start()
        batch_done = asyncio.Event()

        async def consume() -> None:
            async for d in sub:
                ev = d.event
                if ev.queue == QUEUE and ev.task_id not in seen:
                    seen.add(ev.task_id)
                    if batch_done.is_set():
                        live_counts["ok" if ev.state == "SUCCEEDED" else "failed"] += 1
                    else:
                        counts["done"] += 1
                        counts["ok" if ev.state == "SUCCEEDED" else "failed"] += 1
                        counts["retried"] += 1 if ev.attempts > 1 else 0
                        if counts["done"] >= args.tasks:
                            batch_done.set()
                await d.ack()

        consumer = asyncio.create_task(consume())
        try:
            for start in range(0, args.tasks, 500):
                specs = [TaskSpec(queue=QUEUE, kind="square", payload={"n": n},
                                  dedup_key=f"run-{run_id}-{n}", retry_safe=True)
                         for n in range(start, min(args.tasks, start + 500))]  # fmt: skip
                await client.tasks.submit_batch(specs)
            done_wait = asyncio.create_task(batch_done.wait())
            while not done_wait.done() and not consumer.done():
                if sys.stderr.isatty():
                    print(_bar(counts["done"], args.tasks, counts["ok"], counts["failed"],
                               counts["retried"], t0), end="", file=sys.stderr, flush=True)
                await asyncio.wait({done_wait, consumer}, timeout=0.25)
                if time.monotonic() - t0 > args.timeout:
                    break
            done_wait.cancel()
            if consumer.done() and not consumer.cancelled() and consumer.exception():
                raise consumer.exception()  # type: ignore[misc]
            elapsed = time.monotonic() - t0
            print(_bar(counts["done"], args.tasks, counts["ok"], counts["failed"],
                       counts["retried"], t0), file=sys.stderr, flush=True)
            summary = {
                "tasks": args.tasks, "finished": counts["done"], "succeeded": counts["ok"],
                "failed": counts["failed"], "retried": counts["retried"],
                "seconds": round(elapsed, 2), "tasks_per_s": round(counts["done"] / elapsed, 1),
            }  # fmt: skip
            print(json.dumps(summary), flush=True)
            _say(f"{counts['done']} of {args.tasks} tasks finished in {elapsed:.1f} s "
                 f"({summary['tasks_per_s']} tasks/s): {counts['ok']} succeeded, "
                 f"{counts['failed']} failed permanently (by design), {counts['retried']} retried")
            code = 0 if counts["done"] == args.tasks else 1
            if not serving:
                return code
            phase[0] = "serve"
            batch_done.set()
            await _serve(client, url, key, run_id, args.tasks, sub_name, live_counts, stop)
            return code
        finally:
            consumer.cancel()
            await asyncio.gather(consumer, return_exceptions=True)
            await sub.aclose()


async def _serve(client: Any, url: str, key: str, run_id: str, first_n: int, sub_name: str,
                 results: dict[str, int], stop: asyncio.Event) -> None:  # fmt: skip
    live = Live(client, run_id, first_n)
    await live.setup()
    console = f"{url}/ui/"
    print(file=sys.stderr)
    _say(f"the web console is serving at {console}")
    _say(f"  sign in with the demo key (application 'demo', namespace {NAMESPACE!r}; a dev-only")
    _say("  key of this demo's own database — never use it anywhere else):")
    _say(f"    {key}")
    _say(f"  watch: Queues; Schedules › {SCHEDULE} (every 10 s, {SCHEDULE_ZONE}); Workflows ›")
    _say(f"  {WORKFLOW} (a new order every {ORDER_EVERY_S:.0f} s); the Review inbox (a task whose")
    _say(f"  worker stalled); Subscriptions › {sub_name}; Activity.")
    _say("  Ctrl-C stops everything.")
    if not sys.stdout.isatty():  # for scripts and tests: where to connect, with what
        print(json.dumps({"serving": console, "url": url, "namespace": NAMESPACE, "key": key,
                          "schedule": SCHEDULE, "workflow": WORKFLOW,
                          "review_task": live.review_task, "subscription": sub_name}),
              flush=True)  # fmt: skip
    activities = [
        asyncio.create_task(_supervise("orders", live.orders)),
        asyncio.create_task(_supervise("tasks", live.trickle)),
        asyncio.create_task(_supervise("watch", live.watch)),
    ]
    try:
        while not stop.is_set():
            if sys.stderr.isatty():
                print(live.status(results), end="", file=sys.stderr, flush=True)
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(stop.wait(), 1.0)
    finally:
        for a in activities:
            a.cancel()
        await asyncio.gather(*activities, return_exceptions=True)
        await live.stop()


def _wants_serve(args: argparse.Namespace) -> bool:
    if args.exit:
        return False
    if args.serve:
        return True
    try:
        return os.isatty(sys.stdin.fileno())
    except (AttributeError, OSError, ValueError):
        return False


async def run_demo(args: argparse.Namespace) -> int:
    serving = _wants_serve(args)
    procs = Processes()
    stop = asyncio.Event()
    phase = ["batch"]
    loop = asyncio.get_running_loop()

    def on_signal() -> None:
        if stop.is_set():
            _say("stopping now")
            procs.force.set()
            return
        if sys.stderr.isatty():
            print(file=sys.stderr)
        _say("stopping: pausing the schedule, draining the workers, stopping the server "
             "(Ctrl-C again to stop at once)")
        stop.set()

    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, on_signal)
    body = asyncio.create_task(_demo(args, serving, procs, stop, phase))
    stopper = asyncio.create_task(stop.wait())
    code = 130
    try:
        await asyncio.wait({body, stopper}, return_when=asyncio.FIRST_COMPLETED)
        if not body.done() and phase[0] == "batch":
            body.cancel()  # interrupted before the summary: nothing to finish gracefully
        try:
            code = await body
        except asyncio.CancelledError:
            code = 130
    finally:
        stopper.cancel()
        await procs.stop()
        for sig in (signal.SIGINT, signal.SIGTERM):
            loop.remove_signal_handler(sig)
    if serving and stop.is_set() and phase[0] == "serve":
        _say("stopped: workers drained, server stopped")
    return code


async def run_worker(args: argparse.Namespace) -> int:
    import random

    from orbit_sdk import PermanentError, RetryableError, TaskContext, Worker

    worker = Worker(args.url, os.environ["ORBIT_KEY"], namespace=NAMESPACE,
                    max_concurrency=args.concurrency if args.role != "stall" else 1)  # fmt: skip

    if args.role in ("batch", "serve"):

        @worker.task(QUEUE, "square")
        async def square(ctx: TaskContext, payload: dict[str, int]) -> dict[str, int]:
            n = payload["n"]
            await asyncio.sleep(random.uniform(0, 0.005))
            if n % 97 == 13:
                raise PermanentError(f"{n} is unlucky")
            if n % 10 == 3 and ctx.generation == 1:
                raise RetryableError("flaky downstream, try again")
            return {"n": n, "square": n * n}

    if args.role == "serve":

        @worker.task(CRON_QUEUE, "tick")
        async def tick(ctx: TaskContext, payload: dict[str, str]) -> dict[str, str]:
            return {"ran_at": datetime.now(UTC).isoformat(timespec="milliseconds"),
                    "zone": payload.get("zone", "UTC")}  # fmt: skip

        @worker.task(FLOW_QUEUE, "reserve")
        async def reserve(ctx: TaskContext, payload: dict[str, Any]) -> dict[str, str]:
            await asyncio.sleep(random.uniform(0.05, 0.3))
            return {"reservation": f"res-{payload['order']}"}

        @worker.task(FLOW_QUEUE, "pack")
        async def pack(ctx: TaskContext, payload: dict[str, Any]) -> dict[str, str]:
            await asyncio.sleep(random.uniform(0.2, 1.0))
            return {"parcel": f"parcel-{payload['reservation']}"}

        @worker.task(FLOW_QUEUE, "invoice")
        async def invoice(ctx: TaskContext, payload: dict[str, Any]) -> dict[str, str]:
            if ctx.generation == 1 and payload["amount"] > 100:
                raise RetryableError("billing service busy, try again")
            return {"invoice": f"inv-{payload['order']}"}

        @worker.task(FLOW_QUEUE, "thank")
        async def thank(ctx: TaskContext, payload: dict[str, Any]) -> dict[str, bool]:
            return {"sent": True}

    if args.role == "stall":
        # The stale report after the lease was lost is expected here: keep it quiet.
        logging.getLogger("orbit_sdk").setLevel(logging.ERROR)

        @worker.task(LEDGER_QUEUE, "post")
        async def post(ctx: TaskContext, payload: dict[str, Any]) -> dict[str, Any]:
            if ctx.generation == 1:
                # A stalled process (a long GC pause, a blocking call): no heartbeat goes out
                # for longer than the queue's 1 s lease, so the attempt is lost.
                time.sleep(STALL_S)  # noqa: ASYNC251 - blocking on purpose
            return {"posted": payload["entry"]}

    await worker.run()
    return 0


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="orbit-demo", description=__doc__.split("\n")[0])
    sub = p.add_subparsers(dest="cmd")
    w = sub.add_parser("worker", help="run one demo worker process")
    w.add_argument("--url", required=True)
    w.add_argument("--concurrency", type=int, default=32)
    w.add_argument("--name", default="w")
    w.add_argument("--role", choices=("batch", "serve", "stall"), default="batch")
    p.add_argument("--tasks", type=int, default=1000)
    p.add_argument("--workers", type=int, default=2)
    p.add_argument("--concurrency", type=int, default=32)
    p.add_argument("--port", type=int, default=0,
                   help="server port (default: 8080 when serving and free, else any free port)")
    p.add_argument("--timeout", type=float, default=600.0,
                   help="give up waiting for the batch after this many seconds")
    p.add_argument("--dsn", default=os.environ.get("ORBIT_DSN", "mysql://root@127.0.0.1:3306/orbit_demo"))
    mode = p.add_mutually_exclusive_group()
    mode.add_argument("--serve", action="store_true",
                      help="after the summary keep serving the console until Ctrl-C "
                           "(the default when stdin is a terminal)")
    mode.add_argument("--exit", action="store_true", help="exit after the summary")
    return p.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    if args.cmd == "worker":
        return asyncio.run(run_worker(args))
    return asyncio.run(run_demo(args))


if __name__ == "__main__":
    sys.exit(main())
