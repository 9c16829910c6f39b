"""``orbit workflows | instances | signals ...``: publish a workflow version from a file,
read workflows and versions; start, read, list, page through the history of, pause, resume
and cancel instances; send signals. Routes: docs/api/workflows.md.

Definitions, inputs and signal payloads are sent byte for byte as written in their files.
"""

from __future__ import annotations

import argparse
from typing import Any

import msgspec

from orbit_cmd.cli_common import (
    api_for,
    fetch_pages,
    idempotency,
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
from orbit_cmd.cli_http import EXIT_OK, emit

VERSION_COLUMNS = ["version", "digest", "step_count", "language_version", "created_at"]
WORKFLOW_FIELDS = ["name", "latest_version", "id", "owner_id", "created_at", "updated_at"]
INSTANCE_FIELDS = [
    "id", "workflow", "version", "state", "paused", "business_key", "input", "output", "error",
    "owner_id", "control_revision", "created_at", "updated_at", "finished_at",
]  # fmt: skip
INSTANCE_COLUMNS = ["id", "workflow", "version", "state", "paused", "business_key", "created_at"]
STEP_COLUMNS = ["seq", "step", "type", "state", "activations", "next_step", "output", "error"]
HISTORY_COLUMNS = ["seq", "entry", "step", "type", "kind", "state", "at", "task_id", "signal"]


# --------------------------------------------------------------------------- workflows


def cmd_publish(args: argparse.Namespace) -> int:
    api = api_for(args)
    definition = json_text(None, args.file, "file")
    assert definition is not None  # --file is required
    answer = api.request(
        "POST",
        ns_path(args, api, f"/workflows/{seg(args.name)}/versions"),
        content=splice({}, {"definition": definition}),
        headers=idempotency(args),
    )
    show(args, answer, ["name", "version", "unchanged", "digest", "step_count", "created_at"])
    return EXIT_OK


def cmd_workflow_get(args: argparse.Namespace) -> int:
    api = api_for(args)
    path = ns_path(args, api, f"/workflows/{seg(args.name)}")
    if args.version is not None:
        answer = api.request("GET", f"{path}/versions/{args.version}")
        if args.definition:
            doc = msgspec.json.decode(answer.content, type=dict[str, msgspec.Raw])
            print(bytes(doc["definition"]).decode())
            return EXIT_OK
        show(args, answer, [*VERSION_COLUMNS, "name", "workflow_id"])
        return EXIT_OK
    if args.json and not args.all:  # the API's answer as it is: workflow + one page
        show(args, api.request("GET", path, params={"limit": args.limit, "cursor": args.cursor}))
        return EXIT_OK
    items, cursor = fetch_pages(args, api, path, {}, items_key="versions")
    if args.json:
        show_page(args, items, cursor, VERSION_COLUMNS)
        return EXIT_OK
    emit(args, api.json("GET", path, params={"limit": 1}), WORKFLOW_FIELDS)
    print()
    show_page(args, items, cursor, VERSION_COLUMNS)
    return EXIT_OK


def cmd_workflow_list(args: argparse.Namespace) -> int:
    api = api_for(args)
    items, cursor = fetch_pages(args, api, ns_path(args, api, "/workflows"), {})
    show_page(args, items, cursor, ["name", "latest_version", "updated_at", "id"])
    return EXIT_OK


# --------------------------------------------------------------------------- instances


def cmd_start(args: argparse.Namespace) -> int:
    api = api_for(args)
    data = json_text(args.input, args.input_file, "input")
    answer = api.request(
        "POST",
        ns_path(args, api, f"/workflows/{seg(args.workflow)}/instances"),
        content=splice(
            {"version": args.version, "business_key": args.business_key}, {"input": data}
        ),
        headers=idempotency(args),
    )
    show(args, answer, [*INSTANCE_FIELDS[:6], "deduplicated"])
    return EXIT_OK


def cmd_instance_get(args: argparse.Namespace) -> int:
    api = api_for(args)
    answer = api.request("GET", ns_path(args, api, f"/instances/{seg(args.id)}"))
    if args.json:
        show(args, answer)
        return EXIT_OK
    doc = answer.json()
    emit(args, doc, INSTANCE_FIELDS)
    if doc.get("steps"):
        print()
        emit(args, doc["steps"], STEP_COLUMNS)
    return EXIT_OK


def cmd_history(args: argparse.Namespace) -> int:
    api = api_for(args)
    path = ns_path(args, api, f"/instances/{seg(args.id)}/history")
    if args.json and not args.all:
        show(args, api.request("GET", path, params={"limit": args.limit, "cursor": args.cursor}))
        return EXIT_OK
    items, cursor = fetch_pages(args, api, path, {})
    show_page(args, items, cursor, HISTORY_COLUMNS)
    if not args.json:
        doc = api.json("GET", path, params={"limit": 1})
        if doc.get("transitions"):
            print()
            emit(args, doc["transitions"], ["at", "step", "outcome", "to"])
        if doc.get("signals"):
            print()
            emit(args, doc["signals"], ["received_at", "name", "signal_id", "correlation_key",
                                        "matched_wait_id"])  # fmt: skip
    return EXIT_OK


def cmd_instance_list(args: argparse.Namespace) -> int:
    api = api_for(args)
    params = {"workflow": args.workflow, "state": args.state}
    items, cursor = fetch_pages(args, api, ns_path(args, api, "/instances"), params)
    show_page(args, items, cursor, INSTANCE_COLUMNS)
    return EXIT_OK


def cmd_control(args: argparse.Namespace) -> int:
    api = api_for(args)
    body: dict[str, Any] | None = {"reason": args.reason} if getattr(args, "reason", None) else None
    answer = api.request(
        "POST",
        ns_path(args, api, f"/instances/{seg(args.id)}/{args.action}"),
        json_body=body,
        headers=if_match(args),
    )
    show(args, answer, ["id", "state", "paused", "control_revision", "error"])
    return EXIT_OK


# --------------------------------------------------------------------------- signals


def cmd_signal(args: argparse.Namespace) -> int:
    api = api_for(args)
    payload = json_text(args.payload, args.payload_file, "payload")
    answer = api.request(
        "POST",
        ns_path(args, api, f"/instances/{seg(args.instance)}/signals/{seg(args.signal)}"),
        content=splice(
            {"signal_id": args.signal_id, "correlation_key": args.correlation_key},
            {"payload": payload},
        ),
        headers=idempotency(args),
    )
    show(args, answer, ["id", "instance_id", "name", "signal_id", "correlation_key",
                        "payload", "received_at"])  # fmt: skip
    return EXIT_OK


# --------------------------------------------------------------------------- parser


def register(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """``orbit workflows ...``, ``orbit instances ...``, ``orbit signals send``."""
    common = ns_options()
    wf = sub.add_parser("workflows", help="workflow definitions and versions").add_subparsers(
        dest="sub", required=True
    )
    p = wf.add_parser("publish", parents=[common], help="publish a version from a JSON file")
    p.add_argument("name")
    p.add_argument("--file", required=True, help="the definition document ('-' = stdin)")
    p.add_argument("--idempotency-key")
    p.set_defaults(func=cmd_publish, json=False)
    p = wf.add_parser("get", parents=[common, list_options()], help="a workflow and its versions")
    p.add_argument("name")
    p.add_argument("--version", type=int, help="show this version (with its definition)")
    p.add_argument("--definition", action="store_true", help="print only the definition text")
    p.set_defaults(func=cmd_workflow_get, json=False)
    p = wf.add_parser("list", parents=[common, list_options()], help="workflows by name")
    p.set_defaults(func=cmd_workflow_list, json=False)
    add_delete(
        wf, "workflow", "workflows", conditional=False,
        note="refused while instances run; versions and finished instances stay",
    )  # fmt: skip

    inst = sub.add_parser("instances", help="workflow instances").add_subparsers(
        dest="sub", required=True
    )
    p = inst.add_parser("start", parents=[common], help="start an instance")
    p.add_argument("workflow")
    p.add_argument("--input", help="JSON input, sent byte for byte")
    p.add_argument("--input-file", help="file with the JSON input ('-' = stdin)")
    p.add_argument("--version", type=int, help="default: the latest")
    p.add_argument("--business-key", help="makes the start idempotent")
    p.add_argument("--idempotency-key")
    p.set_defaults(func=cmd_start, json=False)
    p = inst.add_parser("get", parents=[common], help="state, steps, output")
    p.add_argument("id")
    p.set_defaults(func=cmd_instance_get, json=False)
    p = inst.add_parser("history", parents=[common, list_options()], help="activations, waits")
    p.add_argument("id")
    p.set_defaults(func=cmd_history, json=False)
    p = inst.add_parser("list", parents=[common, list_options()], help="instances, newest first")
    p.add_argument("--workflow")
    p.add_argument("--state", choices=["RUNNING", "SUCCEEDED", "FAILED", "CANCELLED"])
    p.set_defaults(func=cmd_instance_list, json=False)
    for action in ("pause", "resume", "cancel"):
        p = inst.add_parser(action, parents=[common], help=f"{action} an instance")
        p.add_argument("id")
        p.add_argument("--if-match", type=int, metavar="REV", help="only at this control_revision")
        if action == "cancel":
            p.add_argument("--reason")
        p.set_defaults(func=cmd_control, action=action, json=False)

    sig = sub.add_parser("signals", help="send signals to instances").add_subparsers(
        dest="sub", required=True
    )
    p = sig.add_parser("send", parents=[common], help="send a signal (de-duplicated by id)")
    p.add_argument("instance")
    p.add_argument("signal")
    p.add_argument("--signal-id", required=True, help="1-128 printable ASCII")
    p.add_argument("--payload", help="JSON payload, sent byte for byte")
    p.add_argument("--payload-file")
    p.add_argument("--correlation-key")
    p.add_argument("--idempotency-key")
    p.set_defaults(func=cmd_signal, json=False)
