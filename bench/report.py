"""Ratios, the JSON report and the markdown summary (and PNG plots when matplotlib exists)."""

from __future__ import annotations

import datetime as dt
import json
from pathlib import Path
from typing import Any

#: Exactly the keys of issue 9 item 5 (values are numbers, or null when not measured; the
#: reason is in ``raw``).
RATIO_KEYS = (
    "s1_vs_pgqueuer",
    "s1_vs_db_limit",
    "s2_p50_ms",
    "s2_p99_ms",
    "s3_single_vs_pgqueuer",
    "s3_batch_per_s",
    "s4_1m_vs_10k",
    "s5_100_owners_vs_1",
    "s6_rss_mb",
)

TARGETS = {
    "s1_vs_pgqueuer": ">= 1.0",
    "s1_vs_db_limit": ">= 0.5",
    "s2_p50_ms": "<= 10",
    "s2_p99_ms": "<= 50",
    "s3_single_vs_pgqueuer": ">= 1.0",
    "s3_batch_per_s": ">= 20000",
    "s4_1m_vs_10k": ">= 0.8",
    "s5_100_owners_vs_1": ">= 0.8",
    "s6_rss_mb": "< 300",
}


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


def ratios(raw: dict[str, Any]) -> dict[str, float | None]:
    s1 = _get(raw, "s1", "tasks_per_s")
    pgq_tp = _get(raw, "peers", "pgqueuer", "throughput", "per_s")
    pgq_one = _get(raw, "peers", "pgqueuer", "enqueue_one_by_one", "per_s")
    db_batched = _get(raw, "db_limit", "batched", "per_s")
    s4 = _get(raw, "s4", "levels") or {}
    rss = [
        _get(raw, "s4", "server_rss_mb_at_1m"),
        _get(raw, "s6", "rss_mb_with_sessions"),
    ]
    rss_values = [r for r in rss if isinstance(r, int | float)]
    return {
        "s1_vs_pgqueuer": _div(s1, pgq_tp),
        "s1_vs_db_limit": _div(s1, db_batched),
        "s2_p50_ms": _get(raw, "s2", "submit_to_handler_start", "p50_ms"),
        "s2_p99_ms": _get(raw, "s2", "submit_to_handler_start", "p99_ms"),
        "s3_single_vs_pgqueuer": _div(_get(raw, "s3", "single", "per_s"), pgq_one),
        "s3_batch_per_s": _get(raw, "s3", "batch", "per_s"),
        "s4_1m_vs_10k": _div(_get(s4, "1000000", "tasks_per_s"), _get(s4, "10000", "tasks_per_s")),
        "s5_100_owners_vs_1": _div(
            _get(raw, "s5", "owners_100", "tasks_per_s"), _get(raw, "s5", "owners_1", "tasks_per_s")
        ),
        "s6_rss_mb": max(rss_values) if rss_values else None,
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
    lines = [
        f"# Orbit bench — {out['started_at']} ({out['mode']})",
        "",
        f"Machine: {m['cores']} cores, {m['memory_mb']:,} MB, {m['platform']}; load average "
        f"{m['load_avg']} at start, {m.get('load_avg_end')} at end (a shared box: compare "
        "ratios from the same run, not absolute figures across runs).",
        "Versions: " + ", ".join(f"{k} {v}" for k, v in m["versions"].items() if v),
        "",
        "## Targets (ratios from this run)",
        "",
        "| key | measured | target |",
        "| --- | ---: | --- |",
    ]
    for k in RATIO_KEYS:
        lines.append(f"| `{k}` | {_fmt(r.get(k))} | {TARGETS[k]} |")
    lines += ["", "## Figures", "", "| figure | value | baseline (same run) |", "| --- | ---: | --- |"]
    dbl = raw.get("db_limit") or {}
    base = (
        f"DB limit one-row {_fmt(_get(dbl, 'one_row', 'per_s'))}/s, "
        f"batched {_fmt(_get(dbl, 'batched', 'per_s'))}/s"
    )
    pq = _get(raw, "peers", "pgqueuer") or {}
    if _get(pq, "throughput", "per_s") is not None:
        base += f"; PgQueuer throughput {_fmt(_get(pq, 'throughput', 'per_s'))}/s"
    s1 = raw.get("s1") or {}
    lines.append(f"| S1 end to end (results delivered/s) | {_fmt(s1.get('tasks_per_s'))} | {base} |")
    lines.append(f"| S1 completed/s (tasks SUCCEEDED) | {_fmt(s1.get('completed_per_s'))} | |")
    lat = s1.get("submit_to_result_ms") or {}
    lines.append(
        f"| S1 submit → result delivery p50 / p99 ms | {_fmt(lat.get('p50_ms'))} / "
        f"{_fmt(lat.get('p99_ms'))} | at saturation, ≤ {_get(s1, 'config', 'max_outstanding')} "
        "outstanding |"
    )
    lines.append(
        f"| S1 server CPU s per 1,000 tasks | {_fmt(s1.get('server_cpu_s_per_1000'))} | "
        f"server CPU use {_fmt(s1.get('server_cpu_util'))} cores, workers "
        f"{_fmt(s1.get('workers_cpu_util'))} |"
    )
    s2 = raw.get("s2") or {}
    hs = s2.get("submit_to_handler_start") or {}
    pq_lat = _get(pq, "latency") or {}
    lines.append(
        f"| S2 submit → handler start p50 / p99 ms | {_fmt(hs.get('p50_ms'))} / "
        f"{_fmt(hs.get('p99_ms'))} | PgQueuer LISTEN/NOTIFY {_fmt(pq_lat.get('p50_ms'))} / "
        f"{_fmt(pq_lat.get('p99_ms'))} |"
    )
    s3 = raw.get("s3") or {}
    lines.append(
        f"| S3 single submit/s (16 clients) | {_fmt(_get(s3, 'single', 'per_s'))} | PgQueuer "
        f"one-by-one enqueue {_fmt(_get(pq, 'enqueue_one_by_one', 'per_s'))}/s |"
    )
    lines.append(f"| S3 batch submit/s | {_fmt(_get(s3, 'batch', 'per_s'))} | DB batched insert |")
    for level, fig in (_get(raw, "s4", "levels") or {}).items():
        lines.append(f"| S4 S1 tasks/s at {int(level):,} backlog | {_fmt(fig.get('tasks_per_s'))} | |")
    for name, peer in (raw.get("peers") or {}).items():
        if isinstance(peer, dict):
            for k, v in peer.items():
                if isinstance(v, dict) and "per_s" in v:
                    lines.append(f"| peer {name} {k} | {_fmt(v['per_s'])}/s | |")
                elif k in ("not_measured", "error"):
                    lines.append(f"| peer {name} | not measured | {v} |")
    for note in out.get("notes") or []:
        lines += ["", note]
    lines += ["", "Raw figures: the JSON file of the same name.", ""]
    return "\n".join(lines)


def write(out: dict[str, Any], out_dir: Path, label: str) -> list[Path]:
    out_dir.mkdir(parents=True, exist_ok=True)
    stamp = dt.datetime.now().strftime("%Y-%m-%dT%H%M")
    stem = f"{stamp}-{label}" if label else stamp
    jpath = out_dir / f"{stem}.json"
    mpath = out_dir / f"{stem}.md"
    jpath.write_text(json.dumps(out, indent=2, default=str) + "\n", encoding="utf-8")
    mpath.write_text(markdown(out), encoding="utf-8")
    paths = [jpath, mpath]
    try:
        import matplotlib  # noqa: F401
    except ImportError:
        pass
    else:  # pragma: no cover - matplotlib is not a dependency
        paths += _plots(out, out_dir, stem)
    return paths


def _plots(out: dict[str, Any], out_dir: Path, stem: str) -> list[Path]:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    raw = out["raw"]
    names, values = [], []
    for label, v in (
        ("S1", _get(raw, "s1", "tasks_per_s")),
        ("DB one-row", _get(raw, "db_limit", "one_row", "per_s")),
        ("DB batched", _get(raw, "db_limit", "batched", "per_s")),
        ("PgQueuer", _get(raw, "peers", "pgqueuer", "throughput", "per_s")),
    ):
        if isinstance(v, int | float):
            names.append(label)
            values.append(v)
    fig, ax = plt.subplots(figsize=(6, 3))
    ax.bar(names, values)
    ax.set_ylabel("tasks/s")
    path = out_dir / f"{stem}-throughput.png"
    fig.tight_layout()
    fig.savefig(path)
    plt.close(fig)
    return [path]
