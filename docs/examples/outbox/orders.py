"""Orders: a service that enqueues an Orbit task in the SAME transaction as its own write.

Placing an order inserts a row into the service's ``orders`` table and records the task
"send the order confirmation" in the ``orbit_outbox`` table of the same database, in one
transaction (``orbit_sdk.outbox.enqueue``). A committed order always gets its task; an order
whose transaction rolls back never does — whatever happens to Orbit, the network or this
process in between. A relay then submits the committed rows to Orbit, each with a key
derived from the row, so each becomes exactly one task even when the relay is killed
between submitting and marking a row::

    python docs/examples/outbox/orders.py setup --dsn mysql://root@127.0.0.1:3306/shop
    python docs/examples/outbox/orders.py place --dsn mysql://root@127.0.0.1:3306/shop \\
        --namespace default --queue emails --count 100 --rollback-every 5
    orbit outbox relay --dsn mysql://root@127.0.0.1:3306/shop --until-idle   # or:
    python docs/examples/outbox/orders.py relay --dsn mysql://root@127.0.0.1:3306/shop
    python docs/examples/outbox/orders.py check --dsn mysql://root@127.0.0.1:3306/shop

``relay`` runs the relay inside the process (``OutboxRelay.run``), as a service would next
to its request handlers; ``orbit outbox relay`` is the same relay as a separate process.
Both read ``ORBIT_URL`` and ``ORBIT_KEY``.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import logging
import os
import sys
from decimal import Decimal
from typing import Any
from urllib.parse import unquote, urlsplit

import pymysql
from orbit_sdk import OrbitClient
from orbit_sdk.outbox import DDL, OutboxRelay, enqueue

ORDERS = """CREATE TABLE IF NOT EXISTS orders (
  id BIGINT UNSIGNED NOT NULL AUTO_INCREMENT COMMENT 'order number',
  customer VARCHAR(100) NOT NULL COMMENT 'who ordered',
  amount DECIMAL(12, 2) NOT NULL COMMENT 'order total',
  created_at DATETIME(6) NOT NULL COMMENT 'when it was placed (UTC)',
  PRIMARY KEY (id)
) ENGINE=InnoDB DEFAULT CHARSET=utf8mb4 COMMENT='The service''s own data'"""


class Declined(Exception):
    """The business rule said no: the whole transaction rolls back."""


def connect(dsn: str) -> pymysql.connections.Connection:
    parts = urlsplit(dsn)
    return pymysql.connect(
        host=parts.hostname or "127.0.0.1", port=parts.port or 3306,
        user=unquote(parts.username or "root"), password=unquote(parts.password or ""),
        database=unquote(parts.path.strip("/")), charset="utf8mb4", autocommit=False,
    )  # fmt: skip


def setup(dsn: str) -> None:
    """The service's tables: its own ``orders`` and the outbox (the SDK's DDL)."""
    conn = connect(dsn)
    try:
        with conn.cursor() as cur:
            cur.execute(ORDERS)
            for statement in DDL:
                cur.execute(statement)
        conn.commit()
    finally:
        conn.close()


def place_order(
    conn: pymysql.connections.Connection,
    namespace: str,
    queue: str,
    customer: str,
    amount: Decimal,
    *,
    decline: bool = False,
) -> int | None:
    """One order and its confirmation task, in ONE transaction: the order id, or None when
    the order was declined (rolled back: neither the order nor the task exists)."""
    try:
        with conn.cursor() as cur:
            cur.execute(
                "INSERT INTO orders (customer, amount, created_at) VALUES (%s, %s, UTC_TIMESTAMP(6))",
                (customer, amount),
            )
            order_id = int(cur.lastrowid)
            enqueue(cur, namespace, queue, "order_confirmation",
                    {"order_id": order_id, "customer": customer, "amount": str(amount)})  # fmt: skip
            if decline:  # e.g. a stock check after the insert failed
                raise Declined(order_id)
        conn.commit()
        return order_id
    except Declined:
        conn.rollback()
        return None


def place(args: argparse.Namespace) -> None:
    conn = connect(args.dsn)
    placed, declined = [], 0
    try:
        for n in range(1, args.count + 1):
            decline = bool(args.rollback_every) and n % args.rollback_every == 0
            order = place_order(conn, args.namespace, args.queue, f"customer-{n}",
                                Decimal(n) / 4, decline=decline)  # fmt: skip
            if order is None:
                declined += 1
            else:
                placed.append(order)
    finally:
        conn.close()
    print(json.dumps({"placed": len(placed), "declined": declined}))


async def relay(args: argparse.Namespace) -> None:
    url, key = os.environ.get("ORBIT_URL"), os.environ.get("ORBIT_KEY")
    if not url or not key:
        raise SystemExit("set ORBIT_URL and ORBIT_KEY")
    async with OrbitClient(url, key) as client:
        outbox = OutboxRelay(args.dsn, client, batch=args.batch, lease_s=args.lease_s)
        try:
            await outbox.run(until_idle=True)
        finally:
            await outbox.close()
        print(json.dumps({"sent": outbox.stats.sent, "failed": outbox.stats.failed}))


def check(args: argparse.Namespace) -> dict[str, Any]:
    conn = connect(args.dsn)
    try:
        with conn.cursor() as cur:
            cur.execute("SELECT COUNT(*) FROM orders")
            (orders,) = cur.fetchone()
            cur.execute("SELECT COUNT(*), SUM(sent_at IS NOT NULL), SUM(failed_at IS NOT NULL)"
                        " FROM orbit_outbox")  # fmt: skip
            rows, sent, failed = cur.fetchone()
    finally:
        conn.close()
    out = {"orders": int(orders), "outbox_rows": int(rows), "sent": int(sent or 0),
           "failed": int(failed or 0)}  # fmt: skip
    print(json.dumps(out))
    return out


def main(argv: list[str] | None = None) -> int:
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(message)s")
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    sub = parser.add_subparsers(dest="command", required=True)
    for name in ("setup", "place", "relay", "check"):
        p = sub.add_parser(name)
        p.add_argument("--dsn", required=True, help="the service's database")
        if name == "place":
            p.add_argument("--namespace", default="default")
            p.add_argument("--queue", default="emails")
            p.add_argument("--count", type=int, default=10)
            p.add_argument("--rollback-every", type=int, default=0,
                           help="decline every n-th order (its transaction rolls back)")  # fmt: skip
        if name == "relay":
            p.add_argument("--batch", type=int, default=100)
            p.add_argument("--lease-s", type=float, default=30.0)
    args = parser.parse_args(argv)
    if args.command == "setup":
        setup(args.dsn)
    elif args.command == "place":
        place(args)
    elif args.command == "relay":
        asyncio.run(relay(args))
    else:
        check(args)
    return 0


if __name__ == "__main__":
    sys.exit(main())
