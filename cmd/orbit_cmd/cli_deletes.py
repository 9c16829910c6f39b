"""The ``delete`` command of the resource groups (``orbit queues|schedules|subscriptions|
workflows delete NAME``): one ``DELETE`` of the resource, with ``--if-match`` where the
resource has a revision. A refused delete (409: a queue still held by tasks, schedules or
sessions; a workflow with running instances) exits 1 with the server's message, which names
what holds it."""

from __future__ import annotations

import argparse

from orbit_cmd.cli_common import api_for, if_match, ns_options, ns_path, seg
from orbit_cmd.cli_http import EXIT_OK


def add_delete(
    group: argparse._SubParsersAction[argparse.ArgumentParser],
    resource: str,
    collection: str,
    *,
    conditional: bool = True,
    note: str = "its history stays",
) -> None:
    """Add ``delete NAME`` to ``group``: ``DELETE /v1/namespaces/{ns}/<collection>/NAME``."""
    p = group.add_parser(
        "delete", parents=[ns_options()], help=f"delete a {resource} ({note})"
    )
    p.add_argument("name")
    if conditional:
        p.add_argument("--if-match", type=int, metavar="REV", help="only if the revision is REV")

    def run(args: argparse.Namespace) -> int:
        api = api_for(args)
        api.request(
            "DELETE", ns_path(args, api, f"/{collection}/{seg(args.name)}"), headers=if_match(args)
        )
        if args.json:
            print('{"deleted": true}')
        else:
            print(f"{resource} {args.name} deleted ({note})")
        return EXIT_OK

    p.set_defaults(func=run, json=False)
