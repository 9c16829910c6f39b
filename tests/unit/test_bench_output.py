"""What the bench writes: no machine paths, published names by what a run measures, one
history line per published run; and the fairness-key leg's arithmetic."""

from __future__ import annotations

from bench import fairness_key, output


def test_scrub_removes_machine_paths() -> None:
    root = "/work/wt/bench"
    text = (
        "noop (/work/wt/bench/orbit/storage/db.py:12);write (/root/.pyenv/versions/3.11.7/"
        "lib/python3.11/asyncio/streams.py:3);run (/work/wt/bench/.venv/lib/python3.11/"
        "site-packages/aiomysql/connection.py:9) /tmp/orbit-bench-s1.collapsed "
        "GET /v1/namespaces/x/tasks http://127.0.0.1:80/healthz /work/wt/bench"
    )
    clean = output.scrub(text, root)
    assert "/work" not in clean and "/root" not in clean and "/tmp" not in clean
    assert "(orbit/storage/db.py:12)" in clean
    assert "(asyncio/streams.py:3)" in clean
    assert "(aiomysql/connection.py:9)" in clean
    assert "orbit-bench-s1.collapsed" in clean
    assert "GET /v1/namespaces/x/tasks http://127.0.0.1:80/healthz" in clean  # not a file path
    assert output.scrub_obj({"a": ["/work/wt/bench/reports/x.svg"]}, root) == {
        "a": ["reports/x.svg"]
    }


def test_run_names_and_history_line() -> None:
    assert output.run_name("full", None) == "suite"
    assert output.run_name("quick", None) == "quick"
    assert output.run_name("full", ["S5", "s1"]) == "s1-s5"
    out = {
        "started_at": "2026-12-01T00:00:00+00:00",
        "mode": "full",
        "commit": "abc1234",
        "database": {"kind": "private"},
        "machine": {"load_avg": [1.5, 1, 1], "load_avg_end": [2.5, 2, 2]},
        "ratios": {"s1_vs_pgqueuer": 0.2},
        "raw": {
            "s1": {"tasks_per_s": 226.0},
            "peers": {"pgqueuer": {"throughput": {"per_s": 1144}}},
        },
    }
    line = output.history_line(out, "suite")
    assert line["load"] == [1.5, 2.5] and line["commit"] == "abc1234"
    assert line["figures"] == {"s1_per_s": 226.0, "pgqueuer_per_s": 1144}
    assert line["ratios"] == {"s1_vs_pgqueuer": 0.2} and line["database"] == "private"


def test_fairness_key_waits_count_dispatches_between_submit_and_start() -> None:
    # flood f1..f5 start at 1..5; subject b's task answered at 1.5 and started at 4.5:
    # f2, f3, f4 started in between -> 3. c's task answered at 5.5, started at 6: 0 between.
    starts = {"f1": 1.0, "f2": 2.0, "f3": 3.0, "f4": 4.0, "f5": 5.0, "b": 4.5, "c": 6.0}
    answered = {k: 0.5 for k in ("f1", "f2", "f3", "f4", "f5")} | {"b": 1.5, "c": 5.5, "d": 5.8}
    subject = {k: "flood" for k in ("f1", "f2", "f3", "f4", "f5")} | {"b": "b", "c": "c", "d": "d"}
    counts, never = fairness_key.waits(starts, answered, subject, "flood")
    assert sorted(counts) == [0, 3] and never == 1  # d never started
    s = fairness_key.summary(counts, never)
    assert s["max"] == 3 and s["tasks"] == 2 and s["never_started"] == 1
    # a task that started before its submit was answered waited for nothing
    counts, _ = fairness_key.waits({"x": 1.0, "f": 0.5}, {"x": 2.0}, {"x": "x"}, "flood")
    assert counts == [0]
