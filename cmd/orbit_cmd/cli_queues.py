"""``orbit queues ...``: put, set, get, list, pause, resume, and the namespace gate
(``pause-namespace``, ``resume-namespace``, ``gate``). Routes:
docs/api/queues.md; action ``queues.manage``.

``put`` sends the whole configuration (an option left out takes its default, exactly like
the API's PUT); ``set`` changes only the options given: it reads the queue, applies them and
writes it back with ``If-Match`` of the revision it read, so a concurrent change is a 412
(exit 1), never silently overwritten.
"""

from __future__ import annotations

import argparse
import json
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
)
from orbit_cmd.cli_deletes import add_delete
from orbit_cmd.cli_http import EXIT_OK, EXIT_USAGE, CliError

QUEUE_FIELDS = [
    "name", "paused", "namespace_paused", "max_unfinished_tasks", "max_concurrency",
    "max_starts_per_second", "lease_ms", "retry", "retry_bounds", "stuck_after_ms", "counts",
    "usage",
    "revision", "id", "created_at", "updated_at",
]  # fmt: skip
LIST_COLUMNS = [
    "name", "paused", "unfinished", "active", "max_unfinished_tasks", "max_concurrency",
    "max_starts_per_second", "lease_ms", "revision",
]  # fmt: skip
LIMITS = ("max_unfinished_tasks", "max_concurrency", "max_starts_per_second")
RETRY = ("max_attempts", "backoff_initial_ms", "backoff_max_ms", "backoff_multiplier")
#: What a task's own retry policy may ask for (``retry_bounds``).
BOUNDS = ("min_delay_ms", "max_delay_ms", "max_multiplier")
_UNSET: Any = object()


def _limit(text: str) -> int | None:
    if text.lower() in ("unlimited", "none", "null"):
        return None
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError("an integer >= 0 or 'unlimited'") from None
    if value < 0:
        raise argparse.ArgumentTypeError("an integer >= 0 or 'unlimited'")
    return value


def _multiplier(text: str) -> float | None:
    if text.lower() in ("none", "null"):
        return None
    try:
        return float(text)
    except ValueError:
        raise argparse.ArgumentTypeError("a number >= 1 or 'none'") from None


def _render(q: dict[str, Any]) -> dict[str, Any]:
    """Counts and usage on one line each for people."""
    out = dict(q)
    if isinstance(q.get("counts"), dict):
        out["counts"] = " ".join(f"{k}={v}" for k, v in q["counts"].items())
    if isinstance(q.get("usage"), dict):
        u = q["usage"]
        out["usage"] = (
            f"unfinished={u['unfinished_tasks']} reservations={u['reservations']} "
            f"active={u['active_attempts']} denials={json.dumps(u['denials'])}"
        )
    return out


def _row(q: dict[str, Any]) -> dict[str, Any]:
    usage = q.get("usage") or {}
    return {
        **q,
        "paused": q.get("paused") or q.get("namespace_paused"),
        "unfinished": usage.get("unfinished_tasks"),
        "active": usage.get("active_attempts"),
    }


def _changes(args: argparse.Namespace) -> dict[str, Any]:
    """The options given on the command line, as a (partial) PUT body."""
    body: dict[str, Any] = {f: getattr(args, f) for f in LIMITS if getattr(args, f) is not _UNSET}
    for f in ("lease_ms", "stuck_after_ms"):
        if getattr(args, f) is not _UNSET:
            body[f] = getattr(args, f)
    retry = {f: getattr(args, f) for f in RETRY if getattr(args, f) is not _UNSET}
    if retry:
        body["retry"] = retry
    bounds = {f: getattr(args, f) for f in BOUNDS if getattr(args, f) is not _UNSET}
    if bounds:
        body["retry_bounds"] = bounds
    return body


def cmd_put(args: argparse.Namespace) -> int:
    api = api_for(args)
    path = ns_path(args, api, f"/queues/{seg(args.name)}")
    text = json_text(None, args.file, "file")
    body = _changes(args)
    if text is not None and body:
        raise CliError("give --file or options, not both", EXIT_USAGE)
    content = text.encode() if text is not None else None
    answer = api.request("PUT", path, json_body=body, content=content, headers=if_match(args))
    show(args, answer, QUEUE_FIELDS, _render)
    return EXIT_OK


def cmd_set(args: argparse.Namespace) -> int:
    api = api_for(args)
    path = ns_path(args, api, f"/queues/{seg(args.name)}")
    changes = _changes(args)
    if not changes:
        raise CliError("nothing to set: pass at least one option", EXIT_USAGE)
    current = api.json("GET", path)
    body = {f: current[f] for f in (*LIMITS, "lease_ms", "stuck_after_ms")}
    body["retry"] = {**current["retry"], **changes.pop("retry", {})}
    body["retry_bounds"] = {**(current.get("retry_bounds") or {}),
                            **changes.pop("retry_bounds", {})}  # fmt: skip
    body.update(changes)
    answer = api.request(
        "PUT", path, json_body=body, headers={"If-Match": f'"{current["revision"]}"'}
    )
    show(args, answer, QUEUE_FIELDS, _render)
    return EXIT_OK


def cmd_get(args: argparse.Namespace) -> int:
    api = api_for(args)
    answer = api.request("GET", ns_path(args, api, f"/queues/{seg(args.name)}"))
    show(args, answer, QUEUE_FIELDS, _render)
    return EXIT_OK


def cmd_list(args: argparse.Namespace) -> int:
    api = api_for(args)
    items, cursor = fetch_pages(args, api, ns_path(args, api, "/queues"), {})
    show_page(args, items, cursor, LIST_COLUMNS, _row)
    return EXIT_OK


def cmd_gate(args: argparse.Namespace) -> int:
    api = api_for(args)
    name = getattr(args, "name", None)
    suffix = f"/queues/{seg(name)}" if name else ""
    method = "GET" if args.action == "gate" else "POST"
    path = suffix + ("/gate" if args.action == "gate" else f"/{args.action}")
    answer = api.request(method, ns_path(args, api, path))
    show(args, answer, ["name", "paused", "namespace_paused", "gate"] if name else None)
    return EXIT_OK


def _config_options(p: argparse.ArgumentParser) -> None:
    for f in LIMITS:
        p.add_argument(
            "--" + f.replace("_", "-"), dest=f, type=_limit, default=_UNSET, metavar="N|unlimited"
        )
    p.add_argument("--lease-ms", type=int, default=_UNSET)
    p.add_argument("--stuck-after-ms", type=_limit, default=_UNSET, metavar="MS|none")
    p.add_argument("--max-attempts", type=int, default=_UNSET, help="retry.max_attempts")
    p.add_argument("--backoff-initial-ms", type=int, default=_UNSET)
    p.add_argument("--backoff-max-ms", type=int, default=_UNSET)
    p.add_argument("--backoff-multiplier", type=float, default=_UNSET)
    p.add_argument("--min-delay-ms", type=_limit, default=_UNSET, metavar="MS|none",
                   help="retry_bounds: a task's own backoff delays at least this")  # fmt: skip
    p.add_argument("--max-delay-ms", type=_limit, default=_UNSET, metavar="MS|none",
                   help="retry_bounds: a task's own backoff delays at most this")  # fmt: skip
    p.add_argument("--max-multiplier", type=_multiplier, default=_UNSET, metavar="X|none",
                   help="retry_bounds: a task's own backoff multiplier at most this")  # fmt: skip


def register(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """``orbit queues ...``."""
    common = ns_options()
    queues = sub.add_parser("queues", help="queues and execution gates").add_subparsers(
        dest="sub", required=True
    )

    p = queues.add_parser(
        "put",
        parents=[common],
        help="create or replace a queue's whole configuration",
        description="Options left out take their defaults (the API's PUT replaces the whole "
        "configuration); use `set` to change some options only.",
    )
    p.add_argument("name")
    _config_options(p)
    p.add_argument("--file", help="the whole PUT body as a JSON file ('-' = stdin)")
    p.add_argument("--if-match", type=int, metavar="REV", help="only if the revision is REV")
    p.add_argument("--create-only", action="store_true", help="fail (412) if it exists")
    p.set_defaults(func=cmd_put, json=False)

    p = queues.add_parser(
        "set", parents=[common], help="change some options of an existing queue (CAS)"
    )
    p.add_argument("name")
    _config_options(p)
    p.set_defaults(func=cmd_set, json=False)

    p = queues.add_parser("get", parents=[common], help="configuration, gate, counts, usage")
    p.add_argument("name")
    p.set_defaults(func=cmd_get, json=False)

    p = queues.add_parser("list", parents=[common, list_options()], help="queues by name")
    p.set_defaults(func=cmd_list, json=False)

    for action, text in (("pause", "stop new starts in a queue"), ("resume", "resume a queue")):
        p = queues.add_parser(action, parents=[common], help=text + " (idempotent)")
        p.add_argument("name")
        p.set_defaults(func=cmd_gate, action=action, json=False)
    for action, text in (
        ("pause", "stop new starts in every queue of the namespace"),
        ("resume", "resume the namespace gate"),
        ("gate", "show the namespace gate"),
    ):
        name = action if action == "gate" else f"{action}-namespace"
        p = queues.add_parser(name, parents=[common], help=text)
        p.set_defaults(func=cmd_gate, action=action, json=False)

    add_delete(
        queues, "queue", "queues", note="refused while tasks, schedules or sessions hold it"
    )
