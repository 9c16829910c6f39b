"""Named SQL queries loaded once from ``.sql`` files.

A file holds blocks introduced by ``-- name: <query_name>``; everything up to the next
``-- name:`` line is the query (trailing ``;`` dropped). Queries use pyformat parameters
(``%(name)s``). Names follow aggregate_verb[_guard], e.g. ``attempt_finish_if_running``.
"""

from __future__ import annotations

import re
from pathlib import Path

_NAME_RE = re.compile(r"^--\s*name:\s*([a-z0-9_]+)\s*$", re.MULTILINE)


class Queries(dict[str, str]):
    """Mapping of query name to SQL text, also readable as attributes."""

    def __getattr__(self, name: str) -> str:
        try:
            return self[name]
        except KeyError:
            raise AttributeError(f"no SQL query named {name!r}") from None


def parse_queries(text: str, source: str = "<sql>") -> Queries:
    """Split a .sql text into named queries; duplicate names are an error."""
    queries = Queries()
    matches = list(_NAME_RE.finditer(text))
    for i, m in enumerate(matches):
        end = matches[i + 1].start() if i + 1 < len(matches) else len(text)
        body = text[m.end() : end].strip()
        while body.endswith(";"):
            body = body[:-1].rstrip()
        if m.group(1) in queries:
            raise ValueError(f"{source}: query {m.group(1)!r} defined twice")
        if not body:
            raise ValueError(f"{source}: query {m.group(1)!r} is empty")
        queries[m.group(1)] = body
    return queries


def load_queries(package_file: str, name: str) -> Queries:
    """Load ``sql/<name>.sql`` next to the calling module's package (pass ``__file__``)."""
    base = Path(package_file).resolve().parent
    for candidate in (base / "sql" / f"{name}.sql", base.parent / "sql" / f"{name}.sql"):
        if candidate.exists():
            return parse_queries(candidate.read_text(encoding="utf-8"), str(candidate))
    raise FileNotFoundError(f"sql/{name}.sql not found near {base}")
