"""``orbit retention get`` and ``orbit retention set``: the namespace's retention windows and
the purge progress. Route: docs/api/admin.md "Retention"; needs ``admin``.

``set`` changes only the windows given (``forever`` unsets one; ``default`` for
``--idempotency-hours``): it reads the settings, applies the options and writes them back
with ``If-Match`` of the revision it read, so a concurrent change is a 412 (exit 1), never
silently overwritten.
"""

from __future__ import annotations

import argparse
from typing import Any

from orbit_cmd.cli_common import api_for, ns_options, ns_path, show
from orbit_cmd.cli_http import EXIT_OK, EXIT_USAGE, CliError

FIELDS = ["finished_tasks_days", "events_days", "audit_days", "idempotency_hours",
          "revision", "purged_total", "last_run_at"]  # fmt: skip
WINDOWS = ("finished_tasks_days", "events_days", "audit_days", "idempotency_hours")


def _window(text: str) -> int | None:
    if text.lower() in ("forever", "default", "none", "null"):
        return None
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError("a whole number, or 'forever'") from None
    if value < 1:
        raise argparse.ArgumentTypeError("at least 1, or 'forever'")
    return value


def cmd_get(args: argparse.Namespace) -> int:
    api = api_for(args)
    show(args, api.request("GET", ns_path(args, api, "/retention")), FIELDS)
    return EXIT_OK


def cmd_set(args: argparse.Namespace) -> int:
    given = {f: getattr(args, f) for f in WINDOWS if getattr(args, f) is not _UNSET}
    if not given:
        raise CliError("nothing to set: give at least one window option", EXIT_USAGE)
    api = api_for(args)
    path = ns_path(args, api, "/retention")
    current: dict[str, Any] = api.json("GET", path)
    body = {f: current.get(f) for f in WINDOWS} | given
    headers = {"If-Match": f'"{current["revision"]}"'}
    show(args, api.request("PUT", path, json_body=body, headers=headers), FIELDS)
    return EXIT_OK


_UNSET: Any = object()


def register(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """``orbit retention ...``."""
    group = sub.add_parser(
        "retention", help="the namespace's retention windows and purge progress"
    ).add_subparsers(dest="sub", required=True)
    p = group.add_parser("get", parents=[ns_options()], help="the settings and purge progress")
    p.set_defaults(func=cmd_get, json=False)
    p = group.add_parser(
        "set", parents=[ns_options()], help="change some windows (the others are kept)"
    )
    for name, what in (
        ("finished-tasks-days", "days a finished task is kept (with its attempts and evidence)"),
        ("events-days", "days raw events, result events and deliveries are kept"),
        ("audit-days", "days audit events are kept (at least 7, not below --events-days)"),
        ("idempotency-hours", "hours Idempotency-Key records are remembered ('default': 24)"),
    ):
        p.add_argument(f"--{name}", type=_window, default=_UNSET, metavar="N|forever", help=what)
    p.set_defaults(func=cmd_set, json=False)
