"""docs/cli.md documents every `orbit` command the CLI registers (namespaced groups), and
the CLI parser builds with every command module present."""

from __future__ import annotations

import argparse
import importlib

from orbit_cmd import cli
from platform_fixtures import ROOT

GROUPS = ("tasks", "events", "queues", "schedules", "workflows", "instances", "signals",
          "subscriptions", "workers", "audit", "outbox")  # fmt: skip


def subcommands(parser: argparse.ArgumentParser) -> dict[str, argparse.ArgumentParser]:
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            return dict(action.choices)
    return {}


def test_every_command_module_loads() -> None:
    for name in cli.COMMAND_MODULES:
        assert hasattr(importlib.import_module(name), "register"), name


def test_every_command_is_documented() -> None:
    doc = (ROOT / "docs" / "cli.md").read_text()
    top = subcommands(cli.build_parser())
    missing = []
    for group in GROUPS:
        assert group in top, group
        for command in subcommands(top[group]):
            if f"orbit {group} {command}" not in doc and not _in_alternatives(doc, group, command):
                missing.append(f"orbit {group} {command}")
    assert missing == []


def _in_alternatives(doc: str, group: str, command: str) -> bool:
    """``orbit queues pause NAME | resume NAME`` documents ``resume`` too."""
    for line in doc.splitlines():
        if line.startswith(f"orbit {group} ") and f"| {command}" in line:
            return True
    return False
