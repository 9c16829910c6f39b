"""``orbit subscriptions ...``: put, get (config + backlog), pull, ack, nack, deliveries
(history), budget. Routes: docs/api/subscriptions.md.

``put`` changes only what is given (omitted limits keep their value; ``--start`` applies on
create only). ``pull`` leases deliveries over HTTP and prints them with their one-time
``proof``; ``--ack`` acknowledges each one after printing it (at-least-once: a crash between
print and ack means a redelivery). The WebSocket stream is the SDK's job (``Subscriber``).
"""

from __future__ import annotations

import argparse
import json
import sys
from typing import Any

from orbit_cmd.cli_common import (
    api_for,
    fetch_pages,
    idempotency,
    if_match,
    list_options,
    ns_options,
    ns_path,
    seg,
    show,
    show_page,
)
from orbit_cmd.cli_deletes import add_delete
from orbit_cmd.cli_http import EXIT_OK, EXIT_USAGE, CliError, table

SUB_FIELDS = [
    "name", "filter", "start", "position", "ack_timeout_ms", "max_deliveries", "max_in_flight",
    "backlog", "revision", "id", "created_at", "updated_at",
]  # fmt: skip
DELIVERY_COLUMNS = ["delivery_id", "seq", "state", "attempts", "budget", "next_at", "acked_at",
                    "event_id"]  # fmt: skip
PULLED_COLUMNS = ["delivery_id", "seq", "attempt", "type", "task_id", "state", "proof"]


def _start(text: str) -> Any:
    if text in ("earliest", "latest"):
        return text
    try:
        return {"after_seq": int(text)}
    except ValueError:
        raise argparse.ArgumentTypeError("earliest, latest or a sequence number") from None


def cmd_put(args: argparse.Namespace) -> int:
    api = api_for(args)
    body: dict[str, Any] = {}
    flt = {"queues": args.queue, "kinds": args.kind, "states": args.state,
           "owner_id": args.owner_id}  # fmt: skip
    if any(v is not None for v in flt.values()):
        body["filter"] = {k: v for k, v in flt.items() if v is not None}
    for f in ("start", "ack_timeout_ms", "max_deliveries", "max_in_flight"):
        if getattr(args, f) is not None:
            body[f] = getattr(args, f)
    answer = api.request(
        "PUT",
        ns_path(args, api, f"/subscriptions/{seg(args.name)}"),
        json_body=body,
        headers=if_match(args),
    )
    show(args, answer, SUB_FIELDS)
    return EXIT_OK


def cmd_get(args: argparse.Namespace) -> int:
    api = api_for(args)
    show(
        args, api.request("GET", ns_path(args, api, f"/subscriptions/{seg(args.name)}")), SUB_FIELDS
    )
    return EXIT_OK


def cmd_pull(args: argparse.Namespace) -> int:
    api = api_for(args)
    path = ns_path(args, api, f"/subscriptions/{seg(args.name)}/pull")
    api.timeout = max(api.timeout, args.wait_ms / 1000 + 10)
    answer = api.request("POST", path, json_body={"max": args.max, "wait_ms": args.wait_ms})
    deliveries = answer.json()["deliveries"]
    acked = []
    if args.ack:
        for d in deliveries:
            ack_path = ns_path(args, api, f"/deliveries/{seg(d['delivery_id'])}/ack")
            acked.append(api.json("POST", ack_path, json_body={"proof": d["proof"]}))
    if args.json:
        out = answer.content.decode().strip()
        if args.ack:
            out = out[:-1] + ',"acked":' + json.dumps([a["delivery"] for a in acked]) + "}"
        print(out)
        return EXIT_OK
    rows = [{**d, **{k: d["event"].get(k) for k in ("type", "task_id", "state")}}
            for d in deliveries]  # fmt: skip
    print(table(rows, PULLED_COLUMNS))
    if args.ack:
        print(f"({len(acked)} acked)", file=sys.stderr)
    return EXIT_OK


def cmd_ack(args: argparse.Namespace) -> int:
    api = api_for(args)
    path = ns_path(args, api, f"/deliveries/{seg(args.id)}/{args.action}")
    body: dict[str, Any] = {"proof": args.proof}
    if getattr(args, "retry_after_ms", None) is not None:
        body["retry_after_ms"] = args.retry_after_ms
    answer = api.request("POST", path, json_body=body)
    show(args, answer, None, _delivery)
    return EXIT_OK


def _delivery(doc: dict[str, Any]) -> dict[str, Any]:
    """An ack answer is ``{"outcome", "delivery"}``; a nack answer is the delivery."""
    if "delivery" in doc:
        return {"outcome": doc.get("outcome"), **doc["delivery"]}
    return doc


def cmd_deliveries(args: argparse.Namespace) -> int:
    api = api_for(args)
    path = ns_path(args, api, f"/subscriptions/{seg(args.name)}/deliveries")
    items, cursor = fetch_pages(args, api, path, {"state": args.state})
    show_page(args, items, cursor, DELIVERY_COLUMNS)
    return EXIT_OK


def cmd_budget(args: argparse.Namespace) -> int:
    if args.add < 1:
        raise CliError("--add must be at least 1", EXIT_USAGE)
    api = api_for(args)
    answer = api.request(
        "POST",
        ns_path(args, api, f"/deliveries/{seg(args.id)}/budget"),
        json_body={"add": args.add},
        headers=idempotency(args),
    )
    show(args, answer, ["delivery_id", "state", "attempts", "budget", "next_at"])
    return EXIT_OK


def register(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """``orbit subscriptions ...``."""
    common = ns_options()
    subs = sub.add_parser("subscriptions", help="result-event subscriptions").add_subparsers(
        dest="sub", required=True
    )
    p = subs.add_parser("put", parents=[common], help="create or change a subscription")
    p.add_argument("name")
    p.add_argument("--queue", action="append", help="filter: queue (repeatable)")
    p.add_argument("--kind", action="append", help="filter: kind (repeatable)")
    p.add_argument("--state", action="append", help="filter: final state (repeatable)")
    p.add_argument("--owner-id", help="filter: owning application id")
    p.add_argument("--start", type=_start, help="earliest, latest or SEQ (on create only)")
    p.add_argument("--ack-timeout-ms", type=int)
    p.add_argument("--max-deliveries", type=int, help="attempt budget of each delivery")
    p.add_argument("--max-in-flight", type=int)
    p.add_argument("--if-match", type=int, metavar="REV", help="only if the revision is REV")
    p.add_argument("--create-only", action="store_true", help="fail (412) if it exists")
    p.set_defaults(func=cmd_put, json=False)

    p = subs.add_parser("get", parents=[common], help="configuration and backlog")
    p.add_argument("name")
    p.set_defaults(func=cmd_get, json=False)

    p = subs.add_parser("pull", parents=[common], help="lease deliveries over HTTP")
    p.add_argument("name")
    p.add_argument("--max", type=int, default=10, help="at most this many (1-500)")
    p.add_argument("--wait-ms", type=int, default=0, help="wait this long for one (max 30000)")
    p.add_argument("--ack", action="store_true", help="ack each delivery after printing it")
    p.set_defaults(func=cmd_pull, json=False)

    for action, text in (("ack", "acknowledge a delivery"), ("nack", "give a delivery back")):
        p = subs.add_parser(action, parents=[common], help=text)
        p.add_argument("id", help="delivery id")
        p.add_argument("--proof", required=True, help="the proof of the current lease")
        if action == "nack":
            p.add_argument("--retry-after-ms", type=int)
        p.set_defaults(func=cmd_ack, action=action, json=False)

    p = subs.add_parser("deliveries", parents=[common, list_options()], help="delivery history")
    p.add_argument("name")
    p.add_argument("--state", choices=["PENDING", "LEASED", "ACKED", "EXHAUSTED"])
    p.set_defaults(func=cmd_deliveries, json=False)

    p = subs.add_parser("budget", parents=[common], help="add attempts to a delivery")
    p.add_argument("id", help="delivery id")
    p.add_argument("--add", type=int, required=True)
    p.add_argument("--idempotency-key", help="a retried request then adds the budget once")
    p.set_defaults(func=cmd_budget, json=False)

    add_delete(subs, "subscription", "subscriptions", note="its deliveries stay")
