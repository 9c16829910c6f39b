"""Inbox: a receiving service that turns Orbit's at-least-once deliveries into exactly-once
effects.

It consumes a subscription with ``orbit_sdk.Subscriber`` and, for each delivery, commits in
ONE transaction of its own database:

1. ``inbox_events`` — the event id, unique. A redelivered event hits the primary key and
   the transaction stops there: nothing else is applied twice.
2. ``inbox_task_view`` — the latest known state of each task. It only moves forward by the
   event's sequence number (``seq``: per-namespace, increasing), so a stale event that
   arrives late (redelivered after a newer one) never overwrites newer state.
3. ``inbox_balances`` — a deliberately NOT idempotent effect: each event adds its
   ``result.amount`` to the owner's balance. If an event were applied twice the sum would
   show it; the inbox row in the same transaction is what makes it exactly-once.

Only after COMMIT does it ack. A crash between commit and ack means a redelivery, which the
inbox recognises; a crash before commit means nothing was applied and the redelivery
applies it. Either way the effect happens exactly once.

Run (Orbit server at ORBIT_URL, a key with subscriptions.consume/manage)::

    python docs/examples/inbox/inbox.py --url $ORBIT_URL --key $ORBIT_KEY \\
        --namespace default --subscription inbox --create-subscription \\
        --dsn mysql://root@127.0.0.1:3306/inbox_demo

Chaos switches show the guarantees: ``--drop-ack 0.3`` skips 30% of acks (redelivered
after the lease), ``--crash-after-commit 0.1`` kills the process between commit and ack.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import logging
import os
import random
import sys
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import unquote, urlsplit

import aiomysql
import httpx
import pymysql
from orbit_sdk import Delivery, Subscriber

log = logging.getLogger("inbox")
DUPLICATE_KEY = 1062

SCHEMA = (
    """CREATE TABLE IF NOT EXISTS inbox_events (
      event_id CHAR(32) NOT NULL COMMENT 'Orbit result event id: the de-duplication key',
      seq BIGINT UNSIGNED NOT NULL COMMENT 'Sequence number of the event in its namespace',
      task_id CHAR(32) NOT NULL COMMENT 'Task the event is about',
      received_at DATETIME(6) NOT NULL COMMENT 'When it was applied (UTC)',
      PRIMARY KEY (event_id)
    ) ENGINE=InnoDB COMMENT='Events already applied (inbox de-duplication)'""",
    """CREATE TABLE IF NOT EXISTS inbox_task_view (
      task_id CHAR(32) NOT NULL COMMENT 'Task id',
      seq BIGINT UNSIGNED NOT NULL COMMENT 'Sequence number of the event the view reflects',
      state VARCHAR(16) NOT NULL COMMENT 'Task state in that event',
      result MEDIUMTEXT NULL COMMENT 'Result JSON in that event',
      PRIMARY KEY (task_id)
    ) ENGINE=InnoDB COMMENT='Latest task state; moves forward by seq only'""",
    """CREATE TABLE IF NOT EXISTS inbox_balances (
      owner_id CHAR(32) NOT NULL COMMENT 'Task owner',
      balance BIGINT NOT NULL COMMENT 'Sum of result.amount over applied events',
      events BIGINT NOT NULL COMMENT 'Number of applied events',
      PRIMARY KEY (owner_id)
    ) ENGINE=InnoDB COMMENT='A non-idempotent effect: exactly-once only thanks to the inbox'""",
)

# The view moves forward only: every assignment compares with the stored seq, and seq itself
# is assigned LAST (MySQL evaluates SET assignments left to right).
UPSERT_VIEW = """
INSERT INTO inbox_task_view (task_id, seq, state, result) VALUES (%s, %s, %s, %s)
ON DUPLICATE KEY UPDATE
  state = IF(VALUES(seq) > seq, VALUES(state), state),
  result = IF(VALUES(seq) > seq, VALUES(result), result),
  seq = GREATEST(seq, VALUES(seq))
"""
ADD_BALANCE = """
INSERT INTO inbox_balances (owner_id, balance, events) VALUES (%s, %s, 1)
ON DUPLICATE KEY UPDATE balance = balance + VALUES(balance), events = events + 1
"""


def connect_kwargs(dsn: str) -> dict[str, Any]:
    """aiomysql arguments for ``mysql://user[:pass]@host[:port]/db``."""
    u = urlsplit(dsn)
    if u.scheme != "mysql" or not u.path.strip("/"):
        raise ValueError("expected mysql://user[:pass]@host[:port]/database")
    return {
        "host": u.hostname or "127.0.0.1",
        "port": u.port or 3306,
        "user": unquote(u.username or "root"),
        "password": unquote(u.password or ""),
        "db": u.path.strip("/"),
    }


@dataclass
class Inbox:
    """The receiving service's own tables and its one-transaction apply."""

    pool: aiomysql.Pool

    @classmethod
    async def open(cls, dsn: str) -> Inbox:
        pool = await aiomysql.create_pool(
            minsize=1, maxsize=4, autocommit=False, charset="utf8mb4", **connect_kwargs(dsn)
        )
        inbox = cls(pool)
        await inbox.setup()
        return inbox

    async def close(self) -> None:
        self.pool.close()
        await self.pool.wait_closed()

    async def setup(self) -> None:
        async with self.pool.acquire() as conn, conn.cursor() as cur:
            for stmt in SCHEMA:
                await cur.execute(stmt)
            await conn.commit()

    async def apply(self, event_id: str, event: dict[str, Any]) -> bool:
        """Apply one event exactly once. True: applied now; False: seen before (no-op)."""
        async with self.pool.acquire() as conn:
            try:
                async with conn.cursor() as cur:
                    try:
                        await cur.execute(
                            "INSERT INTO inbox_events (event_id, seq, task_id, received_at) "
                            "VALUES (%s, %s, %s, UTC_TIMESTAMP(6))",
                            (event_id, event["seq"], event["task_id"]),
                        )
                    except pymysql.err.IntegrityError as exc:
                        if exc.args[0] != DUPLICATE_KEY:
                            raise
                        await conn.rollback()  # a redelivery: the effect is already committed
                        return False
                    result = event.get("result")
                    await cur.execute(
                        UPSERT_VIEW,
                        (
                            event["task_id"],
                            event["seq"],
                            event["state"],
                            None if result is None else json.dumps(result),
                        ),
                    )
                    amount = result.get("amount", 0) if isinstance(result, dict) else 0
                    await cur.execute(ADD_BALANCE, (event["owner_id"], int(amount)))
                await conn.commit()
                return True
            except BaseException:
                with contextlib.suppress(Exception):
                    await conn.rollback()
                raise


@dataclass
class Chaos:
    """Failure injection for demos and tests (all probabilities 0 by default)."""

    drop_ack: float = 0.0  # skip the ack: redelivered when the lease ends or on reconnect
    crash_after_commit: float = 0.0  # os._exit between COMMIT and ack
    rng: random.Random = field(default_factory=random.Random)


async def handle(inbox: Inbox, delivery: Delivery, chaos: Chaos) -> bool:
    """Apply then ack (never the other way round)."""
    event = json.loads(delivery.raw_event)
    applied = await inbox.apply(delivery.event_id, event)
    if chaos.crash_after_commit and chaos.rng.random() < chaos.crash_after_commit:
        log.warning("chaos: crashing after commit, before ack (seq %d)", delivery.seq)
        os._exit(3)
    if chaos.drop_ack and chaos.rng.random() < chaos.drop_ack:
        return applied
    await delivery.ack()
    return applied


async def ensure_subscription(url: str, key: str, namespace: str, subscription: str) -> None:
    """Create the subscription from the start of the stream unless it exists."""
    async with httpx.AsyncClient(base_url=url, timeout=30) as http:
        r = await http.put(
            f"/v1/namespaces/{namespace}/subscriptions/{subscription}",
            json={"start": "earliest", "ack_timeout_ms": 5_000, "max_in_flight": 20},
            headers={"Authorization": f"Bearer {key}", "If-None-Match": "*"},
        )
        if r.status_code not in (200, 201, 412):
            r.raise_for_status()


async def run(
    url: str,
    key: str,
    namespace: str,
    subscription: str,
    dsn: str,
    *,
    idle_exit_s: float | None = None,
    chaos: Chaos | None = None,
) -> tuple[int, int]:
    """Consume until cancelled (or idle for ``idle_exit_s``); return (applied, duplicates)."""
    chaos = chaos or Chaos()
    inbox = await Inbox.open(dsn)
    applied = duplicates = 0
    try:
        async with Subscriber(url, key, namespace, subscription) as sub:
            it = aiter(sub)
            while True:
                try:
                    delivery = await asyncio.wait_for(anext(it), idle_exit_s)
                except TimeoutError:
                    break
                if await handle(inbox, delivery, chaos):
                    applied += 1
                else:
                    duplicates += 1
                    log.info("duplicate event %s (seq %d) skipped", delivery.event_id, delivery.seq)
    finally:
        await inbox.close()
    return applied, duplicates


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--url", default=os.environ.get("ORBIT_URL", "http://127.0.0.1:8080"))
    p.add_argument("--key", default=os.environ.get("ORBIT_KEY"))
    p.add_argument("--namespace", required=True)
    p.add_argument("--subscription", default="inbox")
    p.add_argument(
        "--dsn", default=os.environ.get("INBOX_DSN", "mysql://root@127.0.0.1:3306/inbox_demo")
    )
    p.add_argument("--create-subscription", action="store_true")
    p.add_argument(
        "--idle-exit-s", type=float, default=None, help="exit after this long without deliveries"
    )
    p.add_argument("--drop-ack", type=float, default=0.0)
    p.add_argument("--crash-after-commit", type=float, default=0.0)
    p.add_argument("--seed", type=int, default=None)
    args = p.parse_args(argv)
    if not args.key:
        p.error("--key or ORBIT_KEY is required")
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(message)s")
    chaos = Chaos(args.drop_ack, args.crash_after_commit, random.Random(args.seed))

    async def go() -> tuple[int, int]:
        if args.create_subscription:
            await ensure_subscription(args.url, args.key, args.namespace, args.subscription)
        return await run(
            args.url, args.key, args.namespace, args.subscription, args.dsn,
            idle_exit_s=args.idle_exit_s, chaos=chaos,
        )  # fmt: skip

    applied, duplicates = asyncio.run(go())
    print(json.dumps({"applied": applied, "duplicates": duplicates}), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
