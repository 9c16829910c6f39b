"""``orbit events list | tail`` (also ``orbit tasks tail``): the namespace's result events
(``GET /v1/namespaces/{ns}/events?after_seq=``, action ``events.read``).

``tail`` polls from ``--after-seq`` (default 0: the beginning) and prints each event as it
is committed, in sequence order, until Ctrl-C (exit 0) or ``--count`` events were printed.
``--json`` prints NDJSON: one event per line, byte for byte as the server sent it. A server
that goes away after the first page is retried with backoff (a note on stderr) instead of
ending the tail.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from typing import Any

import msgspec

from orbit_cmd.cli_common import api_for, ns_options, ns_path
from orbit_cmd.cli_http import EXIT_OK, EXIT_UNAVAILABLE, ApiClient, CliError, table

COLUMNS = ["seq", "created_at", "type", "task_id", "queue", "kind", "state", "attempts"]
PAGE = 500
MAX_BACKOFF_S = 10.0


class _EventPage(msgspec.Struct):
    items: list[msgspec.Raw] = msgspec.field(default_factory=list)
    next_after_seq: int = 0


def _page(api: ApiClient, path: str, after: int, limit: int) -> list[bytes]:
    answer = api.request("GET", path, params={"after_seq": after, "limit": limit})
    return [bytes(r) for r in msgspec.json.decode(answer.content, type=_EventPage).items]


def _wanted(args: argparse.Namespace, ev: dict[str, Any]) -> bool:
    return all(
        not getattr(args, f) or ev.get(f) in getattr(args, f) for f in ("queue", "kind", "state")
    )


def _line(ev: dict[str, Any]) -> str:
    cells = ["-" if ev.get(c) is None else str(ev.get(c)) for c in COLUMNS]
    return _FORMAT.format(*cells).rstrip()


_FORMAT = "{:>8}  {:<27}  {:<17}  {:<32}  {:<12}  {:<16}  {:<12}  {}"


def cmd_list(args: argparse.Namespace) -> int:
    api = api_for(args)
    items = _page(api, ns_path(args, api, "/events"), args.after_seq, args.limit)
    if args.json:
        sys.stdout.write('{"items":[' + ",".join(i.decode() for i in items) + "]}\n")
    else:
        print(table([json.loads(i) for i in items], COLUMNS))
    return EXIT_OK


def cmd_tail(args: argparse.Namespace) -> int:
    """Follow the event stream; return on Ctrl-C or after ``--count`` printed events."""
    api = api_for(args)
    path = ns_path(args, api, "/events")
    after, printed, failures, reached = args.after_seq, 0, 0, False
    if not args.json:
        print(_FORMAT.format(*(c.upper() for c in COLUMNS)))
        sys.stdout.flush()
    try:
        while args.count is None or printed < args.count:
            try:
                items = _page(api, path, after, PAGE)
                failures, reached = 0, True
            except CliError as exc:
                if exc.code != EXIT_UNAVAILABLE or not reached:
                    raise
                failures += 1
                delay = min(MAX_BACKOFF_S, 0.5 * 2**failures)
                print(f"orbit: {exc.message}; retrying in {delay:.1f}s", file=sys.stderr)
                time.sleep(delay)
                continue
            for raw in items:
                ev = json.loads(raw)
                after = int(ev["seq"])
                if not _wanted(args, ev):
                    continue
                sys.stdout.write((raw.decode() if args.json else _line(ev)) + "\n")
                sys.stdout.flush()
                printed += 1
                if args.count is not None and printed >= args.count:
                    break
            if len(items) < PAGE and (args.count is None or printed < args.count):
                time.sleep(args.interval)
    except KeyboardInterrupt:
        pass  # Ctrl-C is how a tail ends
    return EXIT_OK


def add_tail(sub: argparse._SubParsersAction[argparse.ArgumentParser], name: str) -> None:
    """Register ``tail`` under a command group (``events`` and ``tasks`` both have it)."""
    p = sub.add_parser(
        name,
        parents=[ns_options()],
        help="follow result events (Ctrl-C to stop)",
        description="Print result events as they are committed, from --after-seq on. "
        "--json prints one JSON event per line (NDJSON).",
    )
    p.add_argument("--after-seq", type=int, default=0, help="start after this seq (default 0)")
    p.add_argument("--count", type=int, help="stop after printing this many events")
    p.add_argument("--interval", type=float, default=1.0, help="seconds between polls when idle")
    p.add_argument("--queue", action="append", help="only this queue (repeatable)")
    p.add_argument("--kind", action="append", help="only this kind (repeatable)")
    p.add_argument("--state", action="append", help="only this state (repeatable)")
    p.set_defaults(func=cmd_tail, json=False)


def register(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """``orbit events list | tail``."""
    events = sub.add_parser("events", help="result events of a namespace").add_subparsers(
        dest="sub", required=True
    )
    p = events.add_parser("list", parents=[ns_options()], help="one page of result events")
    p.add_argument("--after-seq", type=int, default=0)
    p.add_argument("--limit", type=int, default=50)
    p.set_defaults(func=cmd_list, json=False)
    add_tail(events, "tail")
