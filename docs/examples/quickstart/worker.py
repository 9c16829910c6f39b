"""The quick start's worker (docs/quickstart.md, step 4): runs the ``greet`` tasks of queue
``hello`` and logs what it does.

    python docs/examples/quickstart/worker.py               # serves until Ctrl-C (drains first)
    python docs/examples/quickstart/worker.py --until-idle  # stops once nothing is left to run

``ORBIT_URL``, ``ORBIT_KEY`` and ``ORBIT_NAMESPACE`` (default ``default``) come from the
environment.
"""

from __future__ import annotations

import logging
import os
import sys
from typing import Any

from orbit_sdk import TaskContext, Worker

# The SDK logs through the standard logging module (session opened, attempts finished,
# reconnects, the final stats): show INFO and above on stderr.
logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")

worker = Worker(namespace=os.environ.get("ORBIT_NAMESPACE", "default"))


@worker.task("hello", "greet")
async def greet(ctx: TaskContext, payload: dict[str, Any]) -> dict[str, str]:
    ctx.logger.info("greeting %s (attempt %d)", payload["name"], ctx.generation)
    return {"greeting": f"Hello, {payload['name']}!"}


if __name__ == "__main__":
    worker.run_sync(until_idle="--until-idle" in sys.argv[1:])
