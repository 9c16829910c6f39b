"""``orbit schedules ...``: put (publish a new immutable version), get, list, occurrences,
pause, resume. Routes: docs/api/schedules.md. ``put`` needs
``schedules.manage``; reads accept ``tasks.read`` too.
"""

from __future__ import annotations

import argparse
from typing import Any

from orbit_cmd.cli_common import (
    api_for,
    fetch_pages,
    if_match,
    json_text,
    list_options,
    ns_options,
    ns_path,
    seg,
    show,
    show_page,
    splice,
)
from orbit_cmd.cli_deletes import add_delete
from orbit_cmd.cli_http import EXIT_OK, EXIT_USAGE, CliError

SCHEDULE_FIELDS = [
    "name", "version", "paused", "queue", "cron", "every_ms", "timezone", "task",
    "next_fire_at", "next_fire_at_local", "covered_until", "catchup_window_ms", "grace_ms",
    "start_at", "end_at", "overlap", "buffered_fire_at", "last_task_id", "tzdata_version",
    "revision", "id", "published_at",
]  # fmt: skip
LIST_COLUMNS = ["name", "version", "paused", "queue", "cron", "every_ms", "timezone",
                "next_fire_at"]  # fmt: skip
OCCURRENCE_COLUMNS = ["fire_at", "fire_at_local", "version", "origin", "outcome", "late",
                      "task_id", "skipped_count", "reason"]  # fmt: skip
BACKFILL_FIELDS = ["count", "already_occurred", "fire_times", "from", "to"]


def _render(s: dict[str, Any]) -> dict[str, Any]:
    task = s.get("task")
    if isinstance(task, dict):
        s = {**s, "task": {k: v for k, v in task.items() if v not in (None, "", False)}}
    return s


def cmd_put(args: argparse.Namespace) -> int:
    api = api_for(args)
    path = ns_path(args, api, f"/schedules/{seg(args.name)}")
    text = json_text(None, args.file, "file")
    if text is not None:
        content = text.encode()
    else:
        if not args.queue or not args.kind:
            raise CliError("--queue and --kind are required (or give --file)", EXIT_USAGE)
        if (args.cron is None) == (args.every_ms is None):
            raise CliError("give exactly one of --cron and --every-ms", EXIT_USAGE)
        payload = json_text(args.payload, args.payload_file, "payload")
        task = splice(
            {
                "kind": args.kind, "priority": args.priority,
                "pipeline_version": args.pipeline_version, "dedup_key": args.dedup_key,
                "max_attempts": args.max_attempts, "deadline_ms": args.deadline_ms,
                "retry_safe": True if args.retry_safe else None,
            },
            {"payload": payload},
        ).decode()  # fmt: skip
        fields = {
            "queue": args.queue, "cron": args.cron, "every_ms": args.every_ms,
            "timezone": args.timezone, "catchup_window_ms": args.catchup_window_ms,
            "grace_ms": args.grace_ms, "start_at": args.start_at, "end_at": args.end_at,
            "overlap": args.overlap,
        }  # fmt: skip
        content = splice(fields, {"task": task})
    answer = api.request("PUT", path, content=content, headers=if_match(args))
    show(args, answer, SCHEDULE_FIELDS, _render)
    return EXIT_OK


def cmd_get(args: argparse.Namespace) -> int:
    api = api_for(args)
    answer = api.request("GET", ns_path(args, api, f"/schedules/{seg(args.name)}"))
    show(args, answer, SCHEDULE_FIELDS, _render)
    return EXIT_OK


def cmd_list(args: argparse.Namespace) -> int:
    api = api_for(args)
    items, cursor = fetch_pages(args, api, ns_path(args, api, "/schedules"), {})
    show_page(args, items, cursor, LIST_COLUMNS)
    return EXIT_OK


def cmd_occurrences(args: argparse.Namespace) -> int:
    api = api_for(args)
    path = ns_path(args, api, f"/schedules/{seg(args.name)}/occurrences")
    items, cursor = fetch_pages(args, api, path, {"outcome": args.outcome})
    show_page(args, items, cursor, OCCURRENCE_COLUMNS)
    return EXIT_OK


def cmd_pause(args: argparse.Namespace) -> int:
    api = api_for(args)
    path = ns_path(args, api, f"/schedules/{seg(args.name)}/{args.action}")
    show(args, api.request("POST", path), SCHEDULE_FIELDS, _render)
    return EXIT_OK


def _trigger_render(answer: dict[str, Any]) -> dict[str, Any]:
    occ = answer.get("occurrence") or {}
    task = answer.get("task") or {}
    return {
        "occurrence_id": occ.get("id"), "fire_at": occ.get("fire_at"),
        "version": occ.get("version"), "task_id": occ.get("task_id"),
        "task_state": task.get("state"), "idempotency_key": occ.get("idempotency_key"),
        "replayed": answer.get("replayed"),
    }  # fmt: skip


def cmd_trigger(args: argparse.Namespace) -> int:
    api = api_for(args)
    path = ns_path(args, api, f"/schedules/{seg(args.name)}/trigger")
    body = {"idempotency_key": args.idempotency_key} if args.idempotency_key else {}
    show(args, api.request("POST", path, json_body=body), None, _trigger_render)
    return EXIT_OK


def cmd_backfill(args: argparse.Namespace) -> int:
    api = api_for(args)
    path = ns_path(args, api, f"/schedules/{seg(args.name)}/backfill")
    answer = api.request("POST", path, json_body={"from": args.start, "to": args.end})
    show(args, answer, BACKFILL_FIELDS)
    return EXIT_OK


def register(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """``orbit schedules ...``."""
    common = ns_options()
    schedules = sub.add_parser("schedules", help="cron and interval schedules").add_subparsers(
        dest="sub", required=True
    )

    p = schedules.add_parser(
        "put",
        parents=[common],
        help="publish a new schedule version",
        description="Every put publishes a new immutable version (an identical one is a "
        "no-op). Give --file with the whole body, or the options below.",
    )
    p.add_argument("name")
    p.add_argument("--file", help="the whole PUT body as a JSON file ('-' = stdin)")
    p.add_argument("--queue")
    p.add_argument("--kind", help="task kind")
    p.add_argument("--cron", help="cron expression, e.g. '30 2 * * *'")
    p.add_argument("--every-ms", type=int, help="fixed interval (>= 1000)")
    p.add_argument("--timezone", help="IANA zone of the cron expression (default UTC)")
    p.add_argument("--payload", help="JSON payload of each task, sent byte for byte")
    p.add_argument("--payload-file")
    p.add_argument("--priority", type=int)
    p.add_argument("--pipeline-version")
    p.add_argument("--dedup-key", help="template: {schedule} {fire_at} {fire_at_local} {version}")
    p.add_argument("--max-attempts", type=int)
    p.add_argument("--deadline-ms", type=int, help="each task's deadline after its fire time")
    p.add_argument("--retry-safe", action="store_true")
    p.add_argument("--catchup-window-ms", type=int)
    p.add_argument("--grace-ms", type=int)
    p.add_argument("--start-at", help="RFC 3339")
    p.add_argument("--end-at", help="RFC 3339")
    p.add_argument(
        "--overlap", choices=["allow", "skip", "buffer_one", "cancel_previous"],
        help="what a fire time does while the previous run is unfinished (default allow)",
    )  # fmt: skip
    p.add_argument("--if-match", type=int, metavar="REV", help="only if the revision is REV")
    p.add_argument("--create-only", action="store_true", help="fail (412) if it exists")
    p.set_defaults(func=cmd_put, json=False)

    p = schedules.add_parser("get", parents=[common], help="current version and next fire time")
    p.add_argument("name")
    p.set_defaults(func=cmd_get, json=False)

    p = schedules.add_parser("list", parents=[common, list_options()], help="schedules by name")
    p.set_defaults(func=cmd_list, json=False)

    p = schedules.add_parser(
        "occurrences", parents=[common, list_options()], help="fire times, newest first"
    )
    p.add_argument("name")
    p.add_argument("--outcome", choices=["created", "skipped"])
    p.set_defaults(func=cmd_occurrences, json=False)

    for action in ("pause", "resume"):
        p = schedules.add_parser(action, parents=[common], help=f"{action} a schedule")
        p.add_argument("name")
        p.set_defaults(func=cmd_pause, action=action, json=False)

    p = schedules.add_parser(
        "trigger",
        parents=[common],
        help="fire a schedule once now",
        description="Exactly one occurrence now, with the current version's task (also "
        "when paused). With --idempotency-key a repeat returns the occurrence the key made.",
    )
    p.add_argument("name")
    p.add_argument("--idempotency-key", help="1-128 printable ASCII characters")
    p.set_defaults(func=cmd_trigger, json=False)

    p = schedules.add_parser(
        "backfill",
        parents=[common],
        help="create the tasks of a past range's fire times that have not run",
        description="Every fire time in [--from, --to) (at most 1000) that has not created a "
        "task yet gets one; fire times that ran are skipped, so a repeat creates nothing.",
    )
    p.add_argument("name")
    p.add_argument("--from", dest="start", required=True, help="RFC 3339, inclusive")
    p.add_argument("--to", dest="end", required=True, help="RFC 3339, exclusive")
    p.set_defaults(func=cmd_backfill, json=False)

    add_delete(schedules, "schedule", "schedules", note="its occurrences and tasks stay")
