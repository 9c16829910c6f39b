"""Multi-row INSERT text built from SQL literals, for the bulk write paths (batch submit).

The driver escapes every parameter of every row one call at a time (``executemany`` with
1000 rows × 24 columns was most of a batch submit's CPU). Most values of a batch repeat
(namespace, owner, queue, times, retry policy, payloads), so :class:`Literals` renders each
distinct value once per statement.

Literals are independent of the session's ``sql_mode``: a string is quoted with doubled
quotes only when it holds no backslash, NUL or Ctrl-Z (the same text under
``NO_BACKSLASH_ESCAPES`` or not); otherwise, and for bytes, it is a hex literal
(``_utf8mb4 X'…'`` for text, ``X'…'`` for binary). The connection's character set is
utf8mb4 (orbit/storage/_aiomysql.py), the query text is sent in it.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from datetime import datetime
from typing import Any


class Literals:
    """SQL literal of a Python value, memoised for one statement."""

    __slots__ = ("_memo",)

    def __init__(self) -> None:
        self._memo: dict[tuple[type, Any], str] = {}

    def __call__(self, value: Any) -> str:
        if value is None:
            return "NULL"
        if isinstance(value, bytes | bytearray | memoryview):
            return "X'" + bytes(value).hex() + "'"
        key = (type(value), value)
        out = self._memo.get(key)
        if out is None:
            out = self._memo[key] = literal(value)
        return out


def literal(value: Any) -> str:
    """One value as SQL text (None, bool, int, float, str, bytes, naive datetime)."""
    if value is None:
        return "NULL"
    if isinstance(value, bool):
        return "1" if value else "0"
    if isinstance(value, int):
        return str(value)
    if isinstance(value, float):
        text = repr(value)
        if text in ("inf", "-inf", "nan"):
            raise ValueError(f"{text} is not a SQL number")
        return text if "e" in text else text + "e0"
    if isinstance(value, str):
        if "\\" in value or "\x00" in value or "\x1a" in value:
            return "_utf8mb4 X'" + value.encode("utf-8").hex() + "'"
        return "'" + value.replace("'", "''") + "'"
    if isinstance(value, bytes | bytearray | memoryview):
        return "X'" + bytes(value).hex() + "'"
    if isinstance(value, datetime):
        if value.tzinfo is not None:
            raise ValueError("stored times are naive UTC")
        return f"'{value.isoformat(' ', 'microseconds')}'"
    raise TypeError(f"no SQL literal for {type(value).__name__}")


def insert_values(head: str, columns: Sequence[str], rows: Sequence[Mapping[str, Any]]) -> str:
    """``head`` (``INSERT INTO t (c1, …) VALUES``) followed by one literal tuple per row,
    the values taken from each row by ``columns`` (in that order).

    Rendered column by column, each distinct value of a column once (ids are unique, most
    other columns of a batch hold one or a few values)."""
    rendered: list[list[str]] = []
    for c in columns:
        memo: dict[tuple[type, Any], str] = {}
        out: list[str] = []
        append = out.append
        for row in rows:
            v = row[c]
            key = (v.__class__, v)
            text = memo.get(key)
            if text is None:
                text = memo[key] = literal(v)
            append(text)
        rendered.append(out)
    tuples = ["(" + ", ".join(t) + ")" for t in zip(*rendered, strict=True)]
    return head + "\n" + ",\n".join(tuples)


__all__ = ["Literals", "insert_values", "literal"]
