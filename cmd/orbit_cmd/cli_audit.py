"""``orbit audit list``: the namespace's audit events, newest first (who did what, with
which outcome). Route: docs/api/admin.md "Audit events"; needs ``admin``."""

from __future__ import annotations

import argparse
from typing import Any

from orbit_cmd.cli_common import api_for, fetch_pages, list_options, ns_options, ns_path, show_page
from orbit_cmd.cli_http import EXIT_OK

COLUMNS = ["created_at", "action", "outcome", "status_code", "resource_kind", "resource_id",
           "credential", "request_id"]  # fmt: skip


def _row(e: dict[str, Any]) -> dict[str, Any]:
    actor = e.get("actor") or {}
    who = actor.get("credential_name") or actor.get("credential_id") or "cli"
    return {**e, "credential": who}


def cmd_list(args: argparse.Namespace) -> int:
    api = api_for(args)
    params = {"outcome": args.outcome, "action": args.action, "since": args.since,
              "until": args.until}  # fmt: skip
    items, cursor = fetch_pages(args, api, ns_path(args, api, "/audit"), params)
    show_page(args, items, cursor, COLUMNS, _row)
    return EXIT_OK


def register(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """``orbit audit ...``."""
    audit = sub.add_parser("audit", help="the namespace's audit trail").add_subparsers(
        dest="sub", required=True
    )
    p = audit.add_parser(
        "list", parents=[ns_options(), list_options()], help="audit events, newest first"
    )
    p.add_argument("--outcome", choices=["ok", "denied", "conflict", "error"])
    p.add_argument("--action", help="an action name, e.g. tasks.cancel")
    p.add_argument("--since", help="RFC 3339, inclusive")
    p.add_argument("--until", help="RFC 3339, exclusive")
    p.set_defaults(func=cmd_list, json=False)
