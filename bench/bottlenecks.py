"""The report's "targets not met" section: for each target a run misses, the bottleneck named
with this run's own figures — the CPU each process used, the ledger per task (which tables
wrote the most rows and index entries), S5's legs, S7's statements at rest, S8's rows by
table — a pointer to the profile when one was taken, and what would break it.
"""

from __future__ import annotations

from typing import Any


def _get(d: Any, *path: str) -> Any:
    for p in path:
        if not isinstance(d, dict):
            return None
        d = d.get(p)
    return d


def _num(v: Any, digits: int = 2) -> str:
    return f"{v:,.{digits}f}" if isinstance(v, int | float) else "—"


def _s1_cpu(s1: dict[str, Any], cores: Any) -> tuple[str, float | None]:
    parts = [
        ("server", s1.get("server_cpu_util")),
        ("MariaDB", s1.get("mariadb_cpu_util")),
        ("workers", s1.get("workers_cpu_util")),
        ("bench", s1.get("driver_cpu_util")),
    ]
    known = [v for _, v in parts if isinstance(v, int | float)]
    total = sum(known) if known else None
    rate = s1.get("completed_per_s")
    per_task = ""
    if isinstance(rate, int | float) and rate > 0:
        mdb = s1.get("mariadb_cpu_util")
        per_task = (
            f"; per task {_num(s1.get('server_cpu_s_per_1000'))} ms of server CPU and "
            f"{_num(mdb / rate * 1000 if isinstance(mdb, int | float) else None)} ms of MariaDB CPU"
        )
    used = " + ".join(f"{name} {_num(v)}" for name, v in parts)
    busy = total / cores if isinstance(total, float) and isinstance(cores, int) else None
    return f"{used} = {_num(total)} of {cores} cores busy{per_task}", busy


def top_tables(led: Any, key: str, k: int = 3) -> str:
    """The ``k`` tables with the most of ``key`` per task (``inserted+updated+deleted`` for
    ``rows``), as text."""
    tables = _get(led, "per_table") or {}
    n = _get(led, "tasks") or 0
    if not tables or not n:
        return "—"

    def value(v: dict[str, int]) -> int:
        if key == "rows":
            return v["inserted"] + v["updated"] + v["deleted"]
        return v[key]

    ranked = sorted(tables.items(), key=lambda kv: -value(kv[1]))[:k]
    return ", ".join(f"`{t}` {value(v) / n:.1f}" for t, v in ranked if value(v))


def _profile(fig: Any) -> str:
    prof = _get(fig, "profile", "top")
    return f" Profile: `{_rel(prof)}`." if isinstance(prof, str) else ""


def lines(out: dict[str, Any], missed: list[str]) -> list[str]:
    """Markdown paragraphs for the targets in ``missed`` (keys of the ratios)."""
    raw = out.get("raw") or {}
    cores = _get(out, "machine", "cores") or "?"
    s1 = raw.get("s1") or {}
    led = s1.get("ledger") or {}
    pt = led.get("per_task") or {}
    m = set(missed)
    text: dict[str, str] = {}
    if {"s1_vs_pgqueuer", "s1_vs_baseline", "s1_server_cpu_ms", "s1_mariadb_cpu_ms"} & m:
        cpu, busy = _s1_cpu(s1, cores)
        head = (
            f"The box's CPU is the limit ({cpu})."
            if busy is not None and busy >= 0.8
            else f"Not CPU-bound in this run ({cpu}): transactions wait for each other."
        )
        work = (
            f" Per task MariaDB ran {_num(pt.get('statements'))} statements in "
            f"{_num(pt.get('transactions'))} transactions and wrote "
            f"{_num(pt.get('row_writes'), 1)} rows."
            if pt else ""
        )  # fmt: skip
        text["s1"] = (
            f"**S1 (throughput, CPU per task).** {head}{work} The server's CPU follows the "
            "statements and round trips (driver escaping, socket writes, result parsing), "
            f"MariaDB's the statements and rows.{_profile(s1)} What would break it: "
            "node-wide rounds with multi-row statements (far fewer statements and transactions "
            "per task) and fewer rows per state change — PgQueuer's loop is one INSERT and one "
            "UPDATE a task."
        )
    if {"s1_statements_per_task", "s1_row_writes_per_task", "s1_index_entries_per_task"} & m:
        text["ledger"] = (
            f"**S1 ledger.** Per task {_num(pt.get('statements'))} statements, "
            f"{_num(pt.get('row_writes'), 1)} rows written (most: "
            f"{top_tables(led, 'rows')}) and {_num(pt.get('index_entries_written'), 1)} "
            f"secondary-index entries (+{_num(pt.get('index_entries_delete_marked'), 1)} "
            f"delete-marked; most: {top_tables(led, 'index_written')}). An inserted row "
            "writes every secondary index of its table, an update each index whose columns "
            "change. What would break it: one multi-row statement per stage and round, fewer "
            "indexes on the task table (those containing the state are rewritten at every "
            "state change), the attempt written once, no delivery row per result and "
            "subscriber on the happy path."
        )
    if {"s2_p50_ms", "s2_p99_ms"} & m:
        hs = _get(raw, "s2", "submit_to_handler_start") or {}
        pq = _get(raw, "peers", "pgqueuer", "latency") or {}
        text["s2"] = (
            f"**S2 (idle dispatch latency).** p50 {_num(hs.get('p50_ms'), 1)} ms, p99 "
            f"{_num(hs.get('p99_ms'), 1)} against PgQueuer's {_num(pq.get('p50_ms'), 1)} / "
            f"{_num(pq.get('p99_ms'), 1)}: an idle submit reaches its worker through two "
            "durable transactions (the submit, which offers the task to the waiting session "
            "itself, then the start), each behind an HTTP or WebSocket hop and a node round. "
            "What would break it: cheaper submit and start transactions (fewer statements, "
            "one round trip each) and fewer event-loop hops between them."
        )
    if "s4_1m_vs_10k" in m:
        levels = _get(raw, "s4", "levels") or {}
        low, high = levels.get("10000") or {}, levels.get("1000000") or {}
        plan = high.get("explain")
        rows = plan[0].get("rows") if isinstance(plan, list) and plan else None
        text["s4"] = (
            f"**S4 (1M backlog).** {_num(high.get('tasks_per_s'), 1)}/s at 1M waiting tasks "
            f"against {_num(low.get('tasks_per_s'), 1)} at 10k. The dispatch claim reads "
            f"{rows if rows is not None else '—'} row(s) by its index at 1M (EXPLAIN); the "
            f"server's CPU went {_num(low.get('server_cpu_util'))} → "
            f"{_num(high.get('server_cpu_util'))} cores and MariaDB's "
            f"{_num(low.get('mariadb_cpu_util'))} → {_num(high.get('mariadb_cpu_util'))}: "
            "when the server's falls and MariaDB's does not, the server waits for MariaDB — "
            "its default 128 MB buffer pool against the secondary indexes of 1M tasks"
            f"{_settled(high)}. What would break it: fewer secondary indexes on the task "
            "table (a smaller working set), or a buffer pool sized to it (a deployment "
            "setting; the bench keeps the defaults)."
        )
    if {"s5_100_owners_vs_1", "s5_jain_100_owners"} & m:
        one = _get(raw, "s5", "owners_1") or {}
        many = _get(raw, "s5", "owners_100") or {}
        lp1 = _get(one, "ledger", "per_task") or {}
        lp = _get(many, "ledger", "per_task") or {}
        po = many.get("per_owner_results") or {}
        work = (
            f"{_num(lp.get('transactions'))} vs {_num(lp1.get('transactions'))} transactions, "
            f"{_num(lp.get('statements'))} vs {_num(lp1.get('statements'))} statements, "
            f"{_num(lp.get('fsyncs'))} vs {_num(lp1.get('fsyncs'))} fsyncs, "
            if lp and lp1 else ""
        )  # fmt: skip
        by = po.get("by_worker_process") or []
        split = (
            f" Results by worker process (owner i's session in process i mod "
            f"{len(by)}): {' / '.join(str(x) for x in by)}."
            if len(by) > 1 else ""
        )  # fmt: skip
        backlog = many.get("backlog") or {}
        kept = (
            f" Every owner kept a backlog of at least "
            f"{backlog.get('min_owner_backlog_in_window')} tasks in the window."
            if backlog and not backlog.get("ran_out")
            else f" {backlog['ran_out']}'s backlog ran out in the window."
            if backlog.get("ran_out") else ""
        )  # fmt: skip
        text["s5"] = (
            f"**S5 (100 owners).** Per task with 100 owners against one: {work}server CPU "
            f"{_num(many.get('server_cpu_s_per_1000'))} vs {_num(one.get('server_cpu_s_per_1000'))}"
            f" ms; per-owner results min {po.get('min')}, max {po.get('max')} (Jain "
            f"{po.get('jain_index')}).{kept}{split} What is still per owner: a worker "
            f"session and a subscription stream each (100 WebSocket connections against one)."
            f"{_profile(many)}"
        )
    if "s5_fairness_key_max_wait" in m:
        fk = _get(raw, "s5", "fairness_key") or {}
        w = fk.get("wait_dispatches") or {}
        text["s5k"] = (
            f"**S5 fairness key.** A non-flooding subject's task waited up to "
            f"{_num(w.get('max'), 0)} dispatches (p99 {_num(w.get('p99'), 0)}) behind subject "
            f"0's flood of {_num(fk.get('flood'), 0)}, p50 {_num(w.get('p50'), 0)}: dispatch "
            "rotates across the keys, so the wait is the tasks already offered or starting on "
            "the worker slots when the task was submitted. What would break it: a shorter "
            "submit → start path, fewer tasks held ahead per session."
        )
    if "s6_rss_mb" in m:
        text["s6"] = (
            f"**S6 (memory).** {_num(_get(raw, 's6', 'rss_mb_with_sessions'), 1)} MB with "
            f"{_get(raw, 's6', 'sessions_connected')} sessions: per-session state held in "
            "the server."
        )
    if {"s7_server_core", "s7_mariadb_core"} & m:
        s7 = raw.get("s7") or {}
        rates = s7.get("rates") or {}
        text["s7"] = (
            f"**S7 (idle, {s7.get('namespaces')} namespaces).** At rest the server used "
            f"{_num(s7.get('server_core'), 3)} of a core and MariaDB "
            f"{_num(s7.get('mariadb_core'), 3)}, running {_num(rates.get('statements_per_s'), 0)} "
            f"statements and {_num(rates.get('transactions_per_s'), 0)} transactions a second "
            f"and writing {_num(rates.get('row_writes_per_s'), 0)} rows a second with no "
            "work: per-namespace, per-session and per-stream loops that poll. What would "
            "break it: no statement per tick for an idle namespace, session or stream "
            "(wake-ups on change; heartbeats batched per node)."
        )
    if "s8_mb_written" in m:
        s8 = raw.get("s8") or {}
        w8 = s8.get("no_consumer") or {}
        rows = w8.get("rows_by_table") or {}
        top = ", ".join(f"`{t}` {n:,}" for t, n in list(rows.items())[:3]) or "—"
        text["s8"] = (
            f"**S8 (subscription from earliest).** {_num(w8.get('mb_written'), 1)} MB written "
            f"in {w8.get('window_s')} s with no consumer connected (rows: {top}; PUT answered "
            f"in {s8.get('put_s')} s). Creating a subscription should write its own row and "
            "nothing per event (deliveries are range rows written when handed out); rows of "
            "`orbit_deliveries` here mean deliveries materialised without a consumer."
        )
    order = ["s1", "ledger", "s2", "s4", "s5", "s5k", "s6", "s7", "s8"]
    return [text[k] for k in order if k in text]


def _settled(level: dict[str, Any]) -> str:
    settle = level.get("settle")
    if not isinstance(settle, dict):
        return ""
    return (
        f" (after the level waited {settle.get('waited_s')} s for the insert's flush, "
        f"dirty pages {settle.get('dirty_pages_before')} → {settle.get('dirty_pages_after')})"
    )


def _rel(path: str) -> str:
    marker = "reports/"
    return path[path.index(marker) :] if marker in path else path
