"""``orbit`` commands of the platform: ``admin bootstrap`` (direct database access) and
``whoami``, ``applications``, ``namespaces``, ``credentials``, ``resources`` (over HTTP).

``--application ID`` defaults to the application of the key in ``ORBIT_KEY``.
"""

from __future__ import annotations

import argparse
import json
import sys
from typing import Any

from orbit.types import ALL_ACTIONS
from orbit_cmd.cli_common import fetch_pages, list_options, show, show_page
from orbit_cmd.cli_http import (
    EXIT_API_ERROR,
    EXIT_OK,
    EXIT_UNAVAILABLE,
    EXIT_USAGE,
    CliError,
    client,
    common_options,
)

APP_COLUMNS = ["id", "name", "status", "revision", "created_at"]
NS_COLUMNS = ["id", "name", "revision", "created_at"]
CRED_COLUMNS = [
    "id",
    "name",
    "namespaces",
    "actions",
    "queues",
    "global_admin",
    "expires_at",
    "revoked_at",
]
RES_COLUMNS = [
    "application_id", "max_unfinished_tasks", "max_active_attempts", "max_reservations",
    "max_starts_per_second", "max_subscriptions", "revision", "usage",
]  # fmt: skip


# --- admin bootstrap (database) ---------------------------------------------------------------


#: A table or column the code expects is missing (1146, 1054): the schema is not migrated.
NO_SCHEMA = (1146, 1054)


def cmd_bootstrap(args: argparse.Namespace) -> int:
    import asyncio  # imported here: the HTTP commands start faster without these

    from orbit.bootstrap import bootstrap
    from orbit.storage import DSN, Database, DatabaseError

    try:
        dsn = DSN.from_env(getattr(args, "dsn", None))
    except ValueError as exc:
        raise CliError(f"bad DSN: {exc}", EXIT_USAGE) from None

    async def run() -> dict[str, object]:
        db = await Database.connect(dsn, maxsize=2)
        try:
            result = await bootstrap(
                db, args.application, args.namespace, global_admin=args.global_admin,
                rotate=args.rotate,
            )  # fmt: skip
            if result.hint is not None:
                print(f"orbit: {result.hint}", file=sys.stderr)
            return result.to_json()
        finally:
            await db.close()

    try:
        line = asyncio.run(run())
    except DatabaseError as exc:
        if exc.code in (2002, 2003, 2006, 2013, 1045, 1049):
            raise CliError(f"cannot use the database at {dsn}: {exc}", EXIT_UNAVAILABLE) from None
        if exc.code in NO_SCHEMA:
            raise CliError(
                f"database error: {exc} (is the schema migrated? run `orbit-migrate up`)",
                EXIT_API_ERROR,
            ) from None
        raise CliError(f"database error: {exc}", EXIT_API_ERROR) from None
    print(json.dumps(line), flush=True)
    return EXIT_OK


# --- HTTP commands --------------------------------------------------------------------------


def _app_id(args: argparse.Namespace, api: Any) -> str:
    if getattr(args, "application", None):
        return str(args.application)
    return str(api.json("GET", "/v1/whoami")["application_id"])


def _idem(args: argparse.Namespace) -> dict[str, str] | None:
    key = getattr(args, "idempotency_key", None)
    return {"Idempotency-Key": key} if key else None


def cmd_whoami(args: argparse.Namespace) -> int:
    show(args, client(args).request("GET", "/v1/whoami"))
    return EXIT_OK


def cmd_app_create(args: argparse.Namespace) -> int:
    api = client(args)
    body = {"name": args.name}
    show(args, api.request("POST", "/v1/applications", json_body=body, headers=_idem(args)),
         APP_COLUMNS)  # fmt: skip
    return EXIT_OK


def _list(args: argparse.Namespace, path: str, columns: list[str]) -> int:
    """A list command: one page (``--limit``/``--cursor``) or every page (``--all``); with
    ``--json`` the server's ``{"items", "next_cursor"}`` answer, items byte for byte."""
    api = client(args)
    items, cursor = fetch_pages(args, api, path, {})
    show_page(args, items, cursor, columns)
    return EXIT_OK


def cmd_app_list(args: argparse.Namespace) -> int:
    return _list(args, "/v1/applications", APP_COLUMNS)


def cmd_app_get(args: argparse.Namespace) -> int:
    show(args, client(args).request("GET", f"/v1/applications/{args.id}"), APP_COLUMNS)
    return EXIT_OK


def cmd_ns_create(args: argparse.Namespace) -> int:
    api = client(args)
    path = f"/v1/applications/{_app_id(args, api)}/namespaces"
    body = {"name": args.name}
    show(args, api.request("POST", path, json_body=body, headers=_idem(args)), NS_COLUMNS)
    return EXIT_OK


def cmd_ns_list(args: argparse.Namespace) -> int:
    path = f"/v1/applications/{_app_id(args, client(args))}/namespaces"
    return _list(args, path, NS_COLUMNS)


def cmd_cred_create(args: argparse.Namespace) -> int:
    api = client(args)
    actions = list(ALL_ACTIONS) if args.action == ["all"] else args.action
    body: dict[str, Any] = {"name": args.name, "namespaces": args.namespace, "actions": actions}
    if args.queue:
        body["queues"] = args.queue
    if args.expires_at:
        body["expires_at"] = args.expires_at
    if args.global_admin:
        body["global_admin"] = True
    path = f"/v1/applications/{_app_id(args, api)}/credentials"
    answer = api.request("POST", path, json_body=body, headers=_idem(args))
    show(args, answer, ["id", "key", *CRED_COLUMNS[1:]])
    if not getattr(args, "json", False):
        print("(the key is shown only once: store it now)", file=sys.stderr)
    return EXIT_OK


def cmd_cred_list(args: argparse.Namespace) -> int:
    path = f"/v1/applications/{_app_id(args, client(args))}/credentials"
    return _list(args, path, CRED_COLUMNS)


def cmd_cred_revoke(args: argparse.Namespace) -> int:
    answer = client(args).request("DELETE", f"/v1/credentials/{args.id}")
    show(args, answer, ["id", "name", "revoked_at"])
    return EXIT_OK


def cmd_res_get(args: argparse.Namespace) -> int:
    api = client(args)
    show(args, api.request("GET", f"/v1/applications/{_app_id(args, api)}/resources"),
         RES_COLUMNS)  # fmt: skip
    return EXIT_OK


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


_LIMITS = (
    "max_unfinished_tasks",
    "max_active_attempts",
    "max_reservations",
    "max_starts_per_second",
    "max_subscriptions",
)


def cmd_res_set(args: argparse.Namespace) -> int:
    api = client(args)
    body = {f: getattr(args, f) for f in _LIMITS if getattr(args, f) is not _UNSET}
    if not body:
        raise CliError("nothing to set: pass at least one --max-... option", EXIT_USAGE)
    headers = {"If-Match": f'"{args.if_match}"'} if args.if_match is not None else None
    path = f"/v1/applications/{_app_id(args, api)}/resources"
    show(args, api.request("PUT", path, json_body=body, headers=headers), RES_COLUMNS)
    return EXIT_OK


_UNSET: Any = object()


def register(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """Add the platform's commands to the ``orbit`` parser."""
    common = common_options()

    admin = sub.add_parser("admin", help="direct database administration")
    admin_sub = admin.add_subparsers(dest="admin_command", required=True)
    boot = admin_sub.add_parser(
        "bootstrap",
        help="get-or-create an application and namespace and print a working key (JSON line)",
        description="Idempotent: a re-run changes nothing and leaves every key working; it "
        'prints "key": null with a hint. --rotate replaces the secret of the bootstrap key '
        "(the new key is printed once, the previous one stops working; audited).",
    )
    boot.add_argument("--application", required=True)
    boot.add_argument("--namespace", required=True)
    boot.add_argument("--global-admin", action="store_true", help="the key may create applications")
    boot.add_argument(
        "--rotate", action="store_true",
        help="replace the bootstrap key's secret and print the new key (audited)",
    )  # fmt: skip
    boot.add_argument("--dsn", default=None, help="mysql://... (default $ORBIT_DSN)")
    boot.set_defaults(func=cmd_bootstrap)

    who = sub.add_parser("whoami", parents=[common], help="what the key may do")
    who.set_defaults(func=cmd_whoami)

    apps = sub.add_parser("applications", help="applications (tenants)").add_subparsers(
        dest="sub", required=True
    )
    p = apps.add_parser("create", parents=[common], help="create an application (global admin)")
    p.add_argument("name")
    p.add_argument("--idempotency-key")
    p.set_defaults(func=cmd_app_create)
    lists = list_options()
    apps.add_parser("list", parents=[common, lists], help="list applications").set_defaults(
        func=cmd_app_list
    )
    p = apps.add_parser("get", parents=[common], help="show an application")
    p.add_argument("id")
    p.set_defaults(func=cmd_app_get)

    nss = sub.add_parser("namespaces", help="namespaces").add_subparsers(dest="sub", required=True)
    p = nss.add_parser("create", parents=[common], help="create a namespace")
    p.add_argument("name")
    p.add_argument("--application", help="application id (default: the key's)")
    p.add_argument("--idempotency-key")
    p.set_defaults(func=cmd_ns_create)
    p = nss.add_parser("list", parents=[common, lists], help="list namespaces")
    p.add_argument("--application", help="application id (default: the key's)")
    p.set_defaults(func=cmd_ns_list)

    creds = sub.add_parser("credentials", help="API keys").add_subparsers(dest="sub", required=True)
    p = creds.add_parser("create", parents=[common], help="create a key (printed once)")
    p.add_argument("--name", required=True)
    p.add_argument(
        "--namespace", action="append", required=True, help="namespace name, repeatable, or '*'"
    )
    p.add_argument("--action", action="append", required=True, help="action, repeatable, or 'all'")
    p.add_argument("--queue", action="append", help="allowed queue, repeatable (default: all)")
    p.add_argument("--expires-at", help="RFC 3339 time, e.g. 2030-01-01T00:00:00Z")
    p.add_argument("--global-admin", action="store_true")
    p.add_argument("--application", help="application id (default: the key's)")
    p.add_argument("--idempotency-key")
    p.set_defaults(func=cmd_cred_create)
    p = creds.add_parser("list", parents=[common, lists], help="list keys (never their secrets)")
    p.add_argument("--application", help="application id (default: the key's)")
    p.set_defaults(func=cmd_cred_list)
    p = creds.add_parser("revoke", parents=[common], help="revoke a key (effective immediately)")
    p.add_argument("id")
    p.set_defaults(func=cmd_cred_revoke)

    res = sub.add_parser("resources", help="application quotas and usage").add_subparsers(
        dest="sub", required=True
    )
    p = res.add_parser("get", parents=[common], help="show quotas and usage")
    p.add_argument("--application", help="application id (default: the key's)")
    p.set_defaults(func=cmd_res_get)
    p = res.add_parser("set", parents=[common], help="change quotas ('unlimited' clears one)")
    p.add_argument("--application", help="application id (default: the key's)")
    for f in _LIMITS:
        p.add_argument("--" + f.replace("_", "-"), dest=f, type=_limit, default=_UNSET)
    p.add_argument("--if-match", type=int, help="only if the config revision is this")
    p.set_defaults(func=cmd_res_set)


__all__ = ["EXIT_API_ERROR", "register"]
