"""``orbit tasks history ID``: the task's raw state events in order (its history). Route:
docs/api/tasks.md "History"; needs ``tasks.read``. ``--all`` follows every page; ``--json``
prints ``{"task_id", "events": [...], "next_cursor"}`` with each event as the server sent it."""

from __future__ import annotations

import argparse
import json
from typing import Any

from orbit_cmd.cli_common import (
    api_for,
    fetch_pages,
    list_options,
    ns_options,
    ns_path,
    seg,
    show_page,
)
from orbit_cmd.cli_http import EXIT_OK

COLUMNS = ["created_at", "type", "state", "state_version", "attempt_id", "details", "request_id"]
#: Event data shown in their own columns; the rest goes to ``details``.
_OWN = {"state", "state_version", "attempt_id", "queue", "attempts"}


def _row(e: dict[str, Any]) -> dict[str, Any]:
    data = e.get("data") if isinstance(e.get("data"), dict) else {}
    rest = {k: v for k, v in data.items() if k not in _OWN}
    return {
        **e,
        "state": data.get("state"),
        "state_version": data.get("state_version"),
        "attempt_id": data.get("attempt_id"),
        "details": json.dumps(rest, separators=(",", ":")) if rest else None,
    }


def cmd_history(args: argparse.Namespace) -> int:
    api = api_for(args)
    path = ns_path(args, api, f"/tasks/{seg(args.id)}/events")
    items, cursor = fetch_pages(args, api, path, {}, items_key="events")
    if args.json:
        head = b'{"task_id":' + json.dumps(args.id).encode() + b',"events":['
        body = head + b",".join(items) + b'],"next_cursor":' + json.dumps(cursor).encode() + b"}"
        print(body.decode())
        return EXIT_OK
    show_page(args, items, cursor, COLUMNS, _row)
    return EXIT_OK


def add_history(tasks: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """``orbit tasks history``."""
    p = tasks.add_parser(
        "history", parents=[ns_options(), list_options()],
        help="the task's raw state events in order",
        description="Every state change of the task as it was recorded (submitted, leased, "
        "started, retried, finished, re-run…), oldest first.",
    )  # fmt: skip
    p.add_argument("id")
    p.set_defaults(func=cmd_history, json=False)
