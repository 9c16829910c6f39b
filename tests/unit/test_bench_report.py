"""The bench report names the bottleneck of every target a run misses, with the run's own
figures (bench/bottlenecks.py via bench/report.py), and says nothing for targets met."""

from __future__ import annotations

from typing import Any

from bench import report


def _out(**ratios: float) -> dict[str, Any]:
    base = {k: None for k in report.RATIO_KEYS}
    base.update(ratios)
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
        "raw": {
            "s1": {
                "server_cpu_util": 0.9,
                "mariadb_cpu_util": 0.7,
                "workers_cpu_util": 0.1,
                "driver_cpu_util": 0.05,
                "completed_per_s": 250.0,
                "server_cpu_s_per_1000": 3.1,
            },
            "s4": {
                "levels": {
                    "10000": {
                        "tasks_per_s": 250.0,
                        "server_cpu_util": 0.7,
                        "mariadb_cpu_util": 0.68,
                    },
                    "1000000": {
                        "tasks_per_s": 180.0,
                        "server_cpu_util": 0.64,
                        "mariadb_cpu_util": 0.68,
                        "explain": [{"rows": 1}],
                        "backlog_insert_s": 38.5,
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
                "owners_1": {"server_cpu_s_per_1000": 3.5},
                "owners_100": {"server_cpu_s_per_1000": 21.0},
            },
        },
        "ratios": base,
    }


def test_missed_targets_are_named_with_the_runs_figures() -> None:
    md = report.markdown(_out(s1_vs_pgqueuer=0.2, s1_vs_db_limit=0.04, s5_100_owners_vs_1=0.2,
                              s4_1m_vs_10k=0.72, s6_rss_mb=60.0))  # fmt: skip
    section = md[md.index("## Targets not met") : md.index("## Figures")]
    assert "**S1 (end to end).** The box's CPU is the limit" in section
    assert "= 1.75 of 2 cores busy" in section and "2.80 ms of MariaDB CPU" in section
    assert "21.0 s with 100 owners against 3.5 with one" in section
    assert "180.0/s at 1M waiting tasks against 250.0 at 10k" in section
    assert "(0.70 → 0.64 cores)" in section
    assert "settled 21.0 s after the insert (dirty pages 6,648 → 901)" in md
    assert "after the level waited 21.0 s for the insert's flush" in section
    assert "S2" not in section and "S3" not in section  # not measured: nothing claimed


def test_no_section_when_every_measured_target_is_met() -> None:
    md = report.markdown(_out(s4_1m_vs_10k=0.9, s6_rss_mb=60.0, s2_p50_ms=8.0, s2_p99_ms=20.0))
    assert "## Targets not met" not in md
