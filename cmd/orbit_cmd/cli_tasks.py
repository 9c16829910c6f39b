"""``orbit tasks ...``: submit (one, or a JSON-lines file in batches), get, list, cancel,
cancel-all, resolve, attempts, history, tail. Routes: docs/api/tasks.md; docs/cli.md.

Payloads and results are sent byte for byte as given (``--payload '{"amount": 1.50}'``
keeps ``1.50``), and ``--json`` prints the server's answer byte for byte.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Iterator
from typing import Any

from orbit_cmd import cli_events
from orbit_cmd.cli_common import (
    Progress,
    Spinner,
    api_for,
    fetch_pages,
    idempotency,
    json_text,
    list_options,
    ns_options,
    ns_path,
    seg,
    show,
    show_page,
    splice,
)
from orbit_cmd.cli_history import add_history
from orbit_cmd.cli_http import EXIT_API_ERROR, EXIT_OK, EXIT_USAGE, CliError, emit
from orbit_cmd.cli_rerun import add_rerun

TASK_FIELDS = [
    "id", "queue", "kind", "state", "priority", "attempts", "max_attempts", "owner_id",
    "pipeline_version", "dedup_key", "concurrency_key", "fairness_key", "retry_safe",
    "effect_uncertain",
    "cancel_requested", "created_at", "available_at", "deadline_at", "started_at",
    "finished_at", "payload", "result", "error", "resolution", "source", "revision",
    "stuck_at", "stuck_reason", "progress", "progress_at",
]  # fmt: skip
LIST_COLUMNS = ["id", "queue", "kind", "state", "priority", "attempts", "created_at", "finished_at"]
#: ``orbit tasks list --stuck``: what the watchdog recorded instead of the finish columns.
STUCK_COLUMNS = ["id", "queue", "kind", "state", "attempts", "stuck_at", "stuck_reason"]
ATTEMPT_COLUMNS = [
    "generation", "id", "state", "session_id", "started_at", "finished_at", "error", "progress",
    "evidence",
]  # fmt: skip
#: The server's batch limit (docs/api/conventions.md#limits) and a body size safely under its
#: default 1 MiB limit.
MAX_BATCH = 1000
MAX_BATCH_BYTES = 1_000_000


# --------------------------------------------------------------------------- one task


def cmd_submit(args: argparse.Namespace) -> int:
    api = api_for(args)
    payload = json_text(args.payload, args.payload_file, "payload")
    fields = {
        "queue": args.queue, "kind": args.kind, "pipeline_version": args.pipeline_version,
        "dedup_key": args.dedup_key, "priority": args.priority, "delay_ms": args.delay_ms,
        "available_at": args.available_at, "deadline_at": args.deadline_at,
        "max_attempts": args.max_attempts, "retry_safe": True if args.retry_safe else None,
        "concurrency_key": args.concurrency_key, "fairness_key": args.fairness_key,
    }  # fmt: skip
    retry = {
        k: v for k, v in (("backoff_initial_ms", args.backoff_initial_ms),
                          ("backoff_max_ms", args.backoff_max_ms),
                          ("backoff_multiplier", args.backoff_multiplier)) if v is not None
    }  # fmt: skip
    if retry:
        fields["retry"] = retry
    answer = api.request(
        "POST",
        ns_path(args, api, "/tasks"),
        content=splice(fields, {"payload": payload}),
        headers=idempotency(args),
    )
    show(args, answer, [*TASK_FIELDS[:8], "deduplicated"])
    return EXIT_OK


def cmd_get(args: argparse.Namespace) -> int:
    api = api_for(args)
    show(args, api.request("GET", ns_path(args, api, f"/tasks/{seg(args.id)}")), TASK_FIELDS)
    return EXIT_OK


def cmd_list(args: argparse.Namespace) -> int:
    api = api_for(args)
    params = {
        "queue": args.queue, "state": args.state, "kind": args.kind,
        "owner_id": args.owner_id, "dedup_key": args.dedup_key,
        "stuck": "true" if args.stuck else None,
    }  # fmt: skip
    items, cursor = fetch_pages(args, api, ns_path(args, api, "/tasks"), params)
    show_page(args, items, cursor, STUCK_COLUMNS if args.stuck else LIST_COLUMNS)
    return EXIT_OK


def cmd_cancel(args: argparse.Namespace) -> int:
    api = api_for(args)
    answer = api.request("POST", ns_path(args, api, f"/tasks/{seg(args.id)}/cancel"))
    show(args, answer, ["id", "state", "cancel_requested", "finished_at", "error"])
    if not args.json and answer.status_code == 202:
        print("(running: the worker was asked to stop)", file=sys.stderr)
    return EXIT_OK


def cmd_cancel_all(args: argparse.Namespace) -> int:
    api = api_for(args)
    body = {"owner_id": args.owner_id, "queue": args.queue, "kind": args.kind}
    body = {k: v for k, v in body.items() if v is not None}
    if not body and not args.yes:
        raise CliError(
            "no filter: this cancels every unfinished task of the namespace; add --yes",
            EXIT_USAGE,
        )
    path = ns_path(args, api, "/tasks:cancel")
    with Spinner("cancelling"):
        answer = api.request("POST", path, json_body=body)
    show(args, answer, ["cancelled", "cancel_requested"])
    return EXIT_OK


def cmd_resolve(args: argparse.Namespace) -> int:
    api = api_for(args)
    result = json_text(args.result, args.result_file, "result")
    error = json_text(args.error, None, "error")
    if result is not None and args.action != "succeed":
        raise CliError("--result goes with succeed", EXIT_USAGE)
    if error is not None and args.action != "fail":
        raise CliError("--error goes with fail", EXIT_USAGE)
    content = splice({"action": args.action, "note": args.note}, {"result": result, "error": error})
    answer = api.request(
        "POST", ns_path(args, api, f"/tasks/{seg(args.id)}/resolve"), content=content
    )
    show(args, answer, ["id", "state", "effect_uncertain", "result", "error", "resolution"])
    return EXIT_OK


def _attempt_row(a: dict[str, Any]) -> dict[str, Any]:
    error = a.get("error")
    kinds = [e.get("kind") for e in a.get("evidence") or []]
    return {
        **a,
        "error": error.get("type") if isinstance(error, dict) else error,
        "evidence": kinds,
    }


def cmd_attempts(args: argparse.Namespace) -> int:
    api = api_for(args)
    answer = api.request("GET", ns_path(args, api, f"/tasks/{seg(args.id)}/attempts"))
    if args.json:
        show(args, answer)
        return EXIT_OK
    doc = answer.json()
    emit(args, [_attempt_row(a) for a in doc.get("items", [])], ATTEMPT_COLUMNS)
    for ev in doc.get("evidence") or []:
        print(f"evidence without attempt: {json.dumps(ev)}")
    return EXIT_OK


# --------------------------------------------------------------------------- batch submit


def _lines(path: str) -> Iterator[tuple[int, str]]:
    """Non-blank lines of the file (``-`` = stdin) with their 1-based numbers."""
    try:
        f = sys.stdin if path == "-" else open(path, encoding="utf-8")  # noqa: SIM115
    except OSError as exc:
        raise CliError(f"cannot read {path}: {exc}", EXIT_USAGE) from None
    try:
        for number, line in enumerate(f, 1):
            if line.strip():
                yield number, line.strip()
    finally:
        if f is not sys.stdin:
            f.close()


def _with_defaults(line: str, obj: dict[str, Any], args: argparse.Namespace) -> str:
    """Put ``--queue``/``--kind`` in front of an item lacking them, keeping the rest exact."""
    extra = [
        json.dumps(k) + ":" + json.dumps(v)
        for k, v in (("queue", args.queue), ("kind", args.kind))
        if v is not None and k not in obj
    ]
    if not extra:
        return line
    rest = line.lstrip()[1:]  # after "{"
    return "{" + ",".join(extra) + ("," if obj else "") + rest


def _prepared(args: argparse.Namespace) -> list[tuple[int, str]]:
    """Every item, checked before anything is sent: a line that is not a JSON object is a
    usage error (exit 2) and nothing is submitted."""
    items: list[tuple[int, str]] = []
    for number, line in _lines(args.file):
        try:
            obj = json.loads(line)
        except ValueError as exc:
            raise CliError(f"{args.file}:{number}: not valid JSON: {exc}", EXIT_USAGE) from None
        if not isinstance(obj, dict):
            raise CliError(f"{args.file}:{number}: not a JSON object", EXIT_USAGE)
        items.append((number, _with_defaults(line, obj, args)))
    return items


def _chunks(items: list[tuple[int, str]], size: int) -> Iterator[list[tuple[int, str]]]:
    """Consecutive chunks of at most ``size`` items and MAX_BATCH_BYTES of body."""
    chunk: list[tuple[int, str]] = []
    nbytes = 0
    for item in items:
        n = len(item[1].encode()) + 1
        if chunk and (len(chunk) >= size or nbytes + n > MAX_BATCH_BYTES):
            yield chunk
            chunk, nbytes = [], 0
        chunk.append(item)
        nbytes += n
    if chunk:
        yield chunk


def cmd_submit_batch(args: argparse.Namespace) -> int:
    """Submit a JSON-lines file in chunks (one transaction per chunk). With
    ``--idempotency-key P`` chunk *i* carries ``P-i``, so re-running the same file with the
    same options replays the chunks already accepted instead of submitting them again."""
    if not 1 <= args.chunk_size <= MAX_BATCH:
        raise CliError(f"--chunk-size must be 1-{MAX_BATCH}", EXIT_USAGE)
    api = api_for(args)
    items = _prepared(args)
    path = ns_path(args, api, "/tasks:batch")
    summary: dict[str, Any] = {
        "lines": len(items), "created": 0, "deduplicated": 0, "rejected": 0, "chunks": 0,
        "replayed_chunks": 0, "errors": [],
    }  # fmt: skip
    progress = Progress("submitting", len(items))
    done = 0
    try:
        for index, chunk in enumerate(_chunks(items, args.chunk_size), 1):
            body = ('{"tasks":[' + ",".join(text for _, text in chunk) + "]}").encode()
            headers = (
                {"Idempotency-Key": f"{args.idempotency_key}-{index}"}
                if args.idempotency_key
                else None
            )
            try:
                answer = api.request("POST", path, content=body, headers=headers)
            except CliError as exc:
                exc.message += f" (chunk {index} at line {chunk[0][0]}; {done} lines sent before)"
                raise
            summary["chunks"] += 1
            if answer.headers.get("idempotent-replayed") == "true":
                summary["replayed_chunks"] += 1
            for (number, _), result in zip(chunk, answer.json()["items"], strict=True):
                status = result["status"]
                if status == 201:
                    summary["created"] += 1
                elif status == 200:
                    summary["deduplicated"] += 1
                else:
                    summary["rejected"] += 1
                    summary["errors"].append(
                        {"line": number, "status": status, "error": result.get("error")}
                    )
            done += len(chunk)
            progress.update(done)
    finally:
        progress.close()
    _print_batch(args, summary)
    return EXIT_API_ERROR if summary["rejected"] else EXIT_OK


def _print_batch(args: argparse.Namespace, summary: dict[str, Any]) -> None:
    if args.json:
        print(json.dumps(summary, separators=(",", ":")))
        return
    print(
        f"{summary['lines']} lines in {summary['chunks']} chunks: {summary['created']} created, "
        f"{summary['deduplicated']} deduplicated, {summary['rejected']} rejected"
        + (f" ({summary['replayed_chunks']} chunks replayed)" if summary["replayed_chunks"] else "")
    )
    if summary["errors"]:
        rows = [
            {
                "line": e["line"],
                "status": e["status"],
                "code": (e["error"] or {}).get("code"),
                "message": (e["error"] or {}).get("message"),
                "details": (e["error"] or {}).get("details") or None,
            }
            for e in summary["errors"]
        ]
        emit(args, rows, ["line", "status", "code", "message", "details"])


# --------------------------------------------------------------------------- parser


def register(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """``orbit tasks ...``."""
    common = ns_options()
    tasks = sub.add_parser("tasks", help="tasks of a namespace").add_subparsers(
        dest="sub", required=True
    )

    p = tasks.add_parser("submit", parents=[common], help="submit one task")
    p.add_argument("queue")
    p.add_argument("kind")
    p.add_argument("--payload", help="JSON text, sent byte for byte")
    p.add_argument("--payload-file", help="file with the JSON payload ('-' = stdin)")
    p.add_argument("--pipeline-version")
    p.add_argument("--dedup-key")
    p.add_argument("--priority", type=int, help="0 (low) .. 9 (high)")
    p.add_argument("--delay-ms", type=int)
    p.add_argument("--available-at", help="RFC 3339 time")
    p.add_argument("--deadline-at", help="RFC 3339 time")
    p.add_argument("--max-attempts", type=int)
    p.add_argument("--retry-safe", action="store_true", help="the task is idempotent")
    p.add_argument("--concurrency-key")
    p.add_argument("--fairness-key", help="fair dispatch within the queue rotates across these")
    p.add_argument("--backoff-initial-ms", type=int, help="this task's own first retry delay")
    p.add_argument("--backoff-max-ms", type=int, help="this task's own retry delay cap")
    p.add_argument("--backoff-multiplier", type=float, help="this task's own delay growth")
    p.add_argument("--idempotency-key")
    p.set_defaults(func=cmd_submit, json=False)

    p = tasks.add_parser(
        "submit-batch",
        parents=[common],
        help="submit a JSON-lines file of tasks in chunks",
        description="Each non-blank line is one task object (the body of a single submit). "
        "Lines are checked first (a bad line sends nothing, exit 2), then sent in chunks of "
        "--chunk-size (max 1000, and under 1 MB each), one transaction per chunk. Exit 1 when "
        "any item was rejected (their line numbers are listed).",
    )
    p.add_argument("--file", required=True, help="JSON lines ('-' = stdin)")
    p.add_argument("--queue", help="queue for items that name none")
    p.add_argument("--kind", help="kind for items that name none")
    p.add_argument("--chunk-size", type=int, default=MAX_BATCH)
    p.add_argument(
        "--idempotency-key",
        metavar="PREFIX",
        help="chunk i is sent with Idempotency-Key PREFIX-i (safe re-runs)",
    )
    p.add_argument("--timeout", type=float, help="seconds per request (default 30)")
    p.set_defaults(func=cmd_submit_batch, json=False)

    p = tasks.add_parser("get", parents=[common], help="show a task")
    p.add_argument("id")
    p.set_defaults(func=cmd_get, json=False)

    p = tasks.add_parser("list", parents=[common, list_options()], help="list tasks, oldest first")
    p.add_argument("--queue")
    p.add_argument("--state", help="WAITING, LEASED, RUNNING, SUCCEEDED, FAILED, ...")
    p.add_argument("--kind")
    p.add_argument("--owner-id")
    p.add_argument("--dedup-key")
    p.add_argument(
        "--stuck",
        action="store_true",
        help="only tasks the stuck-work watchdog surfaced in their current state",
    )
    p.set_defaults(func=cmd_list, json=False)

    p = tasks.add_parser("cancel", parents=[common], help="cancel a task")
    p.add_argument("id")
    p.set_defaults(func=cmd_cancel, json=False)

    p = tasks.add_parser(
        "cancel-all",
        parents=[common],
        help="cancel every unfinished task matching the filters",
        description="Filters combine with AND. Without any filter every unfinished task of "
        "the namespace is cancelled, which needs --yes.",
    )
    p.add_argument("--owner-id", help="owning application id")
    p.add_argument("--queue")
    p.add_argument("--kind")
    p.add_argument("--yes", action="store_true", help="confirm a cancel without filters")
    p.add_argument("--timeout", type=float, help="seconds to wait for the answer (default 30)")
    p.set_defaults(func=cmd_cancel_all, json=False)

    p = tasks.add_parser("resolve", parents=[common], help="resolve a NEEDS_REVIEW task")
    p.add_argument("id")
    p.add_argument("action", choices=["retry", "succeed", "fail"])
    p.add_argument("--note", required=True, help="why (kept in the audit trail)")
    p.add_argument("--result", help="JSON result of a succeed")
    p.add_argument("--result-file", help="file with the JSON result ('-' = stdin)")
    p.add_argument("--error", help='JSON object of a fail, e.g. {"type": "manual"}')
    p.set_defaults(func=cmd_resolve, json=False)

    p = tasks.add_parser("attempts", parents=[common], help="attempts of a task with evidence")
    p.add_argument("id")
    p.set_defaults(func=cmd_attempts, json=False)

    add_rerun(tasks)
    add_history(tasks)
    cli_events.add_tail(tasks, "tail")
