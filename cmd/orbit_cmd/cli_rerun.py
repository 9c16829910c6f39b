"""``orbit tasks retry ID --note N`` and ``orbit tasks retry-all --note N [filters] [--yes]``:
re-run FAILED or CANCELLED tasks (docs/api/tasks.md "Re-run a finished task"); action
``tasks.resolve``. ``retry-all`` first asks the server how many tasks match (a dry run) and
prints the count; only with ``--yes`` does it re-run them."""

from __future__ import annotations

import argparse
import json
import sys

from orbit_cmd.cli_common import api_for, ns_options, ns_path, seg, show
from orbit_cmd.cli_http import EXIT_OK, EXIT_USAGE, CliError

TASK_FIELDS = ["id", "state", "attempts", "max_attempts", "queue", "kind", "resolution"]


def cmd_retry(args: argparse.Namespace) -> int:
    api = api_for(args)
    body = {"note": args.note, "attempts": args.attempts}
    answer = api.request(
        "POST", ns_path(args, api, f"/tasks/{seg(args.id)}/retry"), json_body=body
    )
    show(args, answer, TASK_FIELDS)
    return EXIT_OK


def cmd_retry_all(args: argparse.Namespace) -> int:
    api = api_for(args)
    body = {
        k: v
        for k, v in {
            "note": args.note, "attempts": args.attempts, "states": args.state or None,
            "queue": args.queue, "kind": args.kind, "owner_id": args.owner_id,
            "error_type": args.error_type, "finished_after": args.finished_after,
            "finished_before": args.finished_before,
        }.items()
        if v is not None
    }  # fmt: skip
    path = ns_path(args, api, "/tasks:retry")
    counted = api.request("POST", path, json_body={**body, "dry_run": True}).json()
    matched = f"{counted['matched']}{'+' if counted.get('more') else ''}"
    if not args.yes:
        if args.json:
            print(json.dumps(counted))
        else:
            print(f"{matched} finished tasks match; add --yes to re-run them")
        return EXIT_USAGE if counted["matched"] else EXIT_OK
    print(f"re-running {matched} tasks…", file=sys.stderr)
    answer = api.request("POST", path, json_body=body)
    show(args, answer, ["retried", "quota_refused"])
    if answer.json().get("quota_refused"):
        raise CliError("a quota stopped the re-run: run it again when there is room", 1)
    return EXIT_OK


def add_rerun(tasks: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """Add ``retry`` and ``retry-all`` to the ``orbit tasks`` group."""
    common = ns_options()
    p = tasks.add_parser(
        "retry", parents=[common], help="re-run a FAILED or CANCELLED task (note required)",
        description="Back to WAITING with a new generation; its attempts stay in its history.",
    )  # fmt: skip
    p.add_argument("id")
    p.add_argument("--note", required=True, help="why (kept on the task and in the audit trail)")
    p.add_argument("--attempts", type=int, default=1, help="at least this many more (default 1)")
    p.set_defaults(func=cmd_retry, json=False)

    p = tasks.add_parser(
        "retry-all", parents=[common], help="re-run every finished task of a filter",
        description="Prints how many tasks match; with --yes re-runs them, oldest finish "
        "first, in batches. Tasks that finish again meanwhile are not taken twice.",
    )  # fmt: skip
    p.add_argument("--note", required=True, help="why (kept on every task)")
    p.add_argument("--attempts", type=int, default=1, help="at least this many more (default 1)")
    p.add_argument("--state", action="append", choices=["FAILED", "CANCELLED"],
                   help="repeatable; default both")  # fmt: skip
    p.add_argument("--queue")
    p.add_argument("--kind")
    p.add_argument("--owner-id")
    p.add_argument("--error-type", help='the failed tasks whose error "type" is this')
    p.add_argument("--finished-after", help="RFC 3339, inclusive")
    p.add_argument("--finished-before", help="RFC 3339, exclusive (default: now)")
    p.add_argument("--yes", action="store_true", help="re-run them (without it: only count)")
    p.add_argument("--timeout", type=float, help="seconds to wait for the answer (default 30)")
    p.set_defaults(func=cmd_retry_all, json=False)
