"""``orbit-migrate``: apply and inspect Orbit's schema migrations (docs/migrations.md).

    orbit-migrate [--dsn DSN] [--migrations-dir DIR] up [--lock-timeout S] [--quiet]
    orbit-migrate status [--json]
    orbit-migrate repair --file NAME [--resume | --mark-applied | --accept-checksum] --confirm
    orbit-migrate grants --user NAME [--host HOST] [--apply [--password PW]]

``--dsn`` defaults to ``$ORBIT_DSN``, then ``mysql://root@127.0.0.1:3306/orbit``; the
connection options may come before or after the command.

Exit codes: 0 success (for ``status``: current and clean); 1 not current, refused or a
migration failed; 2 bad arguments, bad migrations folder or a refused repair; 3 database
unreachable, the credentials were refused, or the named lock stayed busy. Another SQL error
(e.g. a missing privilege) exits 1.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from collections.abc import Sequence
from pathlib import Path

import pymysql

from orbit.migrate import (
    DEFAULT_LOCK_TIMEOUT,
    MigrateError,
    MigrationStatus,
    RepairMode,
    apply_runtime_grants,
    default_migrations_dir,
    repair,
    runtime_grants,
    status,
    up,
)
from orbit.storage.dsn import DSN
from orbit.storage.errors import CONNECTION_ERRORS, error_code

EXIT_OK = 0
EXIT_NOT_CURRENT = 1
EXIT_USAGE = 2
EXIT_UNAVAILABLE = 3
ENV_RUNTIME_PASSWORD = "ORBIT_RUNTIME_PASSWORD"
ACCESS_DENIED = frozenset({1044, 1045, 1698})  # no access to the database / credentials refused


def _common() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(add_help=False)
    p.add_argument(
        "--dsn",
        default=argparse.SUPPRESS,
        help="mysql://USER[:PASS]@HOST[:PORT]/DB[?unix_socket=PATH] (default: $ORBIT_DSN, "
        "then mysql://root@127.0.0.1:3306/orbit)",
    )
    p.add_argument(
        "--migrations-dir",
        default=argparse.SUPPRESS,
        type=Path,
        help="folder of NNNN_name.sql files (default: $ORBIT_MIGRATIONS_DIR, the source "
        "tree's migrations/, or the installed share/orbit-server/migrations)",
    )
    return p


def build_parser() -> argparse.ArgumentParser:
    common = _common()
    parser = argparse.ArgumentParser(
        prog="orbit-migrate",
        description="Forward-only schema migrations for Orbit (docs/migrations.md).",
        parents=[common],
    )
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")

    p_up = sub.add_parser(
        "up",
        parents=[common],
        help="create the database if missing and apply pending migrations",
    )
    p_up.add_argument(
        "--lock-timeout",
        type=float,
        default=DEFAULT_LOCK_TIMEOUT,
        help="seconds to wait for another run's lock (default %(default)g)",
    )
    p_up.add_argument("--quiet", action="store_true", help="print only errors")

    p_st = sub.add_parser(
        "status", parents=[common], help="compare the database with the migrations folder"
    )
    p_st.add_argument(
        "--json",
        action="store_true",
        help='print {"current", "applied", "pending", "dirty", "foreign_keys"}',
    )

    p_rp = sub.add_parser(
        "repair",
        parents=[common],
        help="clear a dirty mark after fixing the schema by hand",
    )
    p_rp.add_argument("--file", required=True, help="the file the dirty mark names")
    how = p_rp.add_mutually_exclusive_group()
    how.add_argument(
        "--resume",
        action="store_const",
        dest="mode",
        const=RepairMode.RESUME,
        help="next `up` continues the file at the failed statement",
    )
    how.add_argument(
        "--mark-applied",
        action="store_const",
        dest="mode",
        const=RepairMode.MARK_APPLIED,
        help="record the file as applied (you completed it by hand)",
    )
    how.add_argument(
        "--accept-checksum",
        action="store_const",
        dest="mode",
        const=RepairMode.ACCEPT_CHECKSUM,
        help="record the new checksum of an applied file that was edited",
    )
    p_rp.set_defaults(mode=RepairMode.RERUN)
    p_rp.add_argument("--confirm", action="store_true", help="actually do it")
    p_rp.add_argument("--lock-timeout", type=float, default=DEFAULT_LOCK_TIMEOUT)

    p_gr = sub.add_parser(
        "grants",
        parents=[common],
        help="print (or --apply) least-privilege GRANTs for the runtime account",
    )
    p_gr.add_argument("--user", required=True, help="runtime account user name")
    p_gr.add_argument("--host", default="%", help="account host (default %(default)s)")
    p_gr.add_argument("--apply", action="store_true", help="create the account and grant")
    p_gr.add_argument(
        "--password",
        default=None,
        help=f"password for a new account (default ${ENV_RUNTIME_PASSWORD})",
    )
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of the ``orbit-migrate`` console script; returns the exit code."""
    parser = build_parser()
    args = parser.parse_args(argv)
    try:
        dsn = DSN.from_env(getattr(args, "dsn", None))
    except ValueError as exc:
        return _fail(str(exc), EXIT_USAGE)
    mdir: Path | None = getattr(args, "migrations_dir", None)
    try:
        if args.command == "up":
            return _up(dsn, mdir, args)
        if args.command == "status":
            return _status(dsn, mdir, args.json)
        if args.command == "repair":
            return _repair(dsn, mdir, args)
        return _grants(dsn, args)
    except MigrateError as exc:
        return _fail(str(exc), exc.exit_code)
    except pymysql.MySQLError as exc:
        code = error_code(exc)
        unavailable = code is None or code in CONNECTION_ERRORS or code in ACCESS_DENIED
        return _fail(
            f"database {dsn}: ({code}) {exc.args[-1]}",
            EXIT_UNAVAILABLE if unavailable else EXIT_NOT_CURRENT,
        )


def _up(dsn: DSN, mdir: Path | None, args: argparse.Namespace) -> int:
    say = None if args.quiet else _print
    result = up(dsn, mdir, lock_timeout=args.lock_timeout, progress=say)
    if not args.quiet:
        st = result.status
        if result.applied:
            print(f"schema current: {len(st.applied)} applied ({len(result.applied)} this run)")
        else:
            print(f"nothing to apply: schema current ({len(st.applied)} applied)")
        _print_warnings(st)
    return EXIT_OK


def _status(dsn: DSN, mdir: Path | None, as_json: bool) -> int:
    st = status(dsn, mdir)
    if as_json:
        print(json.dumps(st.to_json()))
        for line in st.problems():
            print(f"orbit-migrate: {line}", file=sys.stderr)
    else:
        _print_status(dsn, mdir, st)
    return EXIT_OK if st.current else EXIT_NOT_CURRENT


def _repair(dsn: DSN, mdir: Path | None, args: argparse.Namespace) -> int:
    mode: RepairMode = args.mode
    if not args.confirm:
        st = status(dsn, mdir)
        _print_status(dsn, mdir, st)
        print(f"\nwould repair {args.file} with mode {mode.value}; add --confirm to do it")
        return EXIT_USAGE
    result = repair(dsn, args.file, mode, mdir, lock_timeout=args.lock_timeout)
    print(f"repaired {result.file} ({result.mode.value})")
    _print_status(dsn, mdir, result.status)
    return EXIT_OK


def _grants(dsn: DSN, args: argparse.Namespace) -> int:
    if args.apply:
        password = (
            args.password if args.password is not None else os.environ.get(ENV_RUNTIME_PASSWORD)
        )
        plan, created = apply_runtime_grants(dsn, args.user, args.host, password)
    else:
        plan, created = runtime_grants(dsn, args.user, args.host), False
    account = f"'{plan.user}'@'{plan.host}'"
    print(
        f"-- Orbit runtime account {account} on `{plan.database}`: "
        f"DML on {len(plan.tables)} tables, SELECT on {len(plan.bookkeeping)} bookkeeping tables."
    )
    if not args.apply:
        print(
            f"-- Create the account first: CREATE USER IF NOT EXISTS {account} IDENTIFIED BY '...';"
        )
    for stmt in plan.statements:
        print(stmt + ";")
    if args.apply:
        print(
            f"-- applied: {len(plan.statements)} grants"
            + ("; account created" if created else "; account existed (password unchanged)")
        )
    return EXIT_OK


def _print(line: str) -> None:
    print(line, flush=True)


def _print_warnings(st: MigrationStatus) -> None:
    if st.unknown:
        print(
            "note: applied but not in the migrations folder (newer schema?): "
            + ", ".join(st.unknown)
        )


def _print_status(dsn: DSN, mdir: Path | None, st: MigrationStatus) -> None:
    folder = mdir if mdir is not None else default_migrations_dir()
    rows = [
        ("database", f"{dsn}" + ("" if st.database_exists else " (does not exist)")),
        ("migrations", str(folder)),
        ("applied", f"{len(st.applied)}" + (": " + ", ".join(st.applied) if st.applied else "")),
        ("pending", ", ".join(st.pending) or "none"),
        ("dirty", _dirty_text(st)),
        (
            "checksums",
            "changed: " + ", ".join(st.checksum_mismatches) if st.checksum_mismatches else "ok",
        ),
        ("foreign keys", str(st.foreign_keys)),
        ("state", "current" if st.current else "NOT current"),
    ]
    if st.resume is not None:
        rows.insert(5, ("resume", f"{st.resume.file} at statement {st.resume.statement}"))
    if st.running:
        rows.insert(5, ("running", f"an `up` run is applying {st.running}"))
    width = max(len(k) for k, _ in rows)
    for key, value in rows:
        print(f"{key:<{width}}  {value}")
    for line in st.problems():
        print(f"  - {line}")
    _print_warnings(st)


def _dirty_text(st: MigrationStatus) -> str:
    d = st.dirty
    if d is None:
        return "no"
    text = f"{d.file} statement {d.statement}/{d.statements} {d.state.value}"
    if d.error:
        text += f": ({d.error_code}) {d.error}"
    if d.statement_excerpt:
        text += f"\n{'':14}statement: {d.statement_excerpt[:200]}"
    return text


def _fail(message: str, code: int) -> int:
    print(f"orbit-migrate: error: {message}", file=sys.stderr)
    return code


if __name__ == "__main__":
    sys.exit(main())
