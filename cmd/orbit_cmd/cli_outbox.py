"""``orbit outbox ddl|relay|status|requeue-failed``: the transactional outbox of a service
(docs/sdk.md "Transactional enqueue (outbox)"). The outbox table lives in the SERVICE's
database (``--dsn``); the relay submits its committed rows to Orbit (``--url``/``--key``, or
``$ORBIT_URL``/``$ORBIT_KEY``; several URLs with commas) with a key derived from each row, so
each becomes one task however often it is sent."""

from __future__ import annotations

import argparse
import asyncio
import importlib
import json
import os
import signal
import sys
from collections.abc import Coroutine
from types import ModuleType
from typing import TYPE_CHECKING, Any, TypeVar

from orbit_cmd.cli_common import common_options
from orbit_cmd.cli_http import EXIT_API_ERROR, EXIT_OK, EXIT_UNAVAILABLE, EXIT_USAGE, CliError

if TYPE_CHECKING:  # the SDK is imported by the commands only: `orbit` starts fast
    from orbit_sdk import OrbitClient
    from orbit_sdk.outbox import OutboxRelay

T = TypeVar("T")


def _outbox() -> ModuleType:
    try:
        return importlib.import_module("orbit_sdk.outbox")
    except ImportError as exc:
        raise CliError(f"orbit outbox needs the SDK: pip install 'orbit-sdk[outbox]' ({exc})",
                       EXIT_USAGE) from exc  # fmt: skip


def _relay(args: argparse.Namespace, client: OrbitClient | None = None) -> OutboxRelay:
    return _outbox().OutboxRelay(
        args.dsn, client, batch=args.batch, lease_s=args.lease_s, concurrency=args.concurrency
    )


def _client(args: argparse.Namespace) -> OrbitClient:
    _outbox()
    from orbit_sdk import OrbitClient

    url = getattr(args, "url", None) or os.environ.get("ORBIT_URL")
    key = getattr(args, "key", None) or os.environ.get("ORBIT_KEY")
    if not url or not key:
        raise CliError("the relay needs --url and --key (or ORBIT_URL and ORBIT_KEY)", EXIT_USAGE)
    return OrbitClient(url, key)


def cmd_ddl(args: argparse.Namespace) -> int:
    print(";\n\n".join(_outbox().DDL) + ";")
    return EXIT_OK


async def _run_relay(args: argparse.Namespace) -> int:
    client = _client(args)
    relay = _relay(args, client)
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, stop.set)
    try:
        if args.create_table:
            await relay.create_table()
        await relay.run(stop, until_idle=args.until_idle)
    finally:
        await relay.close()
        await client.aclose()
    stats = relay.stats
    print(json.dumps({"claimed": stats.claimed, "sent": stats.sent, "failed": stats.failed,
                      "retried": stats.retried, "purged": stats.purged}))  # fmt: skip
    return EXIT_OK


def _run(coro: Coroutine[Any, Any, T]) -> T:
    """Run one command; a bad ``--dsn`` exits 2, an unreachable database 3, a refused key 1."""
    import pymysql
    from orbit_sdk.errors import OrbitConnectionError, OrbitError

    try:
        return asyncio.run(coro)
    except OrbitConnectionError as exc:
        raise CliError(str(exc), EXIT_UNAVAILABLE) from exc
    except OrbitError as exc:  # a wrong key (401) stops the relay
        raise CliError(f"{exc.status} {exc.code}: {exc.message}", EXIT_API_ERROR) from exc
    except ValueError as exc:
        raise CliError(str(exc), EXIT_USAGE) from exc
    except (pymysql.err.OperationalError, OSError) as exc:
        raise CliError(
            f"the outbox database could not be reached: {exc}", EXIT_UNAVAILABLE
        ) from exc


def cmd_relay(args: argparse.Namespace) -> int:
    return _run(_run_relay(args))


async def _status(args: argparse.Namespace) -> dict[str, object]:
    relay = _relay(args)
    try:
        return dict(await relay.counts())
    finally:
        await relay.close()


def cmd_status(args: argparse.Namespace) -> int:
    counts = _run(_status(args))
    if args.json:
        print(json.dumps(counts))
    else:
        for k, v in counts.items():
            print(f"{k:<18}{'—' if v is None else v}")
    return EXIT_OK if not counts["failed"] else 1


async def _requeue(args: argparse.Namespace) -> int:
    relay = _relay(args)
    try:
        return int(await relay.requeue_failed())
    finally:
        await relay.close()


def cmd_requeue(args: argparse.Namespace) -> int:
    if not args.yes:
        raise CliError("this sends every failed row again; add --yes", EXIT_USAGE)
    n = _run(_requeue(args))
    print(f"{n} failed rows will be sent again", file=sys.stderr if args.json else sys.stdout)
    if args.json:
        print(json.dumps({"requeued": n}))
    return EXIT_OK


def register(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """``orbit outbox ...``."""
    common = common_options()
    outbox = sub.add_parser("outbox", help="a service's transactional outbox").add_subparsers(
        dest="sub", required=True
    )
    p = outbox.add_parser("ddl", help="print the CREATE TABLE of the outbox")
    p.set_defaults(func=cmd_ddl, json=False)

    db = argparse.ArgumentParser(add_help=False)
    db.add_argument("--dsn", required=True,
                    help="the service's database: mysql://USER[:PASS]@HOST[:PORT]/DB")  # fmt: skip
    db.add_argument("--batch", type=int, default=100, help="rows claimed per round")
    db.add_argument("--lease-s", type=float, default=30.0,
                    help="a claimed row is another relay's again after this")  # fmt: skip
    db.add_argument("--concurrency", type=int, default=8, help="submits in flight at once")

    p = outbox.add_parser(
        "relay", parents=[common, db], help="submit the outbox's committed rows to Orbit",
        description="Runs until SIGINT/SIGTERM (or, with --until-idle, until nothing is due), "
        "then prints what it did as one JSON line.",
    )  # fmt: skip
    p.add_argument("--until-idle", action="store_true", help="stop when nothing is due")
    p.add_argument("--create-table", action="store_true", help="create the table first")
    p.set_defaults(func=cmd_relay, json=False)

    p = outbox.add_parser("status", parents=[common, db], help="pending, claimed, failed, sent")
    p.set_defaults(func=cmd_status, json=False)

    p = outbox.add_parser(
        "requeue-failed", parents=[common, db], help="send the rows Orbit refused again"
    )
    p.add_argument("--yes", action="store_true", help="confirm")
    p.set_defaults(func=cmd_requeue, json=False)
