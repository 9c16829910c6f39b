"""A bench worker process: ``python -m bench.worker '<json args>'``.

Runs ``sessions`` SDK :class:`~orbit_sdk.Worker` objects (one worker session each) on one
queue, each with ``max_concurrency = concurrency``, and a no-op handler for kind ``noop``.
With ``targets`` (a list of ``{"key", "namespace"}``, S5's owners) it runs one worker
session per entry instead, each in its entry's namespace with its entry's key.
The handler returns ``{"t0": <payload t0>, "t1": <wall clock at handler start>}`` when the
payload carries ``t0`` (S2 measures submit → handler start with it), else ``null``.
With ``stagger_s`` the sessions start that many seconds apart. SIGTERM drains every worker
and exits.
"""

from __future__ import annotations

import asyncio
import json
import logging
import os
import signal
import sys
import time
from typing import Any


async def main(args: dict[str, Any]) -> None:
    from orbit_sdk import TaskContext, Worker

    logging.basicConfig(level=logging.WARNING)
    workers = []
    targets = args.get("targets") or [{"key": args["key"], "namespace": args["namespace"]}] * int(
        args["sessions"]
    )
    for target in targets:
        w = Worker(
            args["url"],
            target["key"],
            namespace=target["namespace"],
            max_concurrency=int(args["concurrency"]),
            drain_timeout=5.0,
            report_timeout=5.0,
        )

        async def noop(ctx: TaskContext, payload: Any) -> Any:
            if isinstance(payload, dict) and "t0" in payload:
                return {"t0": payload["t0"], "t1": time.time()}
            return None

        w.register(args["queue"], "noop", noop)
        workers.append(w)
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, lambda: [w.drain() for w in workers])
    stagger = float(args.get("stagger_s") or 0)

    async def run(i: int, w: Any) -> None:
        if stagger:  # many sessions: connect a few at a time, not all in one burst
            await asyncio.sleep(i * stagger)
        await w.run(install_signal_handlers=False)

    await asyncio.gather(*(run(i, w) for i, w in enumerate(workers)))


if __name__ == "__main__":
    arguments = json.loads(sys.argv[1])
    if os.environ.get("ORBIT_UVLOOP", "1") != "0":
        try:
            import uvloop

            uvloop.run(main(arguments))
            sys.exit(0)
        except ImportError:
            pass
    asyncio.run(main(arguments))
