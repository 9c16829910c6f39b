"""The quick start's producer (docs/quickstart.md, step 5): submits one ``greet`` task with a
``dedup_key`` and waits for its result.

    python docs/examples/quickstart/producer.py [NAME]      # default name: Grace

Run it while the worker runs. Run it twice: the second submit finds the task by its
``dedup_key`` (``deduplicated`` is true) instead of queueing the same work again.
``ORBIT_URL``, ``ORBIT_KEY`` and ``ORBIT_NAMESPACE`` (default ``default``) come from the
environment.
"""

from __future__ import annotations

import asyncio
import os
import sys

from orbit_sdk import OrbitClient


async def main(name: str) -> None:
    async with OrbitClient(namespace=os.environ.get("ORBIT_NAMESPACE", "default")) as orbit:
        task = await orbit.tasks.submit(
            "hello", "greet", {"name": name}, dedup_key=f"greet-{name.lower()}"
        )
        print(task.id, task.state, "deduplicated" if task.deduplicated else "new")
        done = await orbit.tasks.wait(task.id, timeout=60)
        print(done.state, done.decode_result())  # SUCCEEDED {'greeting': 'Hello, Grace!'}


if __name__ == "__main__":
    asyncio.run(main(sys.argv[1] if len(sys.argv) > 1 else "Grace"))
