"""The worker behind the web service: sends each welcome once.

The "mailer" is a JSON-lines file (``--outbox``). Sending is wrapped in ``ctx.effect``: if
an attempt sends and then dies before reporting, the retry finds the effect committed and
does not send again (and if it died *between* sending and committing, the retry gets
``EffectUncertain`` and the task goes to review instead of guessing).

    python docs/examples/web_service/worker.py --outbox /tmp/outbox.jsonl [--burst]
"""

from __future__ import annotations

import argparse
import json
import os
from typing import Any

from orbit_sdk import TaskContext, Worker


def build(outbox: str, queue: str = "emails") -> Worker:
    worker = Worker(concurrency_keys=False, max_concurrency=8)  # ORBIT_URL/KEY/NAMESPACE

    @worker.task(queue, "send_welcome")
    async def send_welcome(ctx: TaskContext, payload: dict[str, Any]) -> dict[str, Any]:
        def send() -> str:
            line = {"to": payload["email"], "subject": f"Welcome, {payload['name'] or 'friend'}!",
                    "task_id": ctx.task_id}  # fmt: skip
            with open(outbox, "a", encoding="utf-8") as f:
                f.write(json.dumps(line) + "\n")
                f.flush()
                os.fsync(f.fileno())
            return f"msg-{ctx.task_id[:8]}"

        message_id = await ctx.effect("send", send)
        return {"message_id": message_id}

    return worker


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("--outbox", required=True, help="JSON-lines file standing in for a mailer")
    p.add_argument("--queue", default=os.environ.get("SIGNUP_QUEUE", "emails"))
    p.add_argument("--burst", action="store_true", help="exit once idle for 2 s")
    args = p.parse_args()
    stats = build(args.outbox, args.queue).run_sync(until_idle=args.burst, idle_timeout=2.0)
    print(json.dumps({"succeeded": stats.succeeded, "failed": stats.failed}))


if __name__ == "__main__":
    main()
