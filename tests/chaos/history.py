"""Client-observed histories of a chaos run, and the checker that judges them.

Every process of a run (the producer, each worker, each subscriber, the fault injector)
appends what it *observed* to its own JSON-lines file through :class:`Recorder`: one object
per operation with ``t`` (``time.monotonic()``: one clock for every process of the machine),
``p`` (the process) and ``op``. After the run, :func:`snapshot` turns the database into
records of the same shape (``op`` starting with ``db.``), and :func:`check` judges the
union against the model. A record list is all the checker sees, so a unit test can hand it
an illegal history (tests/chaos/test_history_checker.py).

Client operations (fields):

* ``submit`` ``idem``, ``dedup``, ``phase`` (``invoke``/``ok``/``fail``), ``task``, ``replay``
* ``cancel`` ``task``, ``phase``, ``state`` (the task state in the answer)
* ``wstart`` ``task``, ``gen``, ``attempt``, ``pid`` — a worker's handler began (the server
  said ``started``); ``wdone`` — it returned
* ``wreceipt`` ``attempt``, ``receipt``, ``outcome``, ``task_state`` — the server acknowledged
  a report with a receipt; ``wstale`` ``attempt`` — it refused one (stale execution token);
  ``wrejected``/``wlost`` ``attempt`` — refused otherwise / not delivered
* ``wf_start`` ``business_key``, ``instance``; ``signal`` ``instance``, ``signal_id``, ``phase``
* ``delivery`` ``sub``, ``delivery_id``, ``event_id``, ``seq``, ``attempt`` — a subscriber got
  a hand-out; ``inbox_apply`` ``event_id``, ``applied``; ``ack`` ``sub``, ``delivery_id``
* ``fault`` ``kind``

Database facts: ``db.task``, ``db.attempt``, ``db.receipt``, ``db.evidence``, ``db.event``,
``db.subscription``, ``db.delivery``, ``db.inbox``, ``db.inbox_balance``, ``db.schedule``,
``db.occurrence``, ``db.instance``, ``db.signal``, ``db.counter`` (fields in
:func:`snapshot`).

The model (each check names its anomaly kind, the text before the first ``:``):

* per task, linearizable against the task model: a worker starts a task only after a submit
  of it was invoked (``start_before_submit``); a completion acknowledged to a worker with a
  receipt is the task's final result (``acked_not_final``); nothing starts a task after a
  completion was acknowledged (``start_after_complete``); a cancel answered CANCELLED is
  final (``cancel_not_final``); no (task, generation) started by two processes
  (``double_start``); no task started twice without a recorded lost attempt
  (``start_without_lost``); a started attempt the database does not know (``phantom_start``);
* a SUCCEEDED task has exactly one applied ``complete`` receipt, on its last attempt
  (``receipts``); two applied completions of one task (``two_applied_receipts``); a report
  refused as stale was never applied (``stale_applied``) and is recorded as evidence
  (``stale_no_evidence``);
* every task terminal, or NEEDS_REVIEW with ``effect_uncertain`` and a LOST attempt
  (``unfinished``, ``review_unexplained``);
* submits: an acknowledged submit's task exists (``lost_submit``); an Idempotency-Key always
  returns the same task (``idempotency``); a dedup key's task carries that key (``dedup``);
  no dedup identity twice (``dedup_duplicate``);
* result events: ``seq`` 1..n without gap or duplicate (``event_sequence``); every finished
  task has exactly one final event, of its state (``event_missing``, ``event_duplicate``);
* subscriptions: one delivery per event and subscription (``delivery_missing``,
  ``delivery_unknown``); at the inbox every delivery ACKED (``not_acked``), seen by the
  subscriber before its ack (``ack_without_delivery``), applied exactly once
  (``inbox_missing``, ``inbox_unknown``, ``applied_twice``, ``inbox_balance``); the
  never-acking subscription: every delivery EXHAUSTED after exactly its budget
  (``noack_not_exhausted``), never ACKED (``noack_acked``); no hand-out seen that the server
  did not count (``phantom_delivery``), and none seen twice (``duplicate_handout``);
* schedules: every occurrence unique (``occurrence_duplicate``), fire times contiguous
  (``occurrence_gap``), each created occurrence has its task (``occurrence_task``), and
  each task one occurrence (``occurrence_shared_task``);
* workflows: an acknowledged start or signal exists (``lost_instance``, ``lost_signal``),
  one business key one instance (``business_key``), an instance whose signal was
  acknowledged ends SUCCEEDED unless a task of it needs review (``instance_stuck``);
* counters equal a recount (``counter_drift``).
"""

from __future__ import annotations

import itertools
import json
import os
import threading
import time
from collections import Counter, defaultdict
from collections.abc import Iterable
from datetime import datetime
from pathlib import Path
from typing import Any

TERMINAL = ("SUCCEEDED", "FAILED", "CANCELLED")
FINISHED = (*TERMINAL, "NEEDS_REVIEW")

Record = dict[str, Any]


class Recorder:
    """Appends one JSON line per observed operation (thread-safe, line-buffered: a line
    written before a SIGKILL is kept)."""

    def __init__(self, path: Path | str, process: str) -> None:
        self.path = Path(path)
        self.process = process
        self._lock = threading.Lock()
        self._out = open(self.path, "a", buffering=1)  # noqa: SIM115 - closed by close()

    def __call__(self, op: str, **fields: Any) -> None:
        line = json.dumps({"t": time.monotonic(), "p": self.process, "op": op, **fields}, default=str)
        with self._lock:
            self._out.write(line + "\n")

    def close(self) -> None:
        with self._lock:
            self._out.close()


def load(paths: Iterable[Path]) -> list[Record]:
    """Every record of every log (a torn last line of a killed process is skipped)."""
    out: list[Record] = []
    for path in paths:
        if not path.exists():
            continue
        for line in path.read_text(errors="replace").splitlines():
            try:
                out.append(json.loads(line))
            except ValueError:
                continue
    return out


# --------------------------------------------------------------------------------------------
# The database as records


def _hex(b: Any) -> str | None:
    return None if b is None else bytes(b).hex()


def _us(d: datetime | None) -> int | None:
    if d is None:
        return None
    return int((d - datetime(1970, 1, 1)).total_seconds() * 1_000_000 + 0.5)


def snapshot(
    dsn: Any,
    application_id: str,
    namespace: str,
    *,
    inbox_dsn: Any = None,
    inbox_sub: str = "inbox",
    every_ms: dict[str, int] | None = None,
) -> list[Record]:
    """The database's facts about one namespace, as ``db.*`` records."""
    import pymysql

    conn = pymysql.connect(autocommit=True, **dsn.connect_kwargs())
    recs: list[Record] = []

    def rows(sql: str, args: Any = None) -> list[tuple[Any, ...]]:
        with conn.cursor() as cur:
            cur.execute(sql, args)
            return list(cur.fetchall())

    try:
        ns = rows("SELECT id FROM orbit_namespaces WHERE application_id = UNHEX(%s) AND name = %s",
                  (application_id, namespace))[0][0]  # fmt: skip
        for tid, state, unc, n, dedup, owner, kind, pv, src_kind, src_id in rows(
            "SELECT id, state, effect_uncertain, attempts, dedup_key, owner_id, kind, pipeline_version,"
            " source_kind, source_id FROM pulse_tasks WHERE namespace_id = %s", (ns,)
        ):  # fmt: skip
            recs.append({"op": "db.task", "task": _hex(tid), "state": state, "uncertain": bool(unc),
                         "attempts": int(n), "dedup": dedup, "identity": [_hex(owner), kind, pv],
                         "source": src_kind, "source_id": _hex(src_id)})  # fmt: skip
        for tid, aid, gen, state, started in rows(
            "SELECT task_id, id, generation, state, started_at FROM pulse_attempts WHERE namespace_id = %s",
            (ns,),
        ):  # fmt: skip
            recs.append({"op": "db.attempt", "task": _hex(tid), "attempt": _hex(aid), "gen": int(gen),
                         "state": state, "started": started is not None})  # fmt: skip
        for tid, aid, gen, rid, operation in rows(
            "SELECT task_id, id, generation, receipt_id, receipt_op FROM pulse_attempts"
            " WHERE namespace_id = %s AND receipt_id IS NOT NULL", (ns,)
        ):  # fmt: skip
            recs.append({"op": "db.receipt", "task": _hex(tid), "attempt": _hex(aid), "gen": int(gen),
                         "receipt": _hex(rid), "operation": operation})  # fmt: skip
        for tid, aid, kind in rows(
            "SELECT task_id, attempt_id, kind FROM pulse_attempt_evidence WHERE namespace_id = %s", (ns,)
        ):
            recs.append({"op": "db.evidence", "task": _hex(tid), "attempt": _hex(aid), "kind": kind})
        for seq, eid, tid, state in rows(
            "SELECT seq, event_id, task_id, state FROM orbit_result_events WHERE namespace_id = %s ORDER BY seq",
            (ns,),
        ):  # fmt: skip
            recs.append({"op": "db.event", "seq": int(seq), "event_id": _hex(eid), "task": _hex(tid),
                         "state": state})  # fmt: skip
        subs = {}
        for sid, name, maxd in rows(
            "SELECT id, name, max_deliveries FROM orbit_subscriptions WHERE namespace_id = %s", (ns,)
        ):
            subs[sid] = name
            recs.append({"op": "db.subscription", "sub": name, "max_deliveries": int(maxd)})
        for sid, did, seq, eid, state, attempts, budget in rows(
            "SELECT subscription_id, id, seq, event_id, state, attempts, budget FROM orbit_deliveries"
            " WHERE namespace_id = %s", (ns,)
        ):  # fmt: skip
            recs.append({"op": "db.delivery", "sub": subs.get(sid, _hex(sid)), "delivery_id": _hex(did),
                         "seq": int(seq), "event_id": _hex(eid), "state": state,
                         "attempts": int(attempts), "budget": int(budget)})  # fmt: skip
        # First-time deliveries live as slots of range rows until an exception moves them out
        # (then the row above is the delivery): every slot not moved is one delivery.
        from orbit.delivery_ranges import Slots

        for sid, seqs, dids, eids, digests, acked_us, moved, budget in rows(
            "SELECT subscription_id, seqs, delivery_ids, event_ids, proof_digests, acked_us,"
            " moved, budget FROM orbit_delivery_ranges WHERE namespace_id = %s", (ns,)
        ):  # fmt: skip
            slots = Slots.decode(seqs, dids, eids, digests, acked_us, moved)
            for i in range(len(slots)):
                if slots.is_moved(i):
                    continue
                recs.append({"op": "db.delivery", "sub": subs.get(sid, _hex(sid)),
                             "delivery_id": _hex(slots.delivery_ids[i]), "seq": slots.seqs[i],
                             "event_id": _hex(slots.event_ids[i]),
                             "state": "ACKED" if slots.is_acked(i) else "LEASED",
                             "attempts": 1, "budget": int(budget)})  # fmt: skip
        for sched, name in rows("SELECT id, name FROM pulse_schedules WHERE namespace_id = %s", (ns,)):
            recs.append({"op": "db.schedule", "schedule": name,
                         "every_ms": (every_ms or {}).get(name)})  # fmt: skip
            for oid, fire, outcome, tid, cov, cnt in rows(
                "SELECT id, fire_at, outcome, task_id, covered_until, skipped_count"
                " FROM pulse_schedule_occurrences WHERE namespace_id = %s AND schedule_id = %s",
                (ns, sched),
            ):  # fmt: skip
                recs.append({"op": "db.occurrence", "schedule": name, "occurrence": _hex(oid),
                             "fire_us": _us(fire), "outcome": outcome, "task": _hex(tid),
                             "covered_until_us": _us(cov), "skipped_count": cnt})  # fmt: skip
        for iid, bkey, state in rows(
            "SELECT id, business_key, state FROM weave_instances WHERE namespace_id = %s", (ns,)
        ):
            recs.append({"op": "db.instance", "instance": _hex(iid), "business_key": bkey, "state": state})
        for iid, sig_id, matched in rows(
            "SELECT instance_id, signal_id, matched_at FROM weave_signals WHERE namespace_id = %s", (ns,)
        ):
            recs.append({"op": "db.signal", "instance": _hex(iid), "signal_id": sig_id,
                         "matched": matched is not None})  # fmt: skip
        for tid, iid in rows(
            "SELECT t.id, a.instance_id FROM pulse_tasks t JOIN weave_activations a"
            " ON a.namespace_id = t.namespace_id AND a.task_id = t.id WHERE t.namespace_id = %s", (ns,)
        ):  # fmt: skip
            recs.append({"op": "db.instance_task", "task": _hex(tid), "instance": _hex(iid)})
        # Counters vs a recount.
        recount = rows(
            "SELECT COALESCE(SUM(state IN ('WAITING','LEASED','RUNNING','NEEDS_REVIEW')),0),"
            " COALESCE(SUM(state = 'LEASED'),0), COALESCE(SUM(state = 'RUNNING'),0)"
            " FROM pulse_tasks WHERE namespace_id = %s", (ns,)
        )[0]  # fmt: skip
        usage = rows("SELECT COALESCE(SUM(unfinished_tasks),0), COALESCE(SUM(reservations),0),"
                     " COALESCE(SUM(active_attempts),0) FROM pulse_queue_usage WHERE namespace_id = %s",
                     (ns,))[0]  # fmt: skip
        for name, stored, want in zip(("queue.unfinished", "queue.reservations", "queue.active"),
                                      usage, recount, strict=True):  # fmt: skip
            recs.append({"op": "db.counter", "name": name, "stored": int(stored), "recount": int(want)})
        app = rows("SELECT unfinished_tasks, reservations, active_attempts FROM orbit_application_resources"
                   " WHERE application_id = UNHEX(%s)", (application_id,))  # fmt: skip
        if app:
            for name, stored, want in zip(("app.unfinished", "app.reservations", "app.active"),
                                          app[0], recount, strict=True):  # fmt: skip
                recs.append({"op": "db.counter", "name": name, "stored": int(stored), "recount": int(want)})
    finally:
        conn.close()
    if inbox_dsn is not None:
        conn = pymysql.connect(autocommit=True, **inbox_dsn.connect_kwargs())
        try:
            with conn.cursor() as cur:
                cur.execute("SELECT event_id, seq, task_id FROM inbox_events")
                for eid, seq, tid in cur.fetchall():
                    recs.append({"op": "db.inbox", "sub": inbox_sub, "event_id": eid, "seq": int(seq),
                                 "task": tid})  # fmt: skip
                cur.execute("SELECT COALESCE(SUM(events),0), COALESCE(SUM(balance),0) FROM inbox_balances")
                ev, bal = cur.fetchone()
                recs.append({"op": "db.inbox_balance", "sub": inbox_sub, "events": int(ev), "balance": int(bal)})
        finally:
            conn.close()
    return recs


# --------------------------------------------------------------------------------------------
# The checker


class _Index:
    def __init__(self, records: list[Record]) -> None:
        self.by_op: dict[str, list[Record]] = defaultdict(list)
        for r in records:
            self.by_op[r["op"]].append(r)

    def __getitem__(self, op: str) -> list[Record]:
        return self.by_op.get(op, [])


def check(records: list[Record], *, noack_sub: str | None = "noack", inbox_sub: str | None = "inbox",
          figures: dict[str, Any] | None = None) -> list[str]:  # fmt: skip
    """Every anomaly of the history (``kind: detail``); empty when it is legal.
    ``figures`` (if given) receives counts of what was checked."""
    ix = _Index(records)
    bad: list[str] = []
    fig = figures if figures is not None else {}
    fig["records"] = len(records)
    fig["client_ops"] = Counter(r["op"] for r in records if not r["op"].startswith("db."))
    _check_tasks(ix, bad, fig)
    _check_submits(ix, bad)
    _check_events(ix, bad)
    _check_deliveries(ix, bad, fig, inbox_sub, noack_sub)
    _check_schedules(ix, bad, fig)
    _check_workflows(ix, bad, fig)
    for c in ix["db.counter"]:
        if c["stored"] != c["recount"]:
            bad.append(f"counter_drift: {c['name']} stored {c['stored']} != recount {c['recount']}")
    return bad


def _check_tasks(ix: _Index, bad: list[str], fig: dict[str, Any]) -> None:
    tasks = {t["task"]: t for t in ix["db.task"]}
    atts: dict[str, list[Record]] = defaultdict(list)
    att_by_id: dict[str, Record] = {}
    for a in ix["db.attempt"]:
        atts[a["task"]].append(a)
        att_by_id[a["attempt"]] = a
    receipts: dict[str, list[Record]] = defaultdict(list)
    rec_by_attempt: dict[str, Record] = {}
    for r in ix["db.receipt"]:
        receipts[r["task"]].append(r)
        rec_by_attempt[r["attempt"]] = r
    evidence = {(e["attempt"], e["kind"]) for e in ix["db.evidence"]}
    fig["states"] = Counter(t["state"] for t in tasks.values())
    fig["attempt_states"] = Counter(a["state"] for a in att_by_id.values())
    fig["evidence"] = Counter(e["kind"] for e in ix["db.evidence"])
    for tid, t in tasks.items():
        mine = atts.get(tid, [])
        started = [a for a in mine if a["started"]]
        lost = [a for a in mine if a["state"] == "LOST"]
        if len(started) > 1 + len(lost):
            bad.append(f"start_without_lost: task {tid} started {len(started)} times, {len(lost)} LOST")
        complete = [r for r in receipts.get(tid, []) if r["operation"] == "complete"]
        if len(complete) > 1:
            bad.append(f"two_applied_receipts: task {tid} has {len(complete)} applied completions")
        if t["state"] == "SUCCEEDED" and (len(complete) != 1 or complete[0]["gen"] != t["attempts"]):
            bad.append(f"receipts: task {tid} SUCCEEDED with completions "
                       f"{[(r['receipt'], r['gen']) for r in complete]} (attempts {t['attempts']})")  # fmt: skip
        if t["state"] in TERMINAL and t["uncertain"]:
            bad.append(f"unfinished: task {tid} {t['state']} with effect_uncertain")
        if t["state"] == "NEEDS_REVIEW" and not (t["uncertain"] and lost):
            bad.append(f"review_unexplained: task {tid} NEEDS_REVIEW without a lost attempt")
        if t["state"] not in FINISHED:
            bad.append(f"unfinished: task {tid} left {t['state']}")
    # The clients' view.
    starts: dict[tuple[str, int], set[Any]] = defaultdict(set)
    first_start: dict[str, float] = {}
    task_of_attempt: dict[str, str] = {}
    client_started: dict[str, set[str]] = defaultdict(set)
    starts_of: dict[str, list[Record]] = defaultdict(list)
    for s in ix["wstart"]:
        starts_of[s["task"]].append(s)
        starts[(s["task"], int(s["gen"]))].add(s.get("pid", s.get("p")))
        task_of_attempt[s["attempt"]] = s["task"]
        client_started[s["task"]].add(s["attempt"])
        first_start[s["task"]] = min(first_start.get(s["task"], s["t"]), s["t"])
        a = att_by_id.get(s["attempt"])
        if tasks and (a is None or not a["started"]):
            bad.append(f"phantom_start: worker {s.get('p')} started attempt {s['attempt']} of task {s['task']}"
                       " that the database never started")  # fmt: skip
    for (tid, gen), pids in starts.items():
        if len(pids) > 1:
            bad.append(f"double_start: task {tid} generation {gen} started by {sorted(map(str, pids))}")
    for tid, attempts in client_started.items():
        lost = [a for a in atts.get(tid, []) if a["state"] == "LOST"]
        if tasks and len(attempts) > 1 + len(lost):
            bad.append(f"start_without_lost: task {tid} started by workers {len(attempts)} times, "
                       f"{len(lost)} LOST")  # fmt: skip
    fig["client_starts"] = sum(len(v) for v in client_started.values())
    # A task can only start after some submit of its identity was invoked (a dedup hit
    # answers an older task, so the earliest invocation with that dedup key counts).
    invoked: dict[str, float] = {}
    for s in ix["submit"]:
        if s.get("phase") == "invoke" and s.get("dedup") is not None:
            invoked[s["dedup"]] = min(invoked.get(s["dedup"], s["t"]), s["t"])
    for tid, t0 in first_start.items():
        t = tasks.get(tid)
        key = t["dedup"] if t is not None else None
        if key in invoked and t0 < invoked[key]:
            bad.append(f"start_before_submit: task {tid} started at {t0:.6f}, first submit of "
                       f"{key} invoked at {invoked[key]:.6f}")  # fmt: skip
    acked_complete: dict[str, list[Record]] = defaultdict(list)
    for r in ix["wreceipt"]:
        tid = r.get("task") or task_of_attempt.get(r["attempt"])
        if tid is None:
            continue
        if r.get("task_state") == "SUCCEEDED":
            acked_complete[tid].append(r)
    fig["client_receipts"] = len(ix["wreceipt"])
    for tid, rs in acked_complete.items():
        t = tasks.get(tid)
        applied = [r for r in receipts.get(tid, []) if r["operation"] == "complete"]
        for r in rs:
            if t is not None and (t["state"] != "SUCCEEDED" or not any(a["receipt"] == r["receipt"] for a in applied)):
                bad.append(f"acked_not_final: task {tid}: receipt {r['receipt']} acknowledged to {r.get('p')} "
                           f"at {r['t']:.6f}, but the task is {t['state']} with {[a['receipt'] for a in applied]}")  # fmt: skip
        first_ack = min(r["t"] for r in rs)
        for s in starts_of.get(tid, []):
            if s["t"] > first_ack:
                bad.append(f"start_after_complete: task {tid} started by {s.get('p')} at {s['t']:.6f} after "
                           f"its completion was acknowledged at {first_ack:.6f}")  # fmt: skip
    for c in ix["cancel"]:
        if c.get("phase") == "ok" and c.get("state") == "CANCELLED":
            t = tasks.get(c["task"])
            if t is not None and t["state"] != "CANCELLED":
                bad.append(f"cancel_not_final: task {c['task']} answered CANCELLED at {c['t']:.6f}, ends {t['state']}")
            for r in acked_complete.get(c["task"], []):
                if r["t"] > c["t"]:
                    bad.append(f"cancel_not_final: task {c['task']} completed at {r['t']:.6f} after a "
                               f"CANCELLED answer at {c['t']:.6f}")  # fmt: skip
    fig["client_stale_reports"] = len(ix["wstale"])
    fig["client_reports_refused"] = Counter(r.get("code") for r in ix["wrejected"])
    fig["client_reports_lost"] = len(ix["wlost"])
    for s in ix["wstale"]:
        a = att_by_id.get(s["attempt"])
        if s["attempt"] in rec_by_attempt or (a is not None and a["state"] == "SUCCEEDED"):
            bad.append(f"stale_applied: attempt {s['attempt']} was refused as stale to {s.get('p')} but applied")
        if tasks and not any((s["attempt"], k) in evidence for k in ("late_complete", "late_fail", "late_cancelled")):
            bad.append(f"stale_no_evidence: attempt {s['attempt']}'s refused report left no evidence row")


def _check_submits(ix: _Index, bad: list[str]) -> None:
    tasks = {t["task"]: t for t in ix["db.task"]}
    by_idem: dict[str, set[str]] = defaultdict(set)
    for s in ix["submit"]:
        if s.get("phase") != "ok":
            continue
        by_idem[s["idem"]].add(s["task"])
        t = tasks.get(s["task"])
        if tasks and t is None:
            bad.append(f"lost_submit: submit {s['idem']} answered task {s['task']} at {s['t']:.6f}; no such task")
        elif t is not None and s.get("dedup") is not None and t["dedup"] != s["dedup"]:
            bad.append(f"dedup: submit {s['idem']} with dedup {s['dedup']} answered task {s['task']} "
                       f"whose dedup key is {t['dedup']}")  # fmt: skip
    for idem, ids in by_idem.items():
        if len(ids) > 1:
            bad.append(f"idempotency: Idempotency-Key {idem} answered tasks {sorted(ids)}")
    ident = Counter((*t["identity"], t["dedup"]) for t in tasks.values() if t["dedup"] is not None)
    for k, n in ident.items():
        if n > 1:
            bad.append(f"dedup_duplicate: identity {k} exists {n} times")


def _check_events(ix: _Index, bad: list[str]) -> None:
    events = sorted(ix["db.event"], key=lambda e: e["seq"])
    seqs = [e["seq"] for e in events]
    if seqs != list(range(1, len(seqs) + 1)):
        dup = [s for s, n in Counter(seqs).items() if n > 1]
        gaps = sorted(set(range(1, max(seqs, default=0) + 1)) - set(seqs))
        bad.append(f"event_sequence: not 1..{len(seqs)}: gaps {gaps[:10]}, duplicates {dup[:10]}")
    per_task: dict[str, list[str]] = defaultdict(list)
    for e in events:
        per_task[e["task"]].append(e["state"])
    for t in ix["db.task"]:
        evs = per_task.get(t["task"], [])
        if t["state"] in FINISHED and evs[-1:] != [t["state"]]:
            bad.append(f"event_missing: task {t['task']} is {t['state']} but its result events are {evs}")
        if len(evs) != len(set(evs)) or sum(e in TERMINAL for e in evs) > 1:
            bad.append(f"event_duplicate: task {t['task']} has result events {evs}")


def _check_deliveries(ix: _Index, bad: list[str], fig: dict[str, Any], inbox_sub: str | None,
                      noack_sub: str | None) -> None:  # fmt: skip
    events = {e["seq"]: e for e in ix["db.event"]}
    subs = {s["sub"]: s for s in ix["db.subscription"]}
    dels: dict[str, dict[int, Record]] = defaultdict(dict)
    for d in ix["db.delivery"]:
        if d["seq"] in dels[d["sub"]]:
            bad.append(f"delivery_duplicate: {d['sub']} has two deliveries of seq {d['seq']}")
        dels[d["sub"]][d["seq"]] = d
    seen: dict[tuple[str, str], list[Record]] = defaultdict(list)
    for h in ix["delivery"]:
        seen[(h["sub"], h["delivery_id"])].append(h)
    for name in subs:
        mine = dels.get(name, {})
        for seq in sorted(set(events) - set(mine))[:20]:
            bad.append(f"delivery_missing: event seq {seq} has no delivery in {name}")
        for seq in sorted(set(mine) - set(events))[:20]:
            bad.append(f"delivery_unknown: {name} delivers seq {seq}, not a result event")
        for seq, d in mine.items():
            if seq in events and events[seq]["event_id"] != d["event_id"]:
                bad.append(f"delivery_unknown: {name} seq {seq} carries event {d['event_id']}")
            hs = seen.get((name, d["delivery_id"]), [])
            if len(hs) > d["attempts"]:
                bad.append(f"phantom_delivery: {name} delivery {d['delivery_id']} seen {len(hs)} times, "
                           f"handed out {d['attempts']}")  # fmt: skip
            handouts = Counter(h["attempt"] for h in hs)
            for attempt, n in handouts.items():
                if n > 1:
                    bad.append(f"duplicate_handout: {name} delivery {d['delivery_id']} attempt {attempt} seen {n} times")
        fig[f"deliveries_{name}"] = Counter(d["state"] for d in mine.values())
        fig[f"handouts_seen_{name}"] = sum(len(v) for (s, _), v in seen.items() if s == name)
    if inbox_sub is not None and inbox_sub in subs:
        mine = dels.get(inbox_sub, {})
        inbox = Counter(r["event_id"] for r in ix["db.inbox"] if r.get("sub", inbox_sub) == inbox_sub)
        applied = Counter(r["event_id"] for r in ix["inbox_apply"] if r.get("applied"))
        for seq, e in events.items():
            d = mine.get(seq)
            if d is not None and d["state"] != "ACKED":
                bad.append(f"not_acked: {inbox_sub} delivery of seq {seq} is {d['state']} after {d['attempts']} hand-outs")
            if d is not None and d["state"] == "ACKED" and not seen.get((inbox_sub, d["delivery_id"])):
                bad.append(f"ack_without_delivery: {inbox_sub} delivery of seq {seq} ACKED, never seen by a subscriber")
            if inbox[e["event_id"]] != 1:
                bad.append(f"inbox_missing: event seq {seq} applied {inbox[e['event_id']]} times at the inbox")
            if applied[e["event_id"]] > 1:
                bad.append(f"applied_twice: event seq {seq} applied {applied[e['event_id']]} times by subscribers")
        known = {e["event_id"] for e in events.values()}
        for eid in set(inbox) - known:
            bad.append(f"inbox_unknown: inbox holds event {eid}, not a result event")
        for b in ix["db.inbox_balance"]:
            if b["events"] != len(events):
                bad.append(f"inbox_balance: inbox counted {b['events']} events, {len(events)} exist")
        fig["inbox_rows"] = sum(inbox.values())
        fig["inbox_duplicates_skipped"] = sum(1 for r in ix["inbox_apply"] if not r.get("applied"))
    if noack_sub is not None and noack_sub in subs:
        unseen = 0
        for d in dels.get(noack_sub, {}).values():
            if d["state"] == "ACKED":
                bad.append(f"noack_acked: {noack_sub} delivery {d['delivery_id']} ACKED, nobody acked it")
            elif d["state"] != "EXHAUSTED" or d["attempts"] != d["budget"]:
                bad.append(f"noack_not_exhausted: {noack_sub} delivery of seq {d['seq']} {d['state']} "
                           f"after {d['attempts']}/{d['budget']} hand-outs")  # fmt: skip
            if not seen.get((noack_sub, d["delivery_id"])):
                unseen += 1
        fig[f"never_seen_{noack_sub}"] = unseen


def _check_schedules(ix: _Index, bad: list[str], fig: dict[str, Any]) -> None:
    tasks = {t["task"]: t for t in ix["db.task"]}
    every = {s["schedule"]: s.get("every_ms") for s in ix["db.schedule"]}
    occ: dict[str, list[Record]] = defaultdict(list)
    for o in ix["db.occurrence"]:
        occ[o["schedule"]].append(o)
    by_task = Counter(o["task"] for o in ix["db.occurrence"] if o["task"])
    for tid, n in by_task.items():
        if n > 1:
            bad.append(f"occurrence_shared_task: task {tid} belongs to {n} occurrences")
    for name, os_ in occ.items():
        fires = Counter(o["fire_us"] for o in os_)
        for f, n in fires.items():
            if n > 1:
                bad.append(f"occurrence_duplicate: schedule {name} fire time {f} written {n} times")
        step = every.get(name)
        ordered = sorted(os_, key=lambda o: o["fire_us"])
        for prev, nxt in itertools.pairwise(ordered):
            if not step:
                break
            want = prev["covered_until_us"] if prev["outcome"] == "skipped" and prev["covered_until_us"] else None
            expected = prev["fire_us"] + step * 1000
            if want is not None:
                # the next fire time at or after the end of the skipped range
                k = max(0, -(-(want - prev["fire_us"]) // (step * 1000)))
                expected = prev["fire_us"] + k * step * 1000
            if nxt["fire_us"] != expected:
                bad.append(f"occurrence_gap: schedule {name}: after {prev['fire_us']} ({prev['outcome']}) "
                           f"comes {nxt['fire_us']}, expected {expected}")  # fmt: skip
        for o in os_:
            if o["outcome"] == "created" and tasks and o["task"] not in tasks:
                bad.append(f"occurrence_task: occurrence {o['fire_us']} of {name} has no task {o['task']}")
        fig[f"occurrences_{name}"] = Counter(o["outcome"] for o in os_)


def _check_workflows(ix: _Index, bad: list[str], fig: dict[str, Any]) -> None:
    instances = {i["instance"]: i for i in ix["db.instance"]}
    signals = {(s["instance"], s["signal_id"]) for s in ix["db.signal"]}
    tasks = {t["task"]: t for t in ix["db.task"]}
    review: set[str] = set()
    for it in ix["db.instance_task"]:
        t = tasks.get(it["task"])
        if t is not None and t["state"] == "NEEDS_REVIEW":
            review.add(it["instance"])
    by_key: dict[str, set[str]] = defaultdict(set)
    for s in ix["wf_start"]:
        if s.get("instance"):
            by_key[s["business_key"]].add(s["instance"])
            if ix["db.instance"] and s["instance"] not in instances:
                bad.append(f"lost_instance: start {s['business_key']} answered {s['instance']}; no such instance")
    for key, ids in by_key.items():
        if len(ids) > 1:
            bad.append(f"business_key: {key} answered instances {sorted(ids)}")
    signalled: set[str] = set()
    for s in ix["signal"]:
        if s.get("phase") == "ok":
            signalled.add(s["instance"])
            if ix["db.instance"] and (s["instance"], s["signal_id"]) not in signals:
                bad.append(f"lost_signal: signal {s['signal_id']} to {s['instance']} acknowledged, not stored")
    for iid in signalled:
        i = instances.get(iid)
        if i is not None and i["state"] != "SUCCEEDED" and iid not in review:
            bad.append(f"instance_stuck: instance {iid} signalled, ends {i['state']} with no task in review")
    fig["instances"] = Counter(i["state"] for i in instances.values())
    fig["signals"] = len(signals)


def write_jsonl(path: Path, records: Iterable[Record]) -> None:
    with open(path, "w") as out:
        for r in records:
            out.write(json.dumps(r, default=str) + "\n")


def pid_tag() -> str:
    return f"{os.getpid()}"
