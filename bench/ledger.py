"""The work-per-task ledger of a measured window: what MariaDB did for the tasks of the window.

Sources (all read on the bench's own MariaDB, so nothing else is counted; see
bench/mariadb.py):

* ``SHOW GLOBAL STATUS`` deltas over the window: statements (``Questions``, less the
  ledger's own ``SHOW STATUS``), transactions (``Com_commit`` + ``Com_rollback``: the
  explicit ones; an autocommit statement is its own transaction and is not in this
  figure), rows (``Handler_write/update/delete``; ``Innodb_rows_*`` where the server has
  them), fsyncs
  (``Innodb_data_fsyncs``), redo bytes (``Innodb_os_log_written``), data written
  (``Innodb_data_written``), bytes received and sent;
* the binary log of the window (ROW format): every changed row with its before and after
  image, per table. A row inserted writes one entry in each secondary index of its table;
  a row updated writes one entry (and delete-marks the old one) in each secondary index
  whose columns changed value (all of them when the primary key changed) — InnoDB leaves an
  index alone when none of its columns changes; a row deleted delete-marks one entry per
  secondary index. The indexes come from ``information_schema.STATISTICS``, so the count
  follows the schema the run migrated to;
* CPU seconds of the Orbit server and of ``mariadbd`` from /proc.

The per-task figures divide by the tasks completed in the window (in a steady window as
many are submitted, dispatched, started, reported and delivered).
"""

from __future__ import annotations

import asyncio
import re
import subprocess
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from typing import Any

import pymysql

from orbit.storage import DSN

STATUS_KEYS = (
    "Questions",
    "Com_show_status",
    "Com_select",
    "Com_insert",
    "Com_insert_select",
    "Com_update",
    "Com_update_multi",
    "Com_delete",
    "Com_delete_multi",
    "Com_replace",
    "Com_commit",
    "Com_rollback",
    "Handler_commit",
    "Handler_write",
    "Handler_update",
    "Handler_delete",
    "Innodb_rows_inserted",
    "Innodb_rows_updated",
    "Innodb_rows_deleted",
    "Innodb_data_fsyncs",
    "Innodb_os_log_written",
    "Innodb_data_written",
    "Innodb_pages_written",
    "Innodb_row_lock_waits",
    "Binlog_bytes_written",
    "Bytes_received",
    "Bytes_sent",
)


def status_delta(before: dict[str, int], after: dict[str, int]) -> dict[str, int | None]:
    """``after - before`` for every key of :data:`STATUS_KEYS` (None when this server has
    no such counter: MariaDB 10.11 has no ``Innodb_rows_*``)."""
    return {
        k: (int(after[k]) - int(before.get(k, 0))) if k in after else None for k in STATUS_KEYS
    }


def _n(delta: dict[str, int | None], key: str) -> int:
    return delta.get(key) or 0


# -- the binary log ------------------------------------------------------------------------


@dataclass
class RowChange:
    op: str  # "insert" | "update" | "delete"
    schema: str
    table: str
    before: dict[int, str] = field(default_factory=dict)  # column position -> printed value
    after: dict[int, str] = field(default_factory=dict)


_HEAD = re.compile(r"^### (INSERT INTO|UPDATE|DELETE FROM) `([^`]*)`\.`([^`]*)`$")
_COL = re.compile(r"^###   @(\d+)=(.*)$")
_OPS = {"INSERT INTO": "insert", "UPDATE": "update", "DELETE FROM": "delete"}


def parse_rows(lines: Iterable[str], schema: str | None = None) -> Iterator[RowChange]:
    """Row changes from ``mariadb-binlog --base64-output=DECODE-ROWS --verbose`` output
    (``### UPDATE `db`.`t``` / ``### WHERE`` / ``### SET`` / ``###   @N=value`` lines; a
    value is printed on one line, control characters escaped). Only ``schema``'s rows when
    given."""
    cur: RowChange | None = None
    part: dict[int, str] | None = None
    for raw in lines:
        line = raw.rstrip("\n")
        if not line.startswith("###"):
            continue
        m = _HEAD.match(line)
        if m:
            if cur is not None:
                yield cur
            cur = None
            part = None
            if schema is None or m.group(2) == schema:
                cur = RowChange(_OPS[m.group(1)], m.group(2), m.group(3))
            continue
        if cur is None:
            continue
        if line == "### WHERE":
            part = cur.before
        elif line == "### SET":
            part = cur.after
        else:
            c = _COL.match(line)
            if c and part is not None:
                part[int(c.group(1))] = c.group(2)
    if cur is not None:
        yield cur


@dataclass(frozen=True)
class TableIndexes:
    """Column positions (1-based, as the binary log numbers them) of a table's keys."""

    primary: frozenset[int]
    secondary: dict[str, frozenset[int]]


def index_entries(change: RowChange, idx: TableIndexes) -> tuple[int, int]:
    """(secondary-index entries written, entries delete-marked) by one row change."""
    n = len(idx.secondary)
    if change.op == "insert":
        return n, 0
    if change.op == "delete":
        return 0, n

    def changed(cols: frozenset[int]) -> bool:
        # NOBLOB images leave out BLOB/TEXT columns that did not change: a column only in
        # the after image changed; one in neither did not.
        return any(c in change.after and change.before.get(c) != change.after[c] for c in cols)

    if changed(idx.primary):
        return n, n
    k = sum(1 for cols in idx.secondary.values() if changed(cols))
    return k, k


@dataclass
class TableLedger:
    inserted: int = 0
    updated: int = 0
    deleted: int = 0
    index_written: int = 0
    index_delete_marked: int = 0


def tally(changes: Iterable[RowChange], indexes: dict[str, TableIndexes]) -> dict[str, TableLedger]:
    """Per-table row changes and secondary-index entries of ``changes``."""
    out: dict[str, TableLedger] = {}
    for ch in changes:
        t = out.setdefault(ch.table, TableLedger())
        if ch.op == "insert":
            t.inserted += 1
        elif ch.op == "update":
            t.updated += 1
        else:
            t.deleted += 1
        idx = indexes.get(ch.table)
        if idx is not None:
            w, d = index_entries(ch, idx)
            t.index_written += w
            t.index_delete_marked += d
    return out


def per_task(totals: dict[str, float | int | None], tasks: int) -> dict[str, float | None]:
    """Every figure of ``totals`` divided by ``tasks`` (None when it was not measured)."""
    return {
        k: (round(v / tasks, 3) if isinstance(v, int | float) and tasks > 0 else None)
        for k, v in totals.items()
    }


def summarise(
    delta: dict[str, int],
    tables: dict[str, TableLedger] | None,
    *,
    server_cpu_s: float | None,
    mariadb_cpu_s: float | None,
) -> dict[str, Any]:
    """The ledger's totals of one window (row and index figures from the binary log when
    it was read, else rows from the status counters and no index entries)."""
    statements = _n(delta, "Questions") - _n(delta, "Com_show_status")
    totals: dict[str, float | int | None] = {
        "statements": statements,
        "transactions": _n(delta, "Com_commit") + _n(delta, "Com_rollback"),
    }
    if tables is not None:
        ins = sum(t.inserted for t in tables.values())
        upd = sum(t.updated for t in tables.values())
        dele = sum(t.deleted for t in tables.values())
        totals.update(
            rows_inserted=ins,
            rows_updated=upd,
            rows_deleted=dele,
            row_writes=ins + upd + dele,
            index_entries_written=sum(t.index_written for t in tables.values()),
            index_entries_delete_marked=sum(t.index_delete_marked for t in tables.values()),
        )
    else:
        # InnoDB's own row counters where the server has them, else the handler's (which
        # also count internal temporary tables).
        src = "Innodb_rows_" if delta.get("Innodb_rows_inserted") is not None else "Handler_"
        names = ("inserted", "updated", "deleted") if src == "Innodb_rows_" else (
            "write", "update", "delete")  # fmt: skip
        ins, upd, dele = (_n(delta, src + n) for n in names)
        totals.update(
            rows_inserted=ins,
            rows_updated=upd,
            rows_deleted=dele,
            row_writes=ins + upd + dele,
            index_entries_written=None,
            index_entries_delete_marked=None,
        )
    totals.update(
        fsyncs=delta.get("Innodb_data_fsyncs"),
        redo_bytes=delta.get("Innodb_os_log_written"),
        server_cpu_ms=round(server_cpu_s * 1000, 1) if server_cpu_s is not None else None,
        mariadb_cpu_ms=round(mariadb_cpu_s * 1000, 1) if mariadb_cpu_s is not None else None,
    )
    return totals


# -- reading it from the server ------------------------------------------------------------


def _query(dsn: DSN, sql: str, args: Any = None) -> list[tuple[Any, ...]]:
    conn = pymysql.connect(autocommit=True, **dsn.connect_kwargs(with_database=False))
    try:
        with conn.cursor() as cur:
            cur.execute(sql, args)
            return list(cur.fetchall())
    finally:
        conn.close()


def read_status(dsn: DSN) -> dict[str, int]:
    rows = _query(dsn, "SHOW GLOBAL STATUS")
    wanted = set(STATUS_KEYS)
    return {k: int(v) for k, v in rows if k in wanted and str(v).lstrip("-").isdigit()}


def read_indexes(dsn: DSN, schema: str) -> dict[str, TableIndexes]:
    pos = {
        (t, c): int(p)
        for t, c, p in _query(
            dsn,
            "SELECT TABLE_NAME, COLUMN_NAME, ORDINAL_POSITION FROM information_schema.COLUMNS"
            " WHERE TABLE_SCHEMA = %s",
            (schema,),
        )
    }
    keys: dict[str, dict[str, set[int]]] = {}
    for t, name, col in _query(
        dsn,
        "SELECT TABLE_NAME, INDEX_NAME, COLUMN_NAME FROM information_schema.STATISTICS"
        " WHERE TABLE_SCHEMA = %s",
        (schema,),
    ):
        keys.setdefault(t, {}).setdefault(name, set()).add(pos[(t, col)])
    return {
        t: TableIndexes(
            primary=frozenset(ix.get("PRIMARY", set())),
            secondary={n: frozenset(c) for n, c in ix.items() if n != "PRIMARY"},
        )
        for t, ix in keys.items()
    }


@dataclass
class _Mark:
    status: dict[str, int]
    binlog: str | None
    server_cpu: float | None
    mariadb_cpu: float | None


@dataclass
class _Closed:
    mark: _Mark
    status: dict[str, int]
    binlog: str | None
    server_cpu: float | None
    mariadb_cpu: float | None


_CURRENT: Ledger | None = None


def current() -> Ledger:
    """The ledger of this run's database server (bench.env.DB)."""
    global _CURRENT
    from bench.env import DB

    if _CURRENT is None or _CURRENT.dsn != DB.dsn:
        _CURRENT = Ledger(DB.dsn, exclusive=DB.exclusive, binlog=DB.binlog, mariadb_pid=DB.pid)
    return _CURRENT


class Ledger:
    """Snapshots around measured windows on the database server at ``dsn``.

    ``exclusive``: only the bench uses that server (its counters are the bench's alone);
    ``binlog``: it writes a ROW binary log the ledger may read (and purge)."""

    def __init__(self, dsn: DSN, *, exclusive: bool, binlog: bool, mariadb_pid: int | None) -> None:
        self.dsn = dsn
        self.exclusive = exclusive
        self.binlog = binlog
        self.mariadb_pid = mariadb_pid
        self._indexes: dict[str, dict[str, TableIndexes]] = {}

    def _cpu(self) -> float | None:
        from bench.env import proc_sample

        return proc_sample(self.mariadb_pid).cpu_s if self.mariadb_pid else None

    def _rotate(self) -> tuple[str, str] | None:
        """Start a new binary log file: (the file written until now, the new one)."""
        if not self.binlog:
            return None
        conn = pymysql.connect(autocommit=True, **self.dsn.connect_kwargs(with_database=False))
        try:
            with conn.cursor() as cur:
                cur.execute("SHOW MASTER STATUS")
                old = str(cur.fetchone()[0])
                cur.execute("FLUSH BINARY LOGS")
                cur.execute("SHOW MASTER STATUS")
                return old, str(cur.fetchone()[0])
        finally:
            conn.close()

    async def begin(self, server_cpu: float | None = None) -> _Mark:
        files = await asyncio.to_thread(self._rotate)
        status = await asyncio.to_thread(read_status, self.dsn)
        return _Mark(status, files[1] if files else None, server_cpu, self._cpu())

    async def end(self, mark: _Mark, server_cpu: float | None = None) -> _Closed:
        """Close the window (quick: counters and CPU now, a new binary log file)."""
        mcpu = self._cpu()
        status = await asyncio.to_thread(read_status, self.dsn)
        files = await asyncio.to_thread(self._rotate)
        return _Closed(mark, status, files[0] if files else None, server_cpu, mcpu)

    async def report(self, closed: _Closed, schema: str, tasks: int | None) -> dict[str, Any]:
        """The window's ledger (reads the binary log: call it after the window's load has
        stopped): ``totals``, ``per_task`` (when ``tasks``), ``per_table`` and the raw
        ``status`` deltas."""
        mark, status, last = closed.mark, closed.status, closed.binlog
        server_cpu, mcpu = closed.server_cpu, closed.mariadb_cpu
        delta = status_delta(mark.status, status)
        tables: dict[str, TableLedger] | None = None
        notes: list[str] = []
        if not self.exclusive:
            notes.append("the database server is shared: its counters include other clients")
        if mark.binlog is not None and last is not None:
            try:
                tables = await asyncio.to_thread(self._read_binlog, mark.binlog, last, schema)
            except Exception as exc:  # the rest of the ledger stands without it
                notes.append(f"binary log not read: {type(exc).__name__}: {exc}")
        else:
            notes.append("secondary-index entries not measured: the server writes no ROW "
                         "binary log (the bench's own MariaDB does, unless --no-binlog)")  # fmt: skip
        totals = summarise(
            delta,
            tables,
            server_cpu_s=(server_cpu - mark.server_cpu)
            if server_cpu is not None and mark.server_cpu is not None else None,
            mariadb_cpu_s=(mcpu - mark.mariadb_cpu)
            if mcpu is not None and mark.mariadb_cpu is not None else None,
        )  # fmt: skip
        out: dict[str, Any] = {"totals": totals}
        if tasks:
            out["tasks"] = tasks
            out["per_task"] = per_task(totals, tasks)
        if tables is not None:
            out["per_table"] = {
                name: t.__dict__ for name, t in sorted(
                    tables.items(), key=lambda kv: -(kv[1].index_written + kv[1].inserted
                                                      + kv[1].updated + kv[1].deleted))
            }  # fmt: skip
        out["status"] = delta
        if notes:
            out["notes"] = notes
        return out

    def _read_binlog(self, first: str, last: str, schema: str) -> dict[str, TableLedger]:
        """Tally the binary log files ``first`` .. ``last`` (inclusive), then purge them."""
        if schema not in self._indexes:
            self._indexes[schema] = read_indexes(self.dsn, schema)
        logs = [str(r[0]) for r in _query(self.dsn, "SHOW BINARY LOGS")]
        base = str(_query(self.dsn, "SELECT @@log_bin_basename")[0][0])
        folder = base.rsplit("/", 1)[0]
        files = [f for f in logs if first <= f <= last]
        from bench.mariadb import _find

        tool = _find("mariadb-binlog") or _find("mysqlbinlog")
        if tool is None:
            raise RuntimeError("mariadb-binlog is not installed")
        with subprocess.Popen(
            [tool, "--base64-output=DECODE-ROWS", "--verbose",
             *[f"{folder}/{f}" for f in files]],
            stdout=subprocess.PIPE, text=True, errors="replace",
        ) as proc:  # fmt: skip
            assert proc.stdout is not None
            tables = tally(parse_rows(proc.stdout, schema), self._indexes[schema])
        # Keep the disk small: drop the files read (a later window's stay).
        after = [f for f in logs if f > last]
        if after:
            _query(self.dsn, f"PURGE BINARY LOGS TO '{after[0]}'")
        return tables
