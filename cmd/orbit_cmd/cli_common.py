"""Helpers shared by the namespaced ``orbit`` command groups (tasks, queues, schedules,
workflows, subscriptions, events).

* :func:`ns_options` — the parent parser: ``--url``, ``--key``, ``--json`` and
  ``--namespace``/``-n`` (default ``$ORBIT_NAMESPACE``, else the key's only namespace).
* :func:`ns_path` — ``/v1/namespaces/{ns}`` + suffix, every segment URL-quoted.
* :func:`json_text` / :func:`splice` — business JSON (payloads, results, inputs) read from an
  option, a file or stdin and sent **byte for byte** (never re-encoded, so ``1.50`` stays
  ``1.50``).
* :func:`show` / :func:`show_page` / :func:`fetch_pages` — output: the server's exact JSON
  with ``--json``, a table or ``key  value`` lines otherwise.
* :class:`Progress` / :class:`Spinner` — progress on stderr, only when stderr is a terminal.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import threading
import time
import urllib.parse
from collections.abc import Callable, Sequence
from typing import Any, TextIO

import msgspec

from orbit_cmd.cli_http import (
    EXIT_USAGE,
    Answer,
    ApiClient,
    CliError,
    client,
    common_options,
    emit,
    table,
)

__all__ = [
    "Progress",
    "Spinner",
    "api_for",
    "fetch_pages",
    "if_match",
    "json_text",
    "list_options",
    "ns_options",
    "ns_path",
    "seg",
    "show",
    "show_page",
    "splice",
]


def ns_options() -> argparse.ArgumentParser:
    """Common options plus ``--namespace`` (before or after the command words)."""
    p = argparse.ArgumentParser(add_help=False, parents=[common_options()])
    p.add_argument(
        "-n",
        "--namespace",
        default=argparse.SUPPRESS,
        help="namespace name (default $ORBIT_NAMESPACE, else the key's only namespace)",
    )
    return p


def list_options() -> argparse.ArgumentParser:
    """``--limit``, ``--cursor``, ``--all`` of list commands."""
    p = argparse.ArgumentParser(add_help=False)
    p.add_argument("--limit", type=int, default=50, help="page size, 1-500 (default 50)")
    p.add_argument("--cursor", help="next_cursor of a previous page")
    p.add_argument("--all", action="store_true", help="follow next_cursor to the end")
    return p


def seg(text: str) -> str:
    """One URL path segment."""
    return urllib.parse.quote(text, safe="")


def api_for(args: argparse.Namespace) -> ApiClient:
    """The HTTP client; ``--timeout`` (when the command has it) replaces the 30 s default."""
    api = client(args)
    timeout = getattr(args, "timeout", None)
    if timeout:
        api.timeout = float(timeout)
    return api


def namespace(args: argparse.Namespace, api: ApiClient) -> str:
    """``--namespace``, ``$ORBIT_NAMESPACE``, or the key's only namespace (one request)."""
    ns = getattr(args, "namespace", None) or os.environ.get("ORBIT_NAMESPACE")
    if ns:
        return str(ns)
    names = api.json("GET", "/v1/whoami").get("namespaces", [])
    if len(names) == 1 and names[0] != "*":
        args.namespace = names[0]
        return str(names[0])
    raise CliError(
        "this key may use several namespaces: pass --namespace (or set ORBIT_NAMESPACE)",
        EXIT_USAGE,
    )


def ns_path(args: argparse.Namespace, api: ApiClient, suffix: str = "") -> str:
    return f"/v1/namespaces/{seg(namespace(args, api))}{suffix}"


def if_match(args: argparse.Namespace) -> dict[str, str] | None:
    """``If-Match`` from ``--if-match REV``, ``If-None-Match: *`` from ``--create-only``."""
    headers: dict[str, str] = {}
    if getattr(args, "if_match", None) is not None:
        headers["If-Match"] = f'"{args.if_match}"'
    if getattr(args, "create_only", False):
        headers["If-None-Match"] = "*"
    return headers or None


def idempotency(args: argparse.Namespace) -> dict[str, str] | None:
    key = getattr(args, "idempotency_key", None)
    return {"Idempotency-Key": key} if key else None


# --------------------------------------------------------------------------- business JSON


def json_text(text: str | None, path: str | None, what: str) -> str | None:
    """Exact JSON text from ``--<what> JSON`` or ``--<what>-file PATH`` (``-`` = stdin);
    None when neither is given. Invalid JSON is a usage error (exit 2)."""
    if text is not None and path is not None:
        raise CliError(f"give --{what} or --{what}-file, not both", EXIT_USAGE)
    if path is not None:
        try:
            if path == "-":
                text = sys.stdin.read()
            else:
                with open(path, encoding="utf-8") as f:
                    text = f.read()
        except OSError as exc:
            raise CliError(f"cannot read {path}: {exc}", EXIT_USAGE) from None
    if text is None:
        return None
    text = text.strip()
    try:
        json.loads(text)
    except ValueError as exc:
        raise CliError(f"--{what} is not valid JSON: {exc}", EXIT_USAGE) from None
    return text


def splice(fields: dict[str, Any], raw: dict[str, str | None]) -> bytes:
    """A JSON object of ``fields`` (encoded) plus ``raw`` members whose values are exact JSON
    texts (None values are left out), without re-encoding those texts."""
    parts = [json.dumps(k) + ":" + json.dumps(v) for k, v in fields.items() if v is not None]
    parts += [json.dumps(k) + ":" + v for k, v in raw.items() if v is not None]
    return ("{" + ",".join(parts) + "}").encode()


# --------------------------------------------------------------------------- output


class _RawPage(msgspec.Struct):
    items: list[msgspec.Raw] = msgspec.field(default_factory=list)
    next_cursor: str | None = None


def _print_bytes(data: bytes) -> None:
    sys.stdout.write(data.decode().strip() + "\n")
    sys.stdout.flush()


def show(
    args: argparse.Namespace,
    answer: Answer,
    columns: Sequence[str] | None = None,
    render: Callable[[Any], Any] | None = None,
) -> None:
    """Print one answer: its exact body with ``--json``; else ``render(obj)`` (or the object)
    as ``key  value`` lines (``columns`` first) or a table."""
    if getattr(args, "json", False):
        _print_bytes(answer.content)
        return
    obj = answer.json() if answer.content else {}
    emit(args, render(obj) if render else obj, columns)


def fetch_pages(
    args: argparse.Namespace,
    api: ApiClient,
    path: str,
    params: dict[str, Any],
    *,
    items_key: str = "items",
) -> tuple[list[bytes], str | None]:
    """One page (``--limit``/``--cursor``) or, with ``--all``, every page (500 a time,
    counted on stderr when it is a terminal). Items are returned as exact JSON bytes."""
    limit = 500 if args.all else args.limit
    cursor = args.cursor
    items: list[bytes] = []
    progress = Progress("fetching", None) if args.all else None
    try:
        while True:
            answer = api.request("GET", path, params={**params, "limit": limit, "cursor": cursor})
            if items_key == "items":
                page = msgspec.json.decode(answer.content, type=_RawPage)
                raws, cursor = page.items, page.next_cursor
            else:
                doc = msgspec.json.decode(answer.content, type=dict[str, msgspec.Raw])
                raws = msgspec.json.decode(doc.get(items_key, b"[]"), type=list[msgspec.Raw])
                cursor = msgspec.json.decode(doc.get("next_cursor", b"null"))
            items.extend(bytes(r) for r in raws)
            if progress:
                progress.update(len(items))
            if not args.all or not cursor:
                return items, cursor
    finally:
        if progress:
            progress.close()


def show_page(
    args: argparse.Namespace,
    items: list[bytes],
    cursor: str | None,
    columns: Sequence[str],
    render: Callable[[dict[str, Any]], dict[str, Any]] | None = None,
) -> None:
    """``{"items": [...], "next_cursor"}`` (exact item bytes) with ``--json``; else a table,
    and the next cursor on stderr when there is more."""
    if getattr(args, "json", False):
        body = b'{"items":[' + b",".join(items) + b'],"next_cursor":'
        _print_bytes(body + json.dumps(cursor).encode() + b"}")
        return
    rows = [json.loads(i) for i in items]
    if render:
        rows = [render(r) for r in rows]
    print(table(rows, columns))
    sys.stdout.flush()
    if cursor:
        print(f"(more: --cursor {cursor} or --all)", file=sys.stderr)


# --------------------------------------------------------------------------- progress


class Progress:
    """A one-line progress bar on stderr, drawn only when stderr is a terminal.

    ``total=None`` shows a running count instead of a bar. Redraws at most 10 times a second.
    """

    def __init__(self, label: str, total: int | None, stream: TextIO | None = None) -> None:
        self.label = label
        self.total = total
        self.stream = stream or sys.stderr
        self.enabled = self.stream.isatty()
        self.done = 0
        self.started = time.monotonic()
        self._drawn = 0.0

    def update(self, done: int, *, force: bool = False) -> None:
        self.done = done
        now = time.monotonic()
        if not self.enabled or (not force and now - self._drawn < 0.1):
            return
        self._drawn = now
        rate = done / max(now - self.started, 1e-6)
        if self.total:
            frac = min(done / self.total, 1.0)
            bar = "#" * int(frac * 30)
            text = f"{self.label} [{bar:<30}] {frac:4.0%} {done}/{self.total} {rate:,.0f}/s"
        else:
            text = f"{self.label} {done} ({rate:,.0f}/s)"
        self.stream.write("\r\x1b[2K" + text)
        self.stream.flush()

    def close(self) -> None:
        if self.enabled:
            self.update(self.done, force=True)
            self.stream.write("\n")
            self.stream.flush()


class Spinner:
    """An elapsed-time spinner on stderr (terminal only) while one long request runs."""

    FRAMES = "|/-\\"

    def __init__(self, label: str, stream: TextIO | None = None) -> None:
        self.label = label
        self.stream = stream or sys.stderr
        self.enabled = self.stream.isatty()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def _run(self) -> None:
        started, i = time.monotonic(), 0
        while not self._stop.wait(0.1):
            elapsed = time.monotonic() - started
            self.stream.write(f"\r\x1b[2K{self.label} {self.FRAMES[i % 4]} {elapsed:.1f}s")
            self.stream.flush()
            i += 1

    def __enter__(self) -> Spinner:
        if self.enabled:
            self._thread = threading.Thread(target=self._run, daemon=True)
            self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        if self._thread is not None:
            self._stop.set()
            self._thread.join()
            self.stream.write("\r\x1b[2K")
            self.stream.flush()
