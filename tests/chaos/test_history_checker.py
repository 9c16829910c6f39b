"""The history checker (tests/chaos/history.py) against hand-made histories: a legal one
passes, and each illegal one is reported with its anomaly kind — a checker that cannot
fail would prove nothing."""

from __future__ import annotations

import copy
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent))
from history import Recorder, check, load

Record = dict[str, Any]
T1, T2, T3 = "a" * 32, "b" * 32, "c" * 32
A1, A2, A3, A4 = "1" * 32, "2" * 32, "3" * 32, "4" * 32
E1, E2, E3 = "e1" * 16, "e2" * 16, "e3" * 16


def legal() -> list[Record]:
    """Two submitted tasks (T1 once lost and retried, T2 refused a stale report), one
    cancelled task, a schedule, a workflow, an inbox and a never-acking subscription."""
    return [
        # producer
        {"t": 1.0, "p": "producer", "op": "submit", "phase": "invoke", "idem": "k1", "dedup": "u1"},
        {"t": 1.1, "p": "producer", "op": "submit", "phase": "ok", "idem": "k1", "dedup": "u1", "task": T1},
        {"t": 1.2, "p": "producer", "op": "submit", "phase": "invoke", "idem": "k1", "dedup": "u1"},
        {"t": 1.3, "p": "producer", "op": "submit", "phase": "ok", "idem": "k1", "dedup": "u1", "task": T1},
        {"t": 1.4, "p": "producer", "op": "submit", "phase": "invoke", "idem": "k2", "dedup": "u2"},
        {"t": 1.5, "p": "producer", "op": "submit", "phase": "ok", "idem": "k2", "dedup": "u2", "task": T2},
        {"t": 1.6, "p": "producer", "op": "submit", "phase": "invoke", "idem": "k3", "dedup": "u3"},
        {"t": 1.7, "p": "producer", "op": "submit", "phase": "ok", "idem": "k3", "dedup": "u3", "task": T3},
        {"t": 1.8, "p": "producer", "op": "cancel", "phase": "ok", "task": T3, "state": "CANCELLED"},
        # workers: T1 generation 1 on w0 (killed), generation 2 on w1; T2 paused holder
        {"t": 2.0, "p": "w0", "op": "wstart", "task": T1, "gen": 1, "attempt": A1, "pid": 10},
        {"t": 3.0, "p": "w1", "op": "wstart", "task": T1, "gen": 2, "attempt": A2, "pid": 11},
        {"t": 3.5, "p": "w1", "op": "wdone", "task": T1, "gen": 2, "attempt": A2},
        {"t": 3.6, "p": "w1", "op": "wreceipt", "attempt": A2, "receipt": "r2", "outcome": "applied",
         "task_state": "SUCCEEDED"},
        {"t": 2.1, "p": "w2", "op": "wstart", "task": T2, "gen": 1, "attempt": A3, "pid": 12},
        {"t": 4.0, "p": "w1", "op": "wstart", "task": T2, "gen": 2, "attempt": A4, "pid": 11},
        {"t": 4.2, "p": "w1", "op": "wreceipt", "attempt": A4, "receipt": "r4", "outcome": "applied",
         "task_state": "SUCCEEDED"},
        {"t": 6.0, "p": "w2", "op": "wstale", "attempt": A3},
        # subscribers
        {"t": 5.0, "p": "inbox", "op": "delivery", "sub": "inbox", "delivery_id": "d1", "event_id": E1, "seq": 1, "attempt": 1},
        {"t": 5.1, "p": "inbox", "op": "inbox_apply", "sub": "inbox", "event_id": E1, "applied": True},
        {"t": 5.2, "p": "inbox", "op": "delivery", "sub": "inbox", "delivery_id": "d2", "event_id": E2, "seq": 2, "attempt": 1},
        {"t": 5.3, "p": "inbox", "op": "inbox_apply", "sub": "inbox", "event_id": E2, "applied": True},
        {"t": 5.4, "p": "inbox", "op": "delivery", "sub": "inbox", "delivery_id": "d2", "event_id": E2, "seq": 2, "attempt": 2},
        {"t": 5.5, "p": "inbox", "op": "inbox_apply", "sub": "inbox", "event_id": E2, "applied": False},
        {"t": 5.6, "p": "inbox", "op": "delivery", "sub": "inbox", "delivery_id": "d3", "event_id": E3, "seq": 3, "attempt": 1},
        {"t": 5.7, "p": "inbox", "op": "inbox_apply", "sub": "inbox", "event_id": E3, "applied": True},
        {"t": 5.0, "p": "noack", "op": "delivery", "sub": "noack", "delivery_id": "n1", "event_id": E1, "seq": 1, "attempt": 1},
        {"t": 6.0, "p": "noack", "op": "delivery", "sub": "noack", "delivery_id": "n1", "event_id": E1, "seq": 1, "attempt": 2},
        # workflow
        {"t": 1.0, "p": "wf", "op": "wf_start", "business_key": "b1", "instance": "i1"},
        {"t": 1.5, "p": "wf", "op": "wf_start", "business_key": "b1", "instance": "i1"},
        {"t": 2.0, "p": "wf", "op": "signal", "phase": "ok", "instance": "i1", "signal_id": "s1"},
        # the database
        {"op": "db.task", "task": T1, "state": "SUCCEEDED", "uncertain": False, "attempts": 2, "dedup": "u1",
         "identity": ["o", "job", ""]},
        {"op": "db.task", "task": T2, "state": "SUCCEEDED", "uncertain": False, "attempts": 2, "dedup": "u2",
         "identity": ["o", "job", ""]},
        {"op": "db.task", "task": T3, "state": "CANCELLED", "uncertain": False, "attempts": 0, "dedup": "u3",
         "identity": ["o", "job", ""]},
        {"op": "db.attempt", "task": T1, "attempt": A1, "gen": 1, "state": "LOST", "started": True},
        {"op": "db.attempt", "task": T1, "attempt": A2, "gen": 2, "state": "SUCCEEDED", "started": True},
        {"op": "db.attempt", "task": T2, "attempt": A3, "gen": 1, "state": "LOST", "started": True},
        {"op": "db.attempt", "task": T2, "attempt": A4, "gen": 2, "state": "SUCCEEDED", "started": True},
        {"op": "db.receipt", "task": T1, "attempt": A2, "gen": 2, "receipt": "r2", "operation": "complete"},
        {"op": "db.receipt", "task": T2, "attempt": A4, "gen": 2, "receipt": "r4", "operation": "complete"},
        {"op": "db.evidence", "task": T2, "attempt": A3, "kind": "late_complete"},
        {"op": "db.event", "seq": 1, "event_id": E1, "task": T1, "state": "SUCCEEDED"},
        {"op": "db.event", "seq": 2, "event_id": E2, "task": T3, "state": "CANCELLED"},
        {"op": "db.event", "seq": 3, "event_id": E3, "task": T2, "state": "SUCCEEDED"},
        {"op": "db.subscription", "sub": "inbox", "max_deliveries": 1000},
        {"op": "db.subscription", "sub": "noack", "max_deliveries": 2},
        {"op": "db.delivery", "sub": "inbox", "delivery_id": "d1", "seq": 1, "event_id": E1, "state": "ACKED",
         "attempts": 1, "budget": 1000},
        {"op": "db.delivery", "sub": "inbox", "delivery_id": "d2", "seq": 2, "event_id": E2, "state": "ACKED",
         "attempts": 2, "budget": 1000},
        {"op": "db.delivery", "sub": "inbox", "delivery_id": "d3", "seq": 3, "event_id": E3, "state": "ACKED",
         "attempts": 1, "budget": 1000},
        {"op": "db.delivery", "sub": "noack", "delivery_id": "n1", "seq": 1, "event_id": E1, "state": "EXHAUSTED",
         "attempts": 2, "budget": 2},
        {"op": "db.delivery", "sub": "noack", "delivery_id": "n2", "seq": 2, "event_id": E2, "state": "EXHAUSTED",
         "attempts": 2, "budget": 2},
        {"op": "db.delivery", "sub": "noack", "delivery_id": "n3", "seq": 3, "event_id": E3, "state": "EXHAUSTED",
         "attempts": 2, "budget": 2},
        {"op": "db.inbox", "sub": "inbox", "event_id": E1, "seq": 1, "task": T1},
        {"op": "db.inbox", "sub": "inbox", "event_id": E2, "seq": 2, "task": T3},
        {"op": "db.inbox", "sub": "inbox", "event_id": E3, "seq": 3, "task": T2},
        {"op": "db.inbox_balance", "sub": "inbox", "events": 3, "balance": 0},
        {"op": "db.schedule", "schedule": "tick", "every_ms": 1000},
        {"op": "db.occurrence", "schedule": "tick", "fire_us": 1_000_000, "outcome": "created", "task": T1,
         "covered_until_us": None, "skipped_count": None},
        {"op": "db.occurrence", "schedule": "tick", "fire_us": 2_000_000, "outcome": "skipped", "task": None,
         "covered_until_us": 4_500_000, "skipped_count": 3},
        {"op": "db.occurrence", "schedule": "tick", "fire_us": 5_000_000, "outcome": "created", "task": T2,
         "covered_until_us": None, "skipped_count": None},
        {"op": "db.instance", "instance": "i1", "business_key": "b1", "state": "SUCCEEDED"},
        {"op": "db.signal", "instance": "i1", "signal_id": "s1", "matched": True},
        {"op": "db.counter", "name": "queue.unfinished", "stored": 0, "recount": 0},
    ]


def kinds(records: list[Record]) -> set[str]:
    return {a.split(":", 1)[0] for a in check(records)}


def test_a_legal_history_passes() -> None:
    figures: dict[str, Any] = {}
    assert check(legal(), figures=figures) == []
    assert figures["client_starts"] == 4 and figures["client_stale_reports"] == 1


def _where(records: list[Record], **match: Any) -> Record:
    return next(r for r in records if all(r.get(k) == v for k, v in match.items()))


def two_applied_receipts(h: list[Record]) -> None:
    h.append({"op": "db.receipt", "task": T1, "attempt": A1, "gen": 1, "receipt": "r1", "operation": "complete"})


def lost_inbox_delivery(h: list[Record]) -> None:
    h.remove(_where(h, op="db.inbox", event_id=E3))
    _where(h, op="db.inbox_balance")["events"] = 2


def duplicate_occurrence(h: list[Record]) -> None:
    h.append(dict(_where(h, op="db.occurrence", fire_us=5_000_000), task="x" * 32))


def missing_occurrence(h: list[Record]) -> None:
    _where(h, op="db.occurrence", fire_us=5_000_000)["fire_us"] = 6_000_000


def double_start(h: list[Record]) -> None:
    h.append({"t": 3.1, "p": "w2", "op": "wstart", "task": T1, "gen": 2, "attempt": A2, "pid": 12})


def start_without_lost(h: list[Record]) -> None:
    _where(h, op="db.attempt", attempt=A1)["state"] = "RELEASED"


def acked_not_final(h: list[Record]) -> None:
    _where(h, op="db.task", task=T2)["state"] = "NEEDS_REVIEW"
    _where(h, op="db.task", task=T2)["uncertain"] = True


def start_after_complete(h: list[Record]) -> None:
    h.append({"t": 3.9, "p": "w0", "op": "wstart", "task": T1, "gen": 3, "attempt": A3, "pid": 10})


def stale_applied(h: list[Record]) -> None:
    h.append({"t": 6.0, "p": "w1", "op": "wstale", "attempt": A4})


def stale_without_evidence(h: list[Record]) -> None:
    h.remove(_where(h, op="db.evidence", attempt=A3))


def lost_submit(h: list[Record]) -> None:
    h.remove(_where(h, op="db.task", task=T3))


def idempotency(h: list[Record]) -> None:
    _where(h, op="submit", phase="ok", idem="k1", t=1.3)["task"] = T2


def event_gap(h: list[Record]) -> None:
    _where(h, op="db.event", seq=3)["seq"] = 4


def duplicate_delivery_seen(h: list[Record]) -> None:
    h.append(dict(_where(h, op="delivery", delivery_id="d2", attempt=2), t=5.45))


def noack_acked(h: list[Record]) -> None:
    _where(h, op="db.delivery", delivery_id="n2")["state"] = "ACKED"


def noack_redelivery_lost(h: list[Record]) -> None:
    d = _where(h, op="db.delivery", delivery_id="n3")
    d["state"], d["attempts"] = "PENDING", 1


def applied_twice(h: list[Record]) -> None:
    h.append({"t": 5.8, "p": "inbox", "op": "inbox_apply", "sub": "inbox", "event_id": E2, "applied": True})


def counter_drift(h: list[Record]) -> None:
    _where(h, op="db.counter")["stored"] = 1


def unfinished(h: list[Record]) -> None:
    _where(h, op="db.task", task=T3)["state"] = "WAITING"


def cancel_not_final(h: list[Record]) -> None:
    h.append({"t": 1.9, "p": "w1", "op": "wstart", "task": T3, "gen": 1, "attempt": "9" * 32, "pid": 11})
    h.append({"op": "db.attempt", "task": T3, "attempt": "9" * 32, "gen": 1, "state": "SUCCEEDED", "started": True})
    h.append({"t": 2.5, "p": "w1", "op": "wreceipt", "attempt": "9" * 32, "receipt": "r9", "outcome": "applied",
              "task_state": "SUCCEEDED"})


def lost_signal(h: list[Record]) -> None:
    h.remove(_where(h, op="db.signal"))
    _where(h, op="db.instance")["state"] = "RUNNING"


def start_before_submit(h: list[Record]) -> None:
    _where(h, op="wstart", attempt=A1)["t"] = 0.5


CASES: list[tuple[Callable[[list[Record]], None], set[str]]] = [
    (two_applied_receipts, {"two_applied_receipts", "receipts"}),
    (lost_inbox_delivery, {"inbox_missing"}),
    (duplicate_occurrence, {"occurrence_duplicate"}),
    (missing_occurrence, {"occurrence_gap"}),
    (double_start, {"double_start"}),
    (start_without_lost, {"start_without_lost"}),
    (acked_not_final, {"acked_not_final", "event_missing"}),
    (start_after_complete, {"start_after_complete"}),
    (stale_applied, {"stale_applied", "stale_no_evidence"}),
    (stale_without_evidence, {"stale_no_evidence"}),
    (lost_submit, {"lost_submit"}),
    (idempotency, {"idempotency"}),
    (event_gap, {"event_sequence", "delivery_missing", "delivery_unknown"}),
    (duplicate_delivery_seen, {"duplicate_handout", "phantom_delivery"}),
    (noack_acked, {"noack_acked"}),
    (noack_redelivery_lost, {"noack_not_exhausted"}),
    (applied_twice, {"applied_twice"}),
    (counter_drift, {"counter_drift"}),
    (unfinished, {"unfinished", "cancel_not_final"}),
    (cancel_not_final, {"cancel_not_final", "acked_not_final"}),
    (lost_signal, {"lost_signal", "instance_stuck"}),
    (start_before_submit, {"start_before_submit"}),
]


@pytest.mark.parametrize(("mutate", "expected"), CASES, ids=[c[0].__name__ for c in CASES])
def test_each_illegal_history_is_reported(mutate: Callable[[list[Record]], None], expected: set[str]) -> None:
    h = copy.deepcopy(legal())
    mutate(h)
    found = kinds(h)
    assert expected <= found, (expected - found, check(h))


def test_recorder_lines_survive_and_load(tmp_path: Path) -> None:
    rec = Recorder(tmp_path / "p.jsonl", "p")
    rec("submit", phase="invoke", idem="k", dedup="d")
    rec.close()
    (tmp_path / "p.jsonl").open("a").write('{"t": 1, "op": "torn')  # a line cut by SIGKILL
    out = load([tmp_path / "p.jsonl", tmp_path / "absent.jsonl"])
    assert len(out) == 1 and out[0]["op"] == "submit" and out[0]["p"] == "p" and out[0]["t"] > 0
