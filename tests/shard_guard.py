"""Shard-group guard: every transaction touches the namespaces of ONE shard group.

Sharding by namespace (docs/deployment.md, "Sharding by namespace") keeps every runtime
transaction on one shard only if no transaction writes or reads two namespaces that live on
different shards. Orbit's pipeline deliberately batches: one transaction per node round may
serve many namespaces (dispatch, acks, reports of a node). That stays single-shard as long as
those namespaces share a shard group, so the rule checked here is "one transaction → one
shard group", under a configurable shard function:

* ``ORBIT_SHARD_MAP=single`` (default): one group — what a single database or a Galera
  cluster is. Every transaction passes; the guard still records what each one touched.
* ``ORBIT_SHARD_MAP=application``: a group per application (every namespace of an
  application on the shard of its resources row — the layout docs/deployment.md proposes).
* ``ORBIT_SHARD_MAP=namespace``: a group per namespace (the strictest map).
* ``ORBIT_SHARD_MAP=hash:N``: ``N`` groups by a hash of the namespace id.

How: while the session runs, every ``Tx`` gets a cursor that records the arguments of each
statement it sends (``execute``, ``executemany``, and the ``mogrify`` of batched and
pipelined statements), so the statements of one transaction are seen with their values. A
namespace id is recognised as a 16-byte value bound to a parameter whose name contains
``namespace_id``, or the id of a namespace inserted into ``orbit_namespaces``; once known,
the id counts wherever it appears (tuples of ``(namespace_id, id)`` keys included). A
transaction whose namespaces map to two groups is a violation; the session fails at the end
with each one's statements, unless the first statement's query name is in :data:`ALLOW`.

``ORBIT_SHARD_GUARD=0`` switches it off. The sql guard (tests/sql_guard.py) loads it.
"""

from __future__ import annotations

import contextlib
import hashlib
import os
import re
from collections import Counter
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field
from typing import Any

ZERO_ID = bytes(16)
ShardFn = Callable[[bytes], str]

#: Transactions allowed to span shard groups, by the query name of a statement they run, with
#: the reason. Empty: no runtime transaction needs it.
ALLOW: dict[str, str] = {}


@dataclass
class Registry:
    """Namespace ids seen so far, with their application (when the insert was seen)."""

    application_of: dict[bytes, bytes | None] = field(default_factory=dict)

    def learn(self, sql: str, args: Any) -> None:
        if isinstance(args, dict):
            if "INSERT INTO orbit_namespaces" in sql and _is_id(args.get("id")):
                self.application_of[bytes(args["id"])] = _as_bytes(args.get("application_id"))
            for k, v in args.items():
                if "namespace_id" in k and _is_id(v) and bytes(v) != ZERO_ID:
                    self.application_of.setdefault(bytes(v), None)

    def namespaces_in(self, args: Any) -> set[bytes]:
        return {v for v in _values(args) if v in self.application_of}


def shard_function(spec: str | None, registry: Registry) -> ShardFn:
    """The shard function named by ``spec`` (see the module docstring)."""
    spec = (spec or "single").strip()
    if spec == "single":
        return lambda ns: "0"
    if spec == "namespace":
        return lambda ns: ns.hex()
    if spec == "application":
        return lambda ns: (registry.application_of.get(ns) or ns).hex()
    if spec.startswith("hash:"):
        n = int(spec.split(":", 1)[1])
        if n < 1:
            raise ValueError(f"ORBIT_SHARD_MAP={spec}: N must be >= 1")
        return lambda ns: str(int.from_bytes(hashlib.sha256(ns).digest()[:8], "big") % n)
    raise ValueError(f"unknown ORBIT_SHARD_MAP {spec!r} (single, application, namespace, hash:N)")


@dataclass
class Trace:
    """What one transaction touched."""

    namespaces: set[bytes] = field(default_factory=set)
    statements: list[str] = field(default_factory=list)
    reported: bool = False
    #: table -> the first statement that locked rows of it (SELECT ... FOR UPDATE)
    locked: dict[str, str] = field(default_factory=dict)
    written: set[str] = field(default_factory=set)


@dataclass
class Guard:
    """Collects per-transaction namespace sets and the violations of the shard function."""

    spec: str = "single"
    registry: Registry = field(default_factory=Registry)
    names: dict[str, str] = field(default_factory=dict)  # SQL text -> query name
    transactions: int = 0
    multi_namespace: int = 0
    widest: int = 0
    violations: list[tuple[list[str], list[str]]] = field(default_factory=list)
    shapes: Counter[int] = field(default_factory=Counter)
    #: (table, locking statement) -> transactions that locked rows of the table and wrote
    #: nothing to it: exclusion that only a single server's row locks give (on Galera
    #: certification sees writes only). Reported with ORBIT_LOCK_AUDIT=1.
    lock_only: Counter[tuple[str, str]] = field(default_factory=Counter)
    #: Statements the guard itself failed to read (a bug of the guard, reported, never raised).
    internal_errors: int = 0

    def __post_init__(self) -> None:
        self.shard = shard_function(self.spec, self.registry)

    def see(self, trace: Trace, sql: str, args: Any) -> None:
        """One statement of the transaction ``trace`` with its arguments."""
        locked, written = _lock_shape(sql)
        for t in locked:
            trace.locked.setdefault(t, sql)
        trace.written |= written
        if args is None:
            return
        self.registry.learn(sql, args)
        before = len(trace.namespaces)
        trace.namespaces |= self.registry.namespaces_in(args)
        if len(trace.statements) < 40:
            trace.statements.append(sql)
        if len(trace.namespaces) != before:
            self._judge(trace)

    def begin(self) -> Trace:
        self.transactions += 1
        return Trace()

    def end(self, trace: Trace) -> None:
        for table, sql in trace.locked.items():
            if table not in trace.written:
                self.lock_only[(table, self.names.get(sql) or _excerpt(sql))] += 1
        n = len(trace.namespaces)
        self.shapes[min(n, 10)] += 1
        self.widest = max(self.widest, n)
        if n > 1:
            self.multi_namespace += 1

    def _judge(self, trace: Trace) -> None:
        groups = {self.shard(ns) for ns in trace.namespaces}
        if len(groups) <= 1 or trace.reported:
            return
        names = [self.names.get(s) or _excerpt(s) for s in trace.statements]
        if any(n in ALLOW for n in names):
            return
        trace.reported = True
        self.violations.append((sorted(groups), names))


_SHAPES: dict[str, tuple[frozenset[str], frozenset[str]]] = {}
_WRITE = re.compile(r"\b(?:INSERT\s+(?:IGNORE\s+)?INTO|REPLACE\s+INTO|UPDATE|DELETE\s+FROM)\s+`?(\w+)", re.I)
_FROM = re.compile(r"\b(?:FROM|JOIN)\s+`?(\w+)`?(?:\s+(?:AS\s+)?\w+)?", re.I)


def _lock_shape(sql: str) -> tuple[frozenset[str], frozenset[str]]:
    """(tables a statement locks with FOR UPDATE, tables it writes), cached by text."""
    got = _SHAPES.get(sql)
    if got is None:
        text = re.sub(r"--[^\n]*", " ", sql)
        written = frozenset(_WRITE.findall(text))
        locked: frozenset[str] = frozenset()
        if re.search(r"\bFOR\s+UPDATE\b", text, re.I):
            locked = frozenset(t for t in _FROM.findall(text) if t.upper() != "DUAL")
        got = _SHAPES[sql] = (locked, written)
    return got


def _excerpt(sql: str) -> str:
    text = " ".join(re.sub(r"--[^\n]*", " ", sql).split())
    tables = dict.fromkeys(re.findall(r"\b(?:FROM|INTO|UPDATE|JOIN)\s+`?(\w+)", text, re.I))
    return f"{text[:60]}… [{', '.join(tables)}]"


def _is_id(v: Any) -> bool:
    return isinstance(v, bytes | bytearray | memoryview) and len(v) == 16


def _as_bytes(v: Any) -> bytes | None:
    return bytes(v) if _is_id(v) else None


def _values(args: Any) -> Iterator[bytes]:
    if _is_id(args):
        yield bytes(args)
    elif isinstance(args, dict):
        for v in args.values():
            yield from _values(v)
    elif isinstance(args, list | tuple | set | frozenset):
        for v in args:
            yield from _values(v)


# --------------------------------------------------------------------------------------------
# Wiring into orbit.storage.db.Tx


class _TracingCursor:
    """The driver cursor of one ``Tx``, recording each statement's arguments."""

    __slots__ = ("_cur", "_guard", "_trace")

    def __init__(self, cur: Any, guard: Guard) -> None:
        self._cur = cur
        self._guard = guard
        self._trace = guard.begin()

    def __getattr__(self, name: str) -> Any:
        return getattr(self._cur, name)

    def __del__(self) -> None:
        with contextlib.suppress(Exception):
            self._guard.end(self._trace)

    def _see(self, sql: str, args: Any) -> None:
        try:
            self._guard.see(self._trace, sql, args)
        except Exception:  # the guard never fails a statement; it says so at the end
            self._guard.internal_errors += 1

    def mogrify(self, sql: str, args: Any = None) -> Any:
        self._see(sql, args)
        return self._cur.mogrify(sql, args)

    async def execute(self, sql: str, args: Any = None) -> Any:
        self._see(sql, args)
        return await self._cur.execute(sql, args)

    async def executemany(self, sql: str, args: Iterable[Any]) -> Any:
        args = list(args)
        self._see(sql, args)
        return await self._cur.executemany(sql, args)


GUARD: Guard | None = None


def install(names: dict[str, str]) -> Guard | None:
    """Wrap every future ``Tx``'s cursor (idempotent). None when switched off."""
    global GUARD
    if os.environ.get("ORBIT_SHARD_GUARD", "1") == "0":
        return None
    if GUARD is not None:
        return GUARD
    from orbit.storage import db as storage_db

    GUARD = Guard(spec=os.environ.get("ORBIT_SHARD_MAP", "single"), names=names)
    original = storage_db.Tx.__init__

    def traced_init(self: Any, conn: Any, cur: Any) -> None:
        guard = GUARD
        original(self, conn, _TracingCursor(cur, guard) if guard is not None else cur)

    storage_db.Tx.__init__ = traced_init  # type: ignore[method-assign]
    return GUARD


def report(guard: Guard) -> list[str]:
    """Lines for the end of the session: a summary, then each violation."""
    lines = [
        f"shard guard ({guard.spec}): {guard.transactions} transactions, {guard.multi_namespace} "
        f"touched more than one namespace (widest: {guard.widest}), {len(guard.violations)} spanned "
        f"two shard groups" + (f"; {guard.internal_errors} statements unreadable" if guard.internal_errors else "")
    ]
    for groups, names in guard.violations[:20]:
        lines.append(f"  groups {groups[:4]}: " + ", ".join(dict.fromkeys(names))[:400])
    return lines


def lock_report(guard: Guard) -> list[str]:
    """Tables locked FOR UPDATE by a transaction that wrote nothing to them."""
    lines = [f"lock audit: {sum(guard.lock_only.values())} lock-only uses in {guard.transactions} transactions"]
    for (table, name), n in guard.lock_only.most_common(60):
        lines.append(f"  {n:6d}  {table}  ← {name}")
    return lines
