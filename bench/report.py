"""Ratios, the JSON report and the markdown summary (and PNG plots when matplotlib exists)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from bench import bottlenecks, output

#: The targets: key -> (comparison, threshold, what is measured). ``ratios`` in the JSON has
#: exactly these keys (a number, or null when the figure behind it was not measured — ``raw``
#: says why).
TARGET_DEFS: dict[str, tuple[str, float, str]] = {
    "s1_vs_pgqueuer": (">=", 0.5, "S1 results delivered/s ÷ PgQueuer throughput (same run)"),
    "s1_vs_baseline": (">=", 2.5, "S1 ÷ S1 of the --baseline-tree checkout (same run)"),
    "s1_server_cpu_ms": ("<=", 1.0, "S1 server CPU ms per task"),
    "s1_mariadb_cpu_ms": ("<=", 0.8, "S1 MariaDB CPU ms per task"),
    "s1_statements_per_task": ("<=", 1.5, "S1 statements per task"),
    "s1_row_writes_per_task": ("<=", 8, "S1 rows inserted + updated + deleted per task"),
    "s1_index_entries_per_task": ("<=", 20, "S1 secondary-index entries written per task"),
    "s5_100_owners_vs_1": (">=", 0.8, "S5 delivered/s, 100 owners ÷ 1 owner"),
    "s5_jain_100_owners": (">=", 0.9, "S5 Jain's index over the 100 owners' results"),
    "s5_fairness_key_max_wait": (
        "<=",
        10,
        "S5 fairness key: most dispatches a non-flooding subject's task waited",
    ),
    "s2_p50_ms": ("<=", 10, "S2 idle submit → handler start p50 ms"),
    "s2_p99_ms": ("<=", 50, "S2 idle submit → handler start p99 ms"),
    "s4_1m_vs_10k": (">=", 0.8, "S4 delivered/s at 1M backlog ÷ at 10k"),
    "s6_rss_mb": ("<", 300, "S6 server RSS MB (200 sessions, 1M backlog)"),
    "s7_server_core": ("<", 0.05, "S7 idle server CPU, cores (1,000 namespaces)"),
    "s7_mariadb_core": ("<", 0.05, "S7 idle MariaDB CPU, cores (1,000 namespaces)"),
    "s8_mb_written": (
        "<",
        1.0,
        "S8 MB MariaDB wrote in 30 s after a subscription from earliest on 1M events",
    ),
}
RATIO_KEYS = tuple(TARGET_DEFS)
TARGETS = {k: f"{op} {v:g}" for k, (op, v, _) in TARGET_DEFS.items()}


def _get(d: Any, *path: str) -> Any:
    for p in path:
        if not isinstance(d, dict) or p not in d:
            return None
        d = d[p]
    return d


def _div(a: Any, b: Any) -> float | None:
    if not isinstance(a, int | float) or not isinstance(b, int | float) or not b:
        return None
    return round(a / b, 3)


def _mariadb_ms(fig: Any) -> float | None:
    v = _get(fig, "ledger", "per_task", "mariadb_cpu_ms")
    if isinstance(v, int | float):
        return v
    util, rate = _get(fig, "mariadb_cpu_util"), _get(fig, "completed_per_s")
    if isinstance(util, int | float) and isinstance(rate, int | float) and rate > 0 and util > 0:
        return round(util / rate * 1000, 3)
    return None


def ratios(raw: dict[str, Any]) -> dict[str, float | None]:
    s1 = raw.get("s1") or {}
    s4 = _get(raw, "s4", "levels") or {}
    rss = [_get(raw, "s4", "server_rss_mb_at_1m"), _get(raw, "s6", "rss_mb_with_sessions")]
    rss_values = [r for r in rss if isinstance(r, int | float)]
    per_task = _get(s1, "ledger", "per_task") or {}
    return {
        "s1_vs_pgqueuer": _div(
            s1.get("tasks_per_s"), _get(raw, "peers", "pgqueuer", "throughput", "per_s")
        ),
        "s1_vs_baseline": _div(s1.get("tasks_per_s"), _get(raw, "s1_baseline", "tasks_per_s")),
        "s1_server_cpu_ms": s1.get("server_cpu_s_per_1000"),
        "s1_mariadb_cpu_ms": _mariadb_ms(s1),
        "s1_statements_per_task": per_task.get("statements"),
        "s1_row_writes_per_task": per_task.get("row_writes"),
        "s1_index_entries_per_task": per_task.get("index_entries_written"),
        "s5_100_owners_vs_1": _div(
            _get(raw, "s5", "owners_100", "tasks_per_s"), _get(raw, "s5", "owners_1", "tasks_per_s")
        ),
        "s5_jain_100_owners": _get(raw, "s5", "owners_100", "per_owner_results", "jain_index"),
        "s5_fairness_key_max_wait": _get(raw, "s5", "fairness_key", "wait_dispatches", "max"),
        "s2_p50_ms": _get(raw, "s2", "submit_to_handler_start", "p50_ms"),
        "s2_p99_ms": _get(raw, "s2", "submit_to_handler_start", "p99_ms"),
        "s4_1m_vs_10k": _div(_get(s4, "1000000", "tasks_per_s"), _get(s4, "10000", "tasks_per_s")),
        "s6_rss_mb": max(rss_values) if rss_values else None,
        "s7_server_core": _get(raw, "s7", "server_core"),
        "s7_mariadb_core": _get(raw, "s7", "mariadb_core"),
        "s8_mb_written": _get(raw, "s8", "no_consumer", "mb_written"),
    }


def _fmt(v: Any) -> str:
    if v is None:
        return "—"
    if isinstance(v, float):
        return f"{v:,.3f}" if abs(v) < 10 else f"{v:,.1f}"
    if isinstance(v, int):
        return f"{v:,}"
    return str(v)


def markdown(out: dict[str, Any]) -> str:
    raw = out["raw"]
    r = out["ratios"]
    m = out["machine"]
    db = out.get("database") or {}
    lines = [
        f"# Orbit bench — {out['started_at']} ({out['mode']})",
        "",
        f"Machine: {m['cores']} cores, {m['memory_mb']:,} MB, {m['platform']}; load average "
        f"{m['load_avg']} at start, {m.get('load_avg_end')} at end (a shared box: compare "
        "ratios from the same run, not absolute figures across runs).",
        "Versions: " + ", ".join(f"{k} {v}" for k, v in m["versions"].items() if v),
    ]
    if db:
        lines.append(f"Database server: {db.get('description', db.get('kind'))}.")
    if out.get("commit"):
        lines.append(f"Code: commit {out['commit']}"
                     + (f"; baseline {out['baseline_commit']}" if out.get("baseline_commit")
                        else "") + ".")  # fmt: skip
    lines += [
        "",
        "## Targets (this run)",
        "",
        "| key | what | measured | target | met |",
        "| --- | --- | ---: | --- | --- |",
    ]
    for k in RATIO_KEYS:
        f = _target_fraction(k, r.get(k))
        met = "—" if f is None else ("yes" if f >= 1 else "**no**")
        lines.append(f"| `{k}` | {TARGET_DEFS[k][2]} | {_fmt(r.get(k))} | {TARGETS[k]} | {met} |")
    missed = [k for k in RATIO_KEYS if (f := _target_fraction(k, r.get(k))) is not None and f < 1]
    named = bottlenecks.lines(out, missed)
    if named:
        lines += ["", "## Targets not met: the bottleneck (with this run's figures)", ""]
        for text in named:
            lines += [text, ""]
        lines.pop()
    lines += ledger_table(raw)
    lines += _figures(out)
    prof = _get(raw, "s1", "profile")
    if isinstance(prof, dict) and prof.get("svg") and "samples" in prof:
        lines += ["", "## Profile of the server during S1", ""]
        lines.append(
            f"Flame graph `{_rel(prof['svg'])}`, summary `{_rel(prof.get('top', ''))}` "
            f"({prof.get('samples')} samples). Busiest asyncio tasks:"
        )
        lines.append("")
        for name, share in prof.get("by_task") or []:
            lines.append(f"- {share:.1%} {name}")
    if out.get("plots"):
        lines += ["", "## Plots", ""]
        lines += [f"![{p}]({p})" for p in out["plots"]]
    for note in out.get("notes") or []:
        lines += ["", note]
    lines += ["", "Raw figures: the JSON file of the same name.", ""]
    return "\n".join(lines)


#: The ledger's columns: (key in ``per_task``, heading).
LEDGER_COLUMNS = (
    ("statements", "statements"),
    ("transactions", "transactions"),
    ("rows_inserted", "rows inserted"),
    ("rows_updated", "rows updated"),
    ("rows_deleted", "rows deleted"),
    ("index_entries_written", "sec. index entries (+ delete-marked)"),
    ("fsyncs", "fsyncs"),
    ("redo_bytes", "redo bytes"),
    ("server_cpu_ms", "server CPU ms"),
    ("mariadb_cpu_ms", "MariaDB CPU ms"),
)


def ledger_legs(raw: dict[str, Any]) -> list[tuple[str, dict[str, Any]]]:
    legs = [("S1", _get(raw, "s1", "ledger")), ("S1 baseline", _get(raw, "s1_baseline", "ledger")),
            ("S5 1 owner", _get(raw, "s5", "owners_1", "ledger")),
            ("S5 100 owners", _get(raw, "s5", "owners_100", "ledger"))]  # fmt: skip
    return [(name, led) for name, led in legs if isinstance(led, dict) and led.get("per_task")]


def ledger_table(raw: dict[str, Any]) -> list[str]:
    """The per-task ledger of S1 and the S5 legs, and the tables that wrote the most."""
    legs = ledger_legs(raw)
    if not legs:
        return []
    out = ["", "## Ledger per task (MariaDB status counters and binary log of the window)", "",
           "| leg | tasks | " + " | ".join(h for _, h in LEDGER_COLUMNS) + " |",
           "| --- | ---: | " + " | ".join("---:" for _ in LEDGER_COLUMNS) + " |"]  # fmt: skip
    for name, led in legs:
        pt = led["per_task"]
        cells = []
        for key, _ in LEDGER_COLUMNS:
            v = pt.get(key)
            if key == "index_entries_written" and v is not None:
                cells.append(f"{_fmt(v)} (+{_fmt(pt.get('index_entries_delete_marked'))})")
            elif key == "redo_bytes" and v is not None:
                cells.append(f"{v:,.0f}")
            else:
                cells.append("not measured" if v is None else _fmt(v))
        out.append(f"| {name} | {led.get('tasks', '—'):,} | " + " | ".join(cells) + " |")
    for name, led in legs:
        tables = led.get("per_table") or {}
        n = led.get("tasks") or 0
        if tables and n:
            parts = [
                f"`{t}` {v['inserted'] / n:.2f} ins / {v['updated'] / n:.2f} upd"
                + (f" / {v['deleted'] / n:.2f} del" if v["deleted"] else "")
                + f", {v['index_written'] / n:.1f} idx"
                for t, v in list(tables.items())[:8]
            ]
            out += ["", f"{name} per task by table: " + "; ".join(parts) + "."]
        for note in led.get("notes") or []:
            out += ["", f"{name}: {note}."]
    return out


def _figures(out: dict[str, Any]) -> list[str]:
    raw = out["raw"]
    lines = [
        "",
        "## Figures",
        "",
        "Load = the 1-minute load average at the start → end of the step that measured the "
        "figure (2 cores; above 2 the box was oversubscribed by its other tenants).",
        "",
        "| figure | value | baseline (same run) | load |",
        "| --- | ---: | --- | --- |",
    ]
    steps = out.get("load_by_step") or {}

    def load(step: str) -> str:
        v = steps.get(step)
        return f"{v[0]} → {v[1]}" if v else "—"

    dbl = raw.get("db_limit") or {}
    base = (
        f"DB limit one-row {_fmt(_get(dbl, 'one_row', 'per_s'))}/s, "
        f"batched {_fmt(_get(dbl, 'batched', 'per_s'))}/s (load {load('DB limit')})"
    )
    pq = _get(raw, "peers", "pgqueuer") or {}
    if _get(pq, "throughput", "per_s") is not None:
        base += f"; PgQueuer throughput {_fmt(_get(pq, 'throughput', 'per_s'))}/s (load {load('peers')})"
    s1 = raw.get("s1") or {}
    row = lines.append
    row(
        f"| S1 end to end (results delivered/s) | {_fmt(s1.get('tasks_per_s'))} | {base} | {load('S1')} |"
    )
    sb = raw.get("s1_baseline") or {}
    if sb.get("tasks_per_s") is not None:
        row(
            f"| S1 of the baseline tree (delivered/s) | {_fmt(sb.get('tasks_per_s'))} | server "
            f"CPU s/1,000 {_fmt(sb.get('server_cpu_s_per_1000'))} | {load('S1 baseline')} |"
        )
    row(
        f"| S1 completed/s (tasks SUCCEEDED) | {_fmt(s1.get('completed_per_s'))} | | {load('S1')} |"
    )
    lat = s1.get("submit_to_result_ms") or {}
    row(
        f"| S1 submit → result delivery p50 / p99 ms | {_fmt(lat.get('p50_ms'))} / "
        f"{_fmt(lat.get('p99_ms'))} | at saturation, ≤ {_get(s1, 'config', 'max_outstanding')} "
        f"outstanding | {load('S1')} |"
    )
    row(
        f"| S1 server CPU s per 1,000 tasks | {_fmt(s1.get('server_cpu_s_per_1000'))} | "
        f"server CPU use {_fmt(s1.get('server_cpu_util'))} cores, workers "
        f"{_fmt(s1.get('workers_cpu_util'))}, MariaDB {_fmt(s1.get('mariadb_cpu_util'))} | {load('S1')} |"
    )
    s2 = raw.get("s2") or {}
    hs = s2.get("submit_to_handler_start") or {}
    pq_lat = _get(pq, "latency") or {}
    row(
        f"| S2 submit → handler start p50 / p99 ms | {_fmt(hs.get('p50_ms'))} / "
        f"{_fmt(hs.get('p99_ms'))} | PgQueuer LISTEN/NOTIFY {_fmt(pq_lat.get('p50_ms'))} / "
        f"{_fmt(pq_lat.get('p99_ms'))} | {load('S2')} |"
    )
    s3 = raw.get("s3") or {}
    if s3:
        row(
            f"| S3 single submit/s (16 clients) | {_fmt(_get(s3, 'single', 'per_s'))} | PgQueuer "
            f"one-by-one enqueue {_fmt(_get(pq, 'enqueue_one_by_one', 'per_s'))}/s | {load('S3')} |"
        )
        row(
            f"| S3 batch submit/s | {_fmt(_get(s3, 'batch', 'per_s'))} | DB batched insert | {load('S3')} |"
        )
    for level, fig in (_get(raw, "s4", "levels") or {}).items():
        la = fig.get("load_avg") or ["—"]
        row(
            f"| S4 at {int(level):,} backlog: delivered/s (completed/s) | "
            f"{_fmt(fig.get('tasks_per_s'))} ({_fmt(fig.get('completed_per_s'))}) | dispatch "
            f"EXPLAIN: {_explain_note(fig.get('explain'))};{_settle_note(fig.get('settle'))} "
            "subscriber leg alone "
            f"{_fmt(_get(fig, 'subscriber_leg', 'acked_per_s'))} acks/s | {la[0]} |"
        )
    for key, title in (("owners_1", "1 owner"), ("owners_100", "100 owners")):
        fig = _get(raw, "s5", key)
        if isinstance(fig, dict) and "tasks_per_s" in fig:
            po = fig.get("per_owner_results") or {}
            la = fig.get("load_avg") or ["—"]
            lat5 = fig.get("submit_to_result_ms") or {}
            row(
                f"| S5 {title}: delivered/s (completed/s) | {_fmt(fig['tasks_per_s'])} "
                f"({_fmt(fig.get('completed_per_s'))}) | p50/p99 {_fmt(lat5.get('p50_ms'))} / "
                f"{_fmt(lat5.get('p99_ms'))} ms; server CPU s/1,000 "
                f"{_fmt(fig.get('server_cpu_s_per_1000'))}; per-owner results min/max "
                f"{po.get('min')}/{po.get('max')}, Jain {po.get('jain_index')}"
                f"{_backlog_note(fig)} | {la[0]} |"
            )
    fk = _get(raw, "s5", "fairness_key")
    if isinstance(fk, dict):
        w = fk.get("wait_dispatches") or {}
        if fk.get("not_measured"):
            ref = _get(fk, "without_key", "wait_dispatches") or {}
            also = (
                f"; the same load without the field: max {_fmt(ref.get('max'))}, p99 "
                f"{_fmt(ref.get('p99'))} dispatches"
                if ref.get("max") is not None else ""
            )  # fmt: skip
            row(f"| S5 fairness key: dispatches a non-flooding subject's task waited | not "
                f"measured | {fk['not_measured']}{also} | {load('S5')} |")  # fmt: skip
        elif w:
            row(
                f"| S5 fairness key: dispatches a non-flooding subject's task waited, max / p99 "
                f"/ p50 | {_fmt(w.get('max'))} / {_fmt(w.get('p99'))} / {_fmt(w.get('p50'))} | "
                f"{w.get('tasks')} tasks of 99 subjects while subject 0's flood of "
                f"{_fmt(fk.get('flood'))} waited ({_fmt(fk.get('flood_left_when_others_began'))}"
                f" → {_fmt(fk.get('flood_left_when_others_ended'))} left); never started "
                f"{w.get('never_started')} | {load('S5')} |"
            )
    s6 = raw.get("s6") or {}
    if s6.get("rss_mb_with_sessions") is not None:
        row(
            f"| S6 server RSS, {s6.get('sessions_connected')} sessions + 1M backlog | "
            f"{_fmt(s6.get('rss_mb_with_sessions'))} MB | before they connected "
            f"{_fmt(s6.get('rss_mb_before'))} MB | {load('S6')} |"
        )
    s7 = raw.get("s7") or {}
    if s7.get("server_core") is not None:
        rates = s7.get("rates") or {}
        row(
            f"| S7 idle, {s7.get('namespaces')} namespaces (a session and a stream each): "
            f"server / MariaDB cores | {_fmt(s7.get('server_core'))} / "
            f"{_fmt(s7.get('mariadb_core'))} | {_fmt(rates.get('statements_per_s'))} "
            f"statements/s, {_fmt(rates.get('transactions_per_s'))} transactions/s, "
            f"{_fmt(rates.get('row_writes_per_s'))} rows written/s; server RSS "
            f"{_fmt(s7.get('server_rss_mb'))} MB; probes answered "
            f"{s7.get('probes_answered')} of {s7.get('namespaces')}, ready after "
            f"{s7.get('ready_s')} s | {load('S7')} |"
        )
    s8 = raw.get("s8") or {}
    for key, title in (("no_consumer", "no consumer"), ("one_consumer", "one consumer")):
        w8 = s8.get(key)
        if isinstance(w8, dict):
            extra = f"; {w8.get('received')} deliveries received" if key == "one_consumer" else ""
            rows = w8.get("rows_by_table") or {}
            top = ", ".join(f"`{t}` {n:,}" for t, n in list(rows.items())[:3])
            row(
                f"| S8 subscription from earliest on {_fmt(s8.get('events'))} events, "
                f"{w8.get('window_s'):g} s, {title}: MB written | {_fmt(w8.get('mb_written'))} | "
                f"Handler_write {_fmt(w8.get('Handler_write'))}, redo "
                f"{_fmt(w8.get('Innodb_os_log_written'))} B, data "
                f"{_fmt(w8.get('Innodb_data_written'))} B; rows {top or '—'}{extra} | {load('S8')} |"
            )
    for name, peer in (raw.get("peers") or {}).items():
        if isinstance(peer, dict):
            for k, v in peer.items():
                if isinstance(v, dict) and "per_s" in v:
                    row(f"| peer {name} {k} | {_fmt(v['per_s'])}/s | | {load('peers')} |")
                elif k in ("not_measured", "error"):
                    row(f"| peer {name} | not measured | {v} | |")
    for key in ("s1", "s2", "s3", "s4", "s5", "s6", "s7", "s8", "s1_baseline", "db_limit"):
        err = _get(raw, key, "error")
        if err:
            row(f"| {key.upper()} | failed | {err} | |")
    return lines


def _rel(path: str) -> str:
    """``path`` relative to the repository (reports/…) when it is inside it."""
    marker = "reports/"
    return path[path.index(marker) :] if marker in path else path


def _backlog_note(fig: dict[str, Any]) -> str:
    """S5: the backlog every owner kept in the window, and the results per worker process."""
    b = fig.get("backlog") or {}
    if not b:
        return ""
    po = fig.get("per_owner_results") or {}
    by = po.get("by_worker_process")
    out = (
        f"; backlog {_fmt(b.get('max_outstanding'))}, smallest owner backlog in the window "
        f"{_fmt(b.get('min_owner_backlog_in_window'))}"
    )
    if b.get("ran_out"):
        out += f" (window closed early: {b['ran_out']} ran out)"
    if by and fig.get("owners", 1) > 1:
        out += f"; results by worker process {' / '.join(str(x) for x in by)}"
    if fig.get("bench_cpu_util") is not None:
        out += (
            f"; CPU (cores) server {_fmt(fig.get('server_cpu_util'))}, workers "
            f"{_fmt(fig.get('workers_cpu_util'))}, bench {_fmt(fig['bench_cpu_util'])}"
        )
    return out


def _settle_note(settle: Any) -> str:
    """How long the S4 level waited for MariaDB to flush the inserted backlog."""
    if not isinstance(settle, dict):
        return ""
    return (
        f" settled {settle.get('waited_s', '—')} s after the insert (dirty pages "
        f"{_fmt(settle.get('dirty_pages_before'))} → {_fmt(settle.get('dirty_pages_after'))});"
    )


def _explain_note(plan: Any) -> str:
    if not isinstance(plan, list) or not plan:
        return "—"
    p = plan[0]
    return f"{p.get('type')} on `{p.get('key')}`, rows {p.get('rows')}"


def write(out: dict[str, Any], out_dir: Path, stem: str) -> list[Path]:
    """``<stem>.json``, ``<stem>.md`` and the PNG plots (``<stem>-*.png``, when matplotlib
    is installed: ``pip install -e '.[bench]'``; without it, or when a plot fails, the run
    goes on and the summary says so) in ``out_dir``, without machine paths."""
    out_dir.mkdir(parents=True, exist_ok=True)
    jpath = out_dir / f"{stem}.json"
    mpath = out_dir / f"{stem}.md"
    plots: list[Path] = []
    try:
        import matplotlib  # noqa: F401
    except ImportError:
        out.setdefault("notes", []).append(
            "Plots skipped: matplotlib is not installed (`pip install -e '.[bench]'`)."
        )
    else:
        try:
            plots = _plots(out, out_dir, stem)
        except Exception as exc:  # a plot must never fail the run
            out.setdefault("notes", []).append(f"Plots failed: {type(exc).__name__}: {exc}")
    out["plots"] = [p.name for p in plots]
    clean = output.scrub_obj(out)
    jpath.write_text(json.dumps(clean, indent=2, default=str) + "\n", encoding="utf-8")
    mpath.write_text(output.scrub(markdown(clean)), encoding="utf-8")
    return [jpath, mpath, *plots]


def _target_fraction(key: str, value: Any) -> float | None:
    """How far ``value`` is toward its target: 1.0 = met exactly, above 1 = met with room
    (a lower-is-better figure of 0 counts as 100: met)."""
    if not isinstance(value, int | float) or isinstance(value, bool):
        return None
    op, target, _ = TARGET_DEFS[key]
    if op.startswith(">"):
        return value / target if value > 0 else None
    if value <= 0:
        return 100.0
    frac = target / value
    return frac if op == "<=" or value < target else min(frac, 0.999)


def _plots(out: dict[str, Any], out_dir: Path, stem: str) -> list[Path]:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    import matplotlib.ticker

    raw = out["raw"]
    load = out["machine"].get("load_avg"), out["machine"].get("load_avg_end")
    foot = f"load average at start {load[0]}, at end {load[1]} (shared 2-core box)"
    paths: list[Path] = []

    def save(fig: Any, name: str) -> None:
        fig.text(0.01, 0.01, foot, fontsize=7, color="grey")
        fig.tight_layout(rect=(0, 0.04, 1, 1))
        path = out_dir / f"{stem}-{name}.png"
        fig.savefig(path, dpi=100)
        plt.close(fig)
        paths.append(path)

    # 1. every ratio against its target
    keys, fracs, labels = [], [], []
    for k in RATIO_KEYS:
        f = _target_fraction(k, out["ratios"].get(k))
        if f is not None:
            keys.append(k)
            fracs.append(f)
            labels.append(f"{_fmt(out['ratios'][k])} ({TARGETS[k]})")
    if keys:
        fig, ax = plt.subplots(figsize=(8, 4))
        colors = ["tab:green" if f >= 1 else "tab:red" for f in fracs]
        bars = ax.barh(keys, fracs, color=colors)
        ax.axvline(1.0, color="black", linewidth=1)
        ax.set_xscale("log")
        ticks = [t for t in (0.01, 0.02, 0.05, 0.1, 0.2, 0.5, 1, 2, 5, 10, 20)
                 if min(fracs) / 2 <= t <= max(fracs) * 2]  # fmt: skip
        ax.set_xticks(ticks, [f"{t:g}" for t in ticks])
        ax.xaxis.set_minor_formatter(matplotlib.ticker.NullFormatter())
        ax.set_xlabel("measured / target (1 = target met; log scale)")
        ax.invert_yaxis()
        for bar, text in zip(bars, labels, strict=True):
            ax.text(bar.get_width(), bar.get_y() + bar.get_height() / 2, " " + text,
                    va="center", fontsize=8)  # fmt: skip
        ax.set_title("Targets: each figure against its target (same run)")
        save(fig, "ratios")

    # 2. S1 (and S5) throughput next to the same run's baselines
    names, values = [], []
    for label, v in (
        ("S1 delivered", _get(raw, "s1", "tasks_per_s")),
        ("S1 completed", _get(raw, "s1", "completed_per_s")),
        ("S5 1 owner", _get(raw, "s5", "owners_1", "tasks_per_s")),
        ("S5 100 owners", _get(raw, "s5", "owners_100", "tasks_per_s")),
        ("DB one-row", _get(raw, "db_limit", "one_row", "per_s")),
        ("DB batched", _get(raw, "db_limit", "batched", "per_s")),
        ("PgQueuer thr.", _get(raw, "peers", "pgqueuer", "throughput", "per_s")),
        ("Procrastinate", _get(raw, "peers", "procrastinate", "drain", "per_s")),
    ):
        if isinstance(v, int | float):
            names.append(label)
            values.append(v)
    if names:
        fig, ax = plt.subplots(figsize=(8, 3.5))
        colors = ["tab:blue" if n.startswith(("S1", "S5")) else "tab:grey" for n in names]
        bars = ax.bar(names, values, color=colors)
        ax.bar_label(bars, fmt="%.0f", fontsize=8)
        ax.set_ylabel("tasks/s")
        ax.set_title("End-to-end throughput and the same run's baselines")
        ax.tick_params(axis="x", labelsize=8, rotation=20)
        save(fig, "throughput")

    # 3. S4: throughput against the backlog
    levels = _get(raw, "s4", "levels") or {}
    pts = sorted((int(k), v) for k, v in levels.items() if isinstance(v, dict))
    if pts:
        fig, ax = plt.subplots(figsize=(6, 3.5))
        xs = [k for k, _ in pts]
        ax.plot(xs, [v.get("tasks_per_s") for _, v in pts], "o-", label="results delivered/s")
        ax.plot(xs, [v.get("completed_per_s") for _, v in pts], "s--", label="tasks completed/s")
        ax.set_xscale("log")
        ax.set_xlabel("WAITING tasks in the queue (not due)")
        ax.set_ylabel("tasks/s")
        ax.set_ylim(bottom=0)
        legs = [_get(v, "subscriber_leg", "acked_per_s") for _, v in pts]
        if any(isinstance(x, int | float) for x in legs):
            ax2 = ax.twinx()
            ax2.plot(xs, legs, "^:", color="tab:green", label="subscriber leg alone, acks/s")
            ax2.set_ylabel("acks/s (subscriber leg alone)")
            ax2.set_ylim(bottom=0)
            ax2.legend(fontsize=8, loc="lower right")
        ax.legend(fontsize=8, loc="lower left")
        ax.set_title("S4: S1 throughput vs. backlog")
        save(fig, "s4-backlog")

    # 4. S2: latency percentiles (and PgQueuer's, measured the same way)
    series = [
        ("submit → handler start", _get(raw, "s2", "submit_to_handler_start")),
        ("submit → result delivery", _get(raw, "s2", "submit_to_result_delivery")),
        ("PgQueuer LISTEN/NOTIFY", _get(raw, "peers", "pgqueuer", "latency")),
    ]
    series = [(n, v) for n, v in series if isinstance(v, dict) and v.get("p50_ms") is not None]
    if series:
        fig, ax = plt.subplots(figsize=(7, 3.5))
        qs = ["p50_ms", "p90_ms", "p99_ms"]
        width = 0.8 / len(series)
        for i, (name, v) in enumerate(series):
            xs = [j + i * width for j in range(len(qs))]
            vals = [v.get(q) for q in qs]
            bars = ax.bar(xs, [x or 0 for x in vals], width, label=name)
            ax.bar_label(bars, labels=["—" if x is None else f"{x:.1f}" for x in vals],
                         fontsize=7)  # fmt: skip
        ax.set_xticks([j + width * (len(series) - 1) / 2 for j in range(len(qs))],
                      ["p50", "p90", "p99"])  # fmt: skip
        ax.axhline(10, color="tab:green", linestyle=":", linewidth=1, label="p50 target 10 ms")
        ax.axhline(50, color="tab:red", linestyle=":", linewidth=1, label="p99 target 50 ms")
        ax.set_ylabel("ms")
        ax.legend(fontsize=7)
        ax.set_title("S2: idle-system latency percentiles")
        save(fig, "s2-latency")

    # 5. S5: one owner vs 100 owners
    one, many = _get(raw, "s5", "owners_1"), _get(raw, "s5", "owners_100")
    if isinstance(one, dict) and isinstance(many, dict) and "tasks_per_s" in one:
        fig, (a1, a2) = plt.subplots(1, 2, figsize=(8, 3.2))
        for ax, key, unit in ((a1, "tasks_per_s", "results delivered/s"),
                              (a2, "completed_per_s", "tasks completed/s")):  # fmt: skip
            bars = ax.bar(["1 owner", "100 owners"], [one.get(key) or 0, many.get(key) or 0],
                          color=["tab:grey", "tab:blue"])  # fmt: skip
            ax.bar_label(bars, fmt="%.0f", fontsize=8)
            ax.set_ylabel(unit)
        jain = _get(many, "per_owner_results", "jain_index")
        fig.suptitle(f"S5: the same load from 1 vs 100 owners (Jain index of 100: {jain})",
                     fontsize=10)  # fmt: skip
        save(fig, "s5-owners")
    return paths
