"""``orbit workers list|close``: the connected worker sessions of a namespace and an
operator's close of one. Routes: docs/api/workers.md "Connected workers"; ``list`` needs
``tasks.read``, ``close`` needs ``queues.manage``."""

from __future__ import annotations

import argparse
from typing import Any

from orbit_cmd.cli_common import (
    api_for,
    fetch_pages,
    list_options,
    ns_options,
    ns_path,
    seg,
    show,
    show_page,
)
from orbit_cmd.cli_http import EXIT_OK, EXIT_USAGE, CliError

LIST_COLUMNS = ["id", "host", "pid", "sdk", "queues", "in_flight", "capacity",
                "heartbeat_age_ms", "node", "state"]  # fmt: skip
CLOSE_FIELDS = ["session_id", "state", "closed_at", "released_offers", "lost_attempts"]


def _row(s: dict[str, Any]) -> dict[str, Any]:
    inst = s.get("instance") or {}
    return {
        **s,
        "host": inst.get("host"),
        "pid": inst.get("pid"),
        "sdk": inst.get("sdk"),
        "queues": ",".join(s.get("queues") or []),
    }


def cmd_list(args: argparse.Namespace) -> int:
    api = api_for(args)
    params = {"state": args.state, "queue": args.queue}
    items, cursor = fetch_pages(args, api, ns_path(args, api, "/workers"), params,
                                items_key="sessions")  # fmt: skip
    if args.json:
        body = b'{"sessions":[' + b",".join(items) + b'],"next_cursor":'
        print((body + (b"null" if cursor is None else f'"{cursor}"'.encode()) + b"}").decode())
        return EXIT_OK
    show_page(args, items, cursor, LIST_COLUMNS, _row)
    return EXIT_OK


def cmd_close(args: argparse.Namespace) -> int:
    if not args.yes:
        raise CliError(
            "closing a session ends its running attempts (retried when retry-safe, else "
            "NEEDS_REVIEW); add --yes",
            EXIT_USAGE,
        )
    api = api_for(args)
    path = ns_path(args, api, f"/workers/{seg(args.session_id)}/close")
    show(args, api.request("POST", path, json_body={}), CLOSE_FIELDS)
    return EXIT_OK


def register(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """``orbit workers ...``."""
    common = ns_options()
    workers = sub.add_parser("workers", help="connected worker sessions").add_subparsers(
        dest="sub", required=True
    )
    p = workers.add_parser(
        "list", parents=[common, list_options()],
        help="worker sessions: instance, queues, capacity, in-flight attempts, heartbeat age",
    )  # fmt: skip
    p.add_argument("--state", choices=["ACTIVE", "CLOSED", "EXPIRED", "any"],
                   help="default ACTIVE")  # fmt: skip
    p.add_argument("--queue", help="only sessions that take work from this queue")
    p.set_defaults(func=cmd_list, json=False)

    p = workers.add_parser(
        "close", parents=[common], help="close a worker session (its attempts are recovered)",
        description="Its offers go back to their queues; its running attempts are lost as "
        "when a session expires: retried when retry-safe, FAILED on the last attempt, else "
        "NEEDS_REVIEW. The worker process opens a new session; stop it to stop its work.",
    )  # fmt: skip
    p.add_argument("session_id")
    p.add_argument("--yes", action="store_true", help="confirm")
    p.set_defaults(func=cmd_close, json=False)
