"""Statements over the rows of several namespaces, each with its namespace predicate.

A node round (one transaction for everything of one stage that arrived at this node) reads
and writes rows of many namespaces with one statement. Every such statement still names the
namespace of every row it touches: its predicate is one group per namespace,

    ((namespace_id = %s AND id IN (%s, %s)) OR (namespace_id = %s AND id IN (%s)))

sorted by namespace, ids sorted within each group, so a locking read over a primary key
``(namespace_id, id)`` walks — and locks — the rows in key order. Never a row-constructor
list ``(namespace_id, id) IN ((…), (…))``: MariaDB plans it 4–5× slower than the groups.

Named queries mark where the predicate goes with a comment holding the two columns::

    SELECT … FROM pulse_tasks t WHERE /*keys t.namespace_id t.id*/ ORDER BY … FOR UPDATE

and use positional ``%s`` parameters only (the predicate's are positional). :func:`expand`
fills the marker in; :class:`KeySet` holds the keys.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Iterator, Mapping, Sequence
from typing import Any

_MARKER = re.compile(r"/\*keys\s+([\w.]+)\s+([\w.]+)\s*\*/")


class KeySet:
    """Row keys grouped by namespace: ``namespace_id → ids`` (both bytes), in key order."""

    __slots__ = ("_groups",)

    def __init__(self, pairs: Iterable[tuple[bytes, bytes]] = ()) -> None:
        self._groups: dict[bytes, set[bytes]] = {}
        for ns, key in pairs:
            self.add(ns, key)

    @classmethod
    def of(cls, groups: Mapping[bytes, Iterable[bytes]]) -> KeySet:
        """A key set from ``namespace_id → ids``."""
        out = cls()
        for ns, ids in groups.items():
            for key in ids:
                out.add(ns, key)
        return out

    def add(self, namespace_id: bytes, key: bytes) -> None:
        self._groups.setdefault(bytes(namespace_id), set()).add(bytes(key))

    def __len__(self) -> int:
        return sum(len(ids) for ids in self._groups.values())

    def __bool__(self) -> bool:
        return bool(self._groups)

    def __iter__(self) -> Iterator[tuple[bytes, bytes]]:
        """``(namespace_id, id)`` in key order."""
        for ns in sorted(self._groups):
            for key in sorted(self._groups[ns]):
                yield ns, key

    def namespaces(self) -> list[bytes]:
        return sorted(self._groups)

    def ids(self, namespace_id: bytes) -> list[bytes]:
        return sorted(self._groups.get(namespace_id, ()))

    def predicate(self, ns_column: str = "namespace_id", id_column: str = "id") -> tuple[str, list[Any]]:
        """The SQL predicate (one group per namespace, OR-ed) and its positional arguments."""
        if not self._groups:
            return "FALSE", []
        parts: list[str] = []
        args: list[Any] = []
        for ns in sorted(self._groups):
            ids = sorted(self._groups[ns])
            parts.append(
                f"({ns_column} = %s AND {id_column} IN (" + ", ".join(["%s"] * len(ids)) + "))"
            )
            args.append(ns)
            args += ids
        return "(" + " OR ".join(parts) + ")", args


def expand(sql: str, keys: KeySet, *before: Any, after: Sequence[Any] = ()) -> tuple[str, list[Any]]:
    """``sql`` with its ``/*keys ns_col id_col*/`` marker replaced by the key set's predicate;
    the arguments: ``before`` (parameters that come before the marker in the text), the
    predicate's, then ``after``."""
    m = _MARKER.search(sql)
    if m is None:
        raise ValueError("the statement has no /*keys …*/ marker")
    text, args = keys.predicate(m.group(1), m.group(2))
    return sql[: m.start()] + text + sql[m.end() :], [*before, *args, *after]


def case_expr(values: Mapping[bytes, Any], id_column: str = "id") -> tuple[str, list[Any]]:
    """``CASE id WHEN %s THEN %s … END`` (each row's own value, by id: ids are random
    128-bit values, unique across namespaces); ``%s`` when every row has the same value."""
    distinct = {_hashable(v) for v in values.values()}
    if len(distinct) == 1:
        return "%s", [next(iter(values.values()))]
    args: list[Any] = []
    for key in sorted(values):
        args += [key, values[key]]
    return f"CASE {id_column}" + " WHEN %s THEN %s" * len(values) + " END", args


def case_by_id(column: str, values: Mapping[bytes, Any], id_column: str = "id") -> tuple[str, list[Any]]:
    """``column = <case_expr>``: a SET item giving each row its own value."""
    expr, args = case_expr(values, id_column)
    return f"{column} = {expr}", args


def guard_by_id(column: str, values: Mapping[bytes, Any], id_column: str = "id") -> tuple[str, list[Any]]:
    """``column = CASE id WHEN %s THEN %s … END``: a per-row guard in a WHERE clause (always
    the full CASE, so a row can only match its own expected value)."""
    args: list[Any] = []
    for key in sorted(values):
        args += [key, values[key]]
    return f"{column} = CASE {id_column}" + " WHEN %s THEN %s" * len(values) + " END", args


def _hashable(value: Any) -> Any:
    return (type(value), value) if not isinstance(value, list | dict) else repr(value)


__all__ = ["KeySet", "case_by_id", "case_expr", "expand", "guard_by_id"]
