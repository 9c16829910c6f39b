"""The bench report: targets met or not, and the bottleneck of every missed target named with
the run's own figures (bench/bottlenecks.py via bench/report.py); nothing said for targets
that were met or not measured."""

from __future__ import annotations

from typing import Any

from bench import report


def _ledger(tasks: int = 1000) -> dict[str, Any]:
    per_task = {"statements": 7.0, "transactions": 0.33, "row_writes": 16.3,
                "index_entries_written": 53.1, "index_entries_delete_marked": 27.0,
                "fsyncs": 0.23, "redo_bytes": 16000.0, "server_cpu_ms": 1.8,
                "mariadb_cpu_ms": 1.9, "rows_inserted": 9.0, "rows_updated": 7.3,
                "rows_deleted": 0.0}  # fmt: skip
    return {
        "tasks": tasks,
        "per_task": per_task,
        "per_table": {
            "pulse_tasks": {
                "inserted": 1000,
                "updated": 3000,
                "deleted": 0,
                "index_written": 26000,
                "index_delete_marked": 18000,
            },
            "orbit_events": {
                "inserted": 4000,
                "updated": 0,
                "deleted": 0,
                "index_written": 8000,
                "index_delete_marked": 0,
            },
        },
    }


def _out(**raw_extra: Any) -> dict[str, Any]:
    raw: dict[str, Any] = {
        "s1": {
            "tasks_per_s": 250.0,
            "server_cpu_util": 0.9,
            "mariadb_cpu_util": 0.7,
            "workers_cpu_util": 0.1,
            "driver_cpu_util": 0.05,
            "completed_per_s": 250.0,
            "server_cpu_s_per_1000": 3.1,
            "ledger": _ledger(),
        },
        "peers": {"pgqueuer": {"throughput": {"per_s": 1000.0}}},
        "s4": {
            "levels": {
                "10000": {"tasks_per_s": 250.0, "server_cpu_util": 0.7, "mariadb_cpu_util": 0.68},
                "1000000": {
                    "tasks_per_s": 180.0,
                    "server_cpu_util": 0.64,
                    "mariadb_cpu_util": 0.68,
                    "explain": [{"rows": 1}],
                    "settle": {
                        "waited_s": 21.0,
                        "dirty_pages_before": 6648,
                        "dirty_pages_after": 901,
                        "pool_pages": 8112,
                    },
                },
            }
        },
        "s5": {
            "owners_1": {"tasks_per_s": 200.0, "server_cpu_s_per_1000": 3.5, "ledger": _ledger()},
            "owners_100": {
                "tasks_per_s": 40.0,
                "server_cpu_s_per_1000": 21.0,
                "per_owner_results": {"min": 0, "max": 18, "jain_index": 0.31},
            },
            "fairness_key": {
                "not_measured": "the server does not take the submit field "
                "fairness_key (400: unknown field)"
            },
        },
        "s2": {"submit_to_handler_start": {"p50_ms": 8.0, "p99_ms": 20.0}},
    }
    raw.update(raw_extra)
    return {
        "started_at": "2026-11-30T00:00:00+00:00",
        "mode": "full",
        "machine": {
            "cores": 2,
            "memory_mb": 1024,
            "platform": "test",
            "load_avg": [0, 0, 0],
            "versions": {},
        },
        "raw": raw,
        "ratios": report.ratios(raw),
    }


def test_ratios_come_from_the_runs_figures() -> None:
    r = _out()["ratios"]
    assert set(r) == set(report.RATIO_KEYS)
    assert r["s1_vs_pgqueuer"] == 0.25
    assert r["s1_statements_per_task"] == 7.0 and r["s1_index_entries_per_task"] == 53.1
    assert r["s1_mariadb_cpu_ms"] == 1.9  # from the ledger, not the utilisation
    assert r["s5_100_owners_vs_1"] == 0.2 and r["s5_jain_100_owners"] == 0.31
    assert r["s4_1m_vs_10k"] == 0.72
    assert r["s5_fairness_key_max_wait"] is None and r["s1_vs_baseline"] is None


def test_missed_targets_are_named_with_the_runs_figures() -> None:
    md = report.markdown(_out())
    section = md[md.index("## Targets not met") : md.index("## Ledger per task")]
    assert "The box's CPU is the limit" in section
    assert "= 1.75 of 2 cores busy" in section and "2.80 ms of MariaDB CPU" in section
    assert "`pulse_tasks` 26.0" in section  # the table that wrote the most index entries
    assert "180.0/s at 1M waiting tasks against 250.0 at 10k" in section
    assert "after the level waited 21.0 s for the insert's flush" in section
    assert "min 0, max 18 (Jain 0.31)" in section
    assert "S2" not in section  # met: nothing claimed
    assert "S7" not in section and "S8" not in section  # not measured: nothing claimed
    assert "| S5 fairness key: dispatches a non-flooding subject's task waited | not measured" in md
    assert "| S1 | 1,000 | 7.000 | 0.330 |" in md
    assert "53.1 (+27.0)" in md


def test_no_section_when_every_measured_target_is_met() -> None:
    raw = {"s2": {"submit_to_handler_start": {"p50_ms": 8.0, "p99_ms": 20.0}},
           "s6": {"rss_mb_with_sessions": 60.0}, "s7": {"server_core": 0.01, "mariadb_core": 0.0}}  # fmt: skip
    out = _out()
    out["raw"] = raw
    out["ratios"] = report.ratios(raw)
    md = report.markdown(out)
    assert "## Targets not met" not in md
    assert (
        "| `s7_mariadb_core` | S7 idle MariaDB CPU, cores (1,000 namespaces) | 0.000 | < 0.05 | yes |"
        in md
    )


def test_target_fraction_directions() -> None:
    f = report._target_fraction
    assert f("s1_vs_pgqueuer", 0.25) == 0.5  # higher is better
    assert f("s1_statements_per_task", 3.0) == 0.5  # lower is better
    assert f("s5_fairness_key_max_wait", 0) == 100.0  # nothing waited: met
    assert f("s6_rss_mb", 300) < 1  # a strict bound is missed at equality
    assert f("s2_p50_ms", 10) == 1.0  # an inclusive bound is met at equality
    assert f("s1_vs_pgqueuer", None) is None
