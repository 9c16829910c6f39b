"""Shared plumbing of the ``orbit`` CLI's HTTP commands: the client, errors, output.

Command modules (``cli_platform``, later ``cli_tasks``, ``cli_queues``…) use:

* :func:`client(args)` → :class:`ApiClient` (``--url``/``$ORBIT_URL``, ``--key``/``$ORBIT_KEY``)
* :func:`emit(args, obj, columns)` → JSON (``--json``) or a human table on stdout
* raise :class:`CliError` for a clean message and exit code

Exit codes: 0 success; 1 the API answered an error (its code and message on stderr);
2 usage error (bad arguments, missing ``ORBIT_URL``/``ORBIT_KEY``); 3 the server (or, for
``orbit admin``, the database) could not be reached.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Sequence
from typing import Any

EXIT_OK = 0
EXIT_API_ERROR = 1
EXIT_USAGE = 2
EXIT_UNAVAILABLE = 3


class CliError(Exception):
    """A failure to report on stderr with an exit code."""

    def __init__(self, message: str, code: int = EXIT_API_ERROR, body: Any = None) -> None:
        super().__init__(message)
        self.message = message
        self.code = code
        self.body = body


def common_options() -> argparse.ArgumentParser:
    """Options every HTTP command accepts (before or after the command words)."""
    p = argparse.ArgumentParser(add_help=False)
    p.add_argument("--url", default=argparse.SUPPRESS, help="server URL (default $ORBIT_URL)")
    p.add_argument("--key", default=argparse.SUPPRESS, help="API key (default $ORBIT_KEY)")
    p.add_argument("--json", action="store_true", default=argparse.SUPPRESS, help="print JSON")
    return p


class Answer:
    """A response: status, headers (lower-case names) and body bytes."""

    def __init__(self, status: int, headers: dict[str, str], content: bytes) -> None:
        self.status_code = status
        self.headers = headers
        self.content = content

    def json(self) -> Any:
        return json.loads(self.content)


class ApiClient:
    """A small synchronous client of the Orbit HTTP API (stdlib only: starts fast)."""

    def __init__(self, url: str, key: str, timeout: float = 30.0) -> None:
        self.base_url = url.rstrip("/")
        self.headers = {"Authorization": f"Bearer {key}", "User-Agent": "orbit-cli"}
        self.timeout = timeout

    def request(
        self,
        method: str,
        path: str,
        *,
        json_body: Any = None,
        params: dict[str, Any] | None = None,
        headers: dict[str, str] | None = None,
        content: bytes | None = None,
    ) -> Answer:
        """Send one request; raise CliError for an error answer or no connection.

        ``content`` sends pre-encoded JSON bytes as they are (e.g. a payload kept byte-exact)
        instead of encoding ``json_body``."""
        query = urllib.parse.urlencode({k: v for k, v in (params or {}).items() if v is not None})
        url = self.base_url + path + (f"?{query}" if query else "")
        data = content
        if data is None and json_body is not None:
            data = json.dumps(json_body).encode()
        h = {**self.headers, **(headers or {})}
        if data is not None:
            h["Content-Type"] = "application/json"
        req = urllib.request.Request(url, data=data, headers=h, method=method)
        try:
            with urllib.request.urlopen(req, timeout=self.timeout) as resp:
                answer = Answer(
                    resp.status, {k.lower(): v for k, v in resp.headers.items()}, resp.read()
                )
        except urllib.error.HTTPError as exc:
            answer = Answer(exc.code, {k.lower(): v for k, v in exc.headers.items()}, exc.read())
        except (urllib.error.URLError, OSError) as exc:
            raise CliError(f"cannot reach {self.base_url}: {exc}", EXIT_UNAVAILABLE) from None
        if answer.status_code >= 400:
            try:
                body = answer.json()
                err = body.get("error", {})
                msg = f"{answer.status_code} {err.get('code', 'error')}: {err.get('message', '')}"
                if err.get("details"):
                    msg += f" {json.dumps(err['details'])}"
            except ValueError:
                body, msg = None, f"{answer.status_code}: {answer.content[:200]!r}"
            raise CliError(msg, EXIT_API_ERROR, body)
        return answer

    def json(self, method: str, path: str, **kw: Any) -> Any:
        answer = self.request(method, path, **kw)
        return answer.json() if answer.content else None

    def paged(
        self, path: str, params: dict[str, Any] | None = None, limit: int | None = None
    ) -> list[Any]:
        """Every item of a list route (following ``next_cursor``), up to ``limit`` items."""
        items: list[Any] = []
        cursor = None
        while True:
            page = self.json("GET", path, params={**(params or {}), "cursor": cursor, "limit": 500})
            items.extend(page["items"])
            cursor = page.get("next_cursor")
            if not cursor or (limit is not None and len(items) >= limit):
                return items[:limit] if limit is not None else items


def client(args: argparse.Namespace) -> ApiClient:
    url = getattr(args, "url", None) or os.environ.get("ORBIT_URL")
    key = getattr(args, "key", None) or os.environ.get("ORBIT_KEY")
    if not url:
        raise CliError("set ORBIT_URL (or pass --url)", EXIT_USAGE)
    if not key:
        raise CliError("set ORBIT_KEY (or pass --key)", EXIT_USAGE)
    return ApiClient(url, key)


def _cell(value: Any) -> str:
    if value is None:
        return "-"
    if isinstance(value, bool):
        return "yes" if value else "no"
    if isinstance(value, (list, tuple)):
        return ",".join(_cell(v) for v in value) or "-"
    if isinstance(value, dict):
        return json.dumps(value, separators=(",", ":"))
    return str(value)


def table(rows: Sequence[dict[str, Any]], columns: Sequence[str]) -> str:
    """A plain text table with a header row."""
    cells = [[_cell(r.get(c)) for c in columns] for r in rows]
    widths = [max([len(c), *(len(row[i]) for row in cells)]) for i, c in enumerate(columns)]
    lines = ["  ".join(c.upper().ljust(w) for c, w in zip(columns, widths, strict=True)).rstrip()]
    lines += [
        "  ".join(v.ljust(w) for v, w in zip(row, widths, strict=True)).rstrip() for row in cells
    ]
    return "\n".join(lines)


def emit(args: argparse.Namespace, obj: Any, columns: Sequence[str] | None = None) -> None:
    """Print ``obj``: JSON with ``--json``; else a table (lists) or ``key: value`` lines."""
    if getattr(args, "json", False):
        print(json.dumps(obj, separators=(",", ":")))
    elif isinstance(obj, list):
        print(table(obj, columns or (sorted(obj[0]) if obj else ["id"])))
    elif isinstance(obj, dict):
        keys = columns or list(obj)
        width = max((len(k) for k in keys), default=0)
        for k in keys:
            print(f"{k.ljust(width)}  {_cell(obj.get(k))}")
    else:
        print(obj)
    sys.stdout.flush()
