"""``orbit``: the operator CLI.

    orbit admin bootstrap --application NAME --namespace NAME [--global-admin] [--rotate] [--dsn DSN]
    orbit whoami | applications ... | namespaces ... | credentials ... | resources ...
    orbit tasks ... | queues ... | schedules ...     (added by their packages' modules)

``admin`` works directly on the database (``--dsn`` / ``$ORBIT_DSN``); every other command
talks HTTP to ``$ORBIT_URL`` with ``$ORBIT_KEY`` (or ``--url``/``--key``), prints a table,
or JSON with ``--json``. Exit codes: see :mod:`orbit_cmd.cli_http` (0 ok, 1 API error,
2 usage, 3 unreachable); 141 when the reader of the output went away (``orbit … | head``:
no traceback, like any Unix tool).

Extending: a module listed in COMMAND_MODULES exposes ``register(subparsers)`` and sets
``func(args) -> int`` on each command parser. Modules not present yet are skipped.
"""

from __future__ import annotations

import argparse
import importlib
import os
import sys
from collections.abc import Sequence

from orbit_cmd.cli_http import EXIT_USAGE, CliError

#: Command modules, in help order. Each exposes ``register(subparsers)``.
COMMAND_MODULES: tuple[str, ...] = (
    "orbit_cmd.cli_platform",
    "orbit_cmd.cli_subscriptions",
    "orbit_cmd.cli_tasks",
    "orbit_cmd.cli_queues",
    "orbit_cmd.cli_schedules",
    "orbit_cmd.cli_workflows",
    "orbit_cmd.cli_events",
    "orbit_cmd.cli_workers",
    "orbit_cmd.cli_audit",
    "orbit_cmd.cli_retention",
    "orbit_cmd.cli_outbox",
)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="orbit", description="Orbit operator CLI.")
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    for name in COMMAND_MODULES:
        try:
            mod = importlib.import_module(name)
        except ModuleNotFoundError as exc:
            if exc.name == name:
                continue
            raise
        mod.register(sub)
    return parser


#: Exit code when the reader of our output went away (``orbit tasks list | head``): 128 +
#: SIGPIPE, what a Unix tool killed by the signal reports.
EXIT_PIPE_CLOSED = 141


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    try:
        return int(args.func(args))
    except CliError as exc:
        print(f"orbit: {exc.message}", file=sys.stderr)
        return exc.code
    except KeyboardInterrupt:
        return EXIT_USAGE
    except BrokenPipeError:
        return _stdout_closed()


def _stdout_closed() -> int:
    """The output pipe closed under us: stop quietly. Whatever is still buffered for stdout
    goes to /dev/null, so the interpreter's final flush raises nothing either."""
    devnull = os.open(os.devnull, os.O_WRONLY)
    os.dup2(devnull, sys.stdout.fileno())
    os.close(devnull)
    return EXIT_PIPE_CLOSED


if __name__ == "__main__":
    sys.exit(main())
