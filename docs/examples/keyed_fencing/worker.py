"""One worker of the fleet: appends each task's entry to its account's document in the
outside store (store.py), fenced so that a paused, superseded attempt cannot overwrite it.

Tasks: queue ``ledger``, kind ``post_entry``, ``concurrency_key`` = the account, submitted
``retry_safe`` (a retry is safe: the fence stops the old attempt, the entry id stops a
duplicate). Payload ``{"account": "acct-1", "entry": {...}, "hold_ms": 0}``; ``hold_ms``
is slow work between read and write on the *first* attempt (to open a window in which a
test pauses the worker).

    export ORBIT_URL=... ORBIT_KEY=... ORBIT_NAMESPACE=default
    python docs/examples/keyed_fencing/worker.py --store mysql://root@127.0.0.1/fencing_demo

Run several of them: that is the fleet.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import logging
import sys
import time
from typing import Any

from orbit_sdk import PermanentError, RetryableError, TaskContext, Worker
from store import Fence, Store  # docs/examples/keyed_fencing/store.py (run from this folder)


def build(store: Store, *, max_concurrency: int = 4) -> Worker:
    # concurrency_keys=True: this worker takes keyed tasks (and gets their tokens).
    worker = Worker(concurrency_keys=True, max_concurrency=max_concurrency)

    @worker.task("ledger", "post_entry")
    async def post_entry(ctx: TaskContext, payload: dict[str, Any]) -> dict[str, Any]:
        account = payload["account"]
        # The fence: the key's concurrency token (one running attempt per key; every grant
        # gets the next token). Without keyed permits it is None and the attempt generation
        # fences per task instead.
        fence = Fence(ctx.task_id, ctx.generation, ctx.concurrency_token)
        doc, version = await asyncio.to_thread(store.read, account)
        if any(e["task_id"] == ctx.task_id for e in doc["entries"]):
            return {"account": account, "version": version, "already": True}
        entry = {"task_id": ctx.task_id, "generation": ctx.generation, **payload["entry"]}
        new = {"entries": [*doc["entries"], entry]}
        hold_s = payload.get("hold_ms", 0) / 1000 if ctx.generation == 1 else 0.0

        def work_then_put() -> str:
            # Slow work between read and write, then the write, in one blocking call: a
            # process paused in the middle still writes when it wakes up, as a real one would.
            if hold_s:
                print(f"holding {ctx.task_id} generation {ctx.generation}", flush=True)
                time.sleep(hold_s)
            return store.put(account, new, version, fence)

        outcome = await asyncio.to_thread(work_then_put)
        if outcome == "conflict":  # another task of the account wrote first: read again
            raise RetryableError("document changed since read", retry_after_ms=50)
        if outcome == "stale":
            print(f"fenced {ctx.task_id} generation {ctx.generation}", flush=True)
            raise PermanentError("fenced: a newer attempt holds this account")
        return {"account": account, "version": version + 1}

    return worker


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("--store", required=True, help="mysql://... database of the outside store")
    p.add_argument("--max-concurrency", type=int, default=4)
    p.add_argument("--burst", action="store_true", help="exit once idle for 2 s")
    args = p.parse_args()
    logging.basicConfig(level=logging.WARNING, stream=sys.stderr)
    store = Store(args.store)
    store.create_schema()
    print("ready", flush=True)
    worker = build(store, max_concurrency=args.max_concurrency)
    stats = worker.run_sync(until_idle=args.burst, idle_timeout=2.0)
    print(json.dumps({"succeeded": stats.succeeded, "failed": stats.failed}), flush=True)


if __name__ == "__main__":
    main()
