"""The ledger's pure parts: parsing mariadb-binlog's decoded row events, counting the
secondary-index entries a row change writes, status deltas and per-task arithmetic."""

from __future__ import annotations

from bench import ledger
from bench.ledger import RowChange, TableIndexes

BINLOG = """\
# at 4
#241201 20:00:00 server id 1  end_log_pos 256 CRC32 0x1  Table_map: `db1`.`a` mapped to number 18
### INSERT INTO `db1`.`a`
### SET
###   @1=1
###   @2='A'
###   @3=10
### UPDATE `db1`.`a`
### WHERE
###   @1=1
###   @2='A'
###   @3=10
### SET
###   @1=1
###   @2='B'
###   @3=10
### UPDATE `db1`.`a`
### WHERE
###   @1=1
###   @2='B'
###   @3=10
### SET
###   @1=1
###   @2='B'
###   @3=10
###   @4='text that changed'
### UPDATE `other`.`a`
### WHERE
###   @1=5
### SET
###   @1=6
### DELETE FROM `db1`.`a`
### WHERE
###   @1=1
###   @2='B'
###   @3=10
COMMIT/*!*/;
"""

# a: PRIMARY (1), ix_s (2, 1), ix_x (3), ix_blob (4: a prefix of a TEXT column)
IDX = {"a": TableIndexes(primary=frozenset({1}), secondary={
    "ix_s": frozenset({2, 1}), "ix_x": frozenset({3}), "ix_blob": frozenset({4})})}  # fmt: skip


def test_parse_rows_keeps_the_schema_and_both_images() -> None:
    rows = list(ledger.parse_rows(BINLOG.splitlines(keepends=True), "db1"))
    assert [r.op for r in rows] == ["insert", "update", "update", "delete"]
    assert rows[0].after == {1: "1", 2: "'A'", 3: "10"} and rows[0].before == {}
    assert rows[1].before[2] == "'A'" and rows[1].after[2] == "'B'"
    assert rows[3].before == {1: "1", 2: "'B'", 3: "10"} and rows[3].after == {}
    assert len(list(ledger.parse_rows(BINLOG.splitlines()))) == 5  # no schema filter


def test_index_entries_follow_the_columns_that_change() -> None:
    rows = list(ledger.parse_rows(BINLOG.splitlines(), "db1"))
    idx = IDX["a"]
    assert ledger.index_entries(rows[0], idx) == (3, 0)  # insert: every secondary index
    assert ledger.index_entries(rows[1], idx) == (1, 1)  # only ix_s's column changed
    assert ledger.index_entries(rows[2], idx) == (1, 1)  # a TEXT column only in the after image
    assert ledger.index_entries(rows[3], idx) == (0, 3)  # delete: every index delete-marked
    pk = RowChange("update", "db1", "a", {1: "1", 2: "'A'", 3: "1"}, {1: "2", 2: "'A'", 3: "1"})
    assert ledger.index_entries(pk, idx) == (3, 3)  # a new primary key rewrites them all
    same = RowChange("update", "db1", "a", {1: "1", 2: "'A'"}, {1: "1", 2: "'A'"})
    assert ledger.index_entries(same, idx) == (0, 0)


def test_tally_and_summary() -> None:
    tables = ledger.tally(ledger.parse_rows(BINLOG.splitlines(), "db1"), IDX)
    t = tables["a"]
    assert (t.inserted, t.updated, t.deleted) == (1, 2, 1)
    assert (t.index_written, t.index_delete_marked) == (5, 5)
    before = {k: 0 for k in ledger.STATUS_KEYS}
    after = dict(before, Questions=41, Com_show_status=1, Com_commit=3, Com_rollback=1,
                 Innodb_data_fsyncs=2, Innodb_os_log_written=4096)  # fmt: skip
    delta = ledger.status_delta(before, after)
    totals = ledger.summarise(delta, tables, server_cpu_s=0.5, mariadb_cpu_s=0.25)
    assert totals["statements"] == 40  # the ledger's own SHOW STATUS is not counted
    assert totals["transactions"] == 4 and totals["row_writes"] == 4
    assert totals["index_entries_written"] == 5 and totals["server_cpu_ms"] == 500.0
    per = ledger.per_task(totals, 4)
    assert per["statements"] == 10.0 and per["redo_bytes"] == 1024.0
    assert per["mariadb_cpu_ms"] == 62.5
    assert ledger.per_task({"x": None, "y": 3}, 0) == {"x": None, "y": None}


def test_without_the_binary_log_rows_come_from_the_counters() -> None:
    before = {k: 0 for k in ledger.STATUS_KEYS}
    after = dict(before, Innodb_rows_inserted=9, Innodb_rows_updated=7, Innodb_rows_deleted=1)
    no_innodb_rows = {k: v for k, v in after.items() if not k.startswith("Innodb_rows_")}
    delta = ledger.status_delta(before, dict(no_innodb_rows, Handler_write=4))
    assert delta["Innodb_rows_inserted"] is None  # MariaDB 10.11 has no such counter
    got = ledger.summarise(delta, None, server_cpu_s=None, mariadb_cpu_s=None)
    assert got["rows_inserted"] == 4  # from the handler counters then
    totals = ledger.summarise(ledger.status_delta(before, after), None, server_cpu_s=None,
                              mariadb_cpu_s=None)  # fmt: skip
    assert totals["row_writes"] == 17 and totals["index_entries_written"] is None
    assert totals["server_cpu_ms"] is None


def test_s8_written_adds_redo_and_data_bytes() -> None:
    from bench.idle import written

    led = {
        "status": {
            "Handler_write": 5000,
            "Innodb_rows_inserted": 4000,
            "Innodb_os_log_written": 3 * 2**20,
            "Innodb_data_written": 2**20,
        },
        "per_table": {"orbit_deliveries": {"inserted": 4000, "updated": 10, "deleted": 0}},
    }
    w = written(led)
    assert w["mb_written"] == 4.0 and w["Handler_write"] == 5000
    assert w["rows_by_table"] == {"orbit_deliveries": 4010}
    assert written({"status": {}})["mb_written"] == 0.0
