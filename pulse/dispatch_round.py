"""The node dispatch round: every waiting session of this node, of every namespace and
application, served by ONE look and (when work is due) ONE transaction.

1. **The look** (one round trip, no lock, no transaction of its own to speak of): for every
   queue the waiting sessions declared, the fairness subjects with WAITING tasks — a skip
   scan of ``ix_pulse_tasks_fair``, one index dive per subject (one SET statement per step
   of the walk, the step before's subject in a user variable, then one SELECT), sized by
   the queue's last look — each with its first task's owner, ``dispatch_at`` and
   ``available_at``, and the database clock. An idle node pays this one round trip per
   poll. A subject whose first task is not due yet
   sets when the dispatcher wakes next (a delayed task wakes its queue when it becomes
   available, not at the next poll).
2. **The round** (one transaction, the lock order of docs/design/execution-pipeline.md
   §3.1): the sessions of the queues with due work, locked in (namespace, id) order with
   the attempts each holds and the clock, the gates; the owners' application rows (sorted)
   then the queues' usage rows (sorted by namespace, queue) in ONE statement; the claim —
   ONE statement, a ``UNION ALL`` of one small ``LIMIT``-ed ``FOR UPDATE SKIP LOCKED`` part
   per (namespace, queue, fairness subject), planned by :mod:`pulse.dispatch_plan`
   (application → namespace/queue → subject, least recently served first); then ONE guarded
   UPDATE of every leased task (each row its own revision guard; the matched count must be
   the number of rows), ONE INSERT of the attempts, the usage deltas (one UPDATE per usage
   table) and the raw events of every namespace (one INSERT) — in one round trip.
3. After COMMIT the offers are pushed (never inside the transaction: it may be retried).

The offer is still only a lease on the task row; the start round issues the execution token.
"""

from __future__ import annotations

import time
from collections import defaultdict
from collections.abc import Sequence
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import Any

from orbit.ids import id_hex, new_id
from orbit.storage import Database, Tx
from orbit.storage.keys import KeySet
from pulse import transitions, wire
from pulse.attempt_rules import offer_rows
from pulse.dispatch_plan import Dealt, Plan, Pool, QueueKey, Served, deal, plan
from pulse.hub import Connection
from pulse.store import attempts as attempt_store
from pulse.store import dispatch as store
from pulse.store import queues as queue_store
from pulse.store import rounds as rounds_store

Row = dict[str, Any]

#: Most fairness subjects one look walks per queue (more: the next look goes on after the
#: last one seen, so every subject gets its turn).
LOOK_SUBJECTS = 128

#: Most tasks one round offers over all its pools (its transaction, its lease UPDATE and its
#: hold on the usage rows stay bounded; a round cut by it runs again at once).
ROUND_MAX_OFFERS = 512

#: Most tasks one pool (sessions of one namespace with the same queues and key ability) is
#: offered in one round (a pool cut by it runs again at once: a large pool is served over
#: several short rounds).
POOL_MAX_OFFERS = 256

#: A queue whose look found two fairness subjects or more counts as shared for this long
#: (seconds): the offer depth (WorkerSettings.offer_depth_percent) applies to its sessions.
SHARED_QUEUE_S = 10.0

DENIAL_RESERVATIONS = "reservations"
DENIAL_QUEUE_PERMITS = "queue_permits"
DENIAL_APPLICATION_ACTIVE = "application_active"


@dataclass
class Outcome:
    """What the round decided for one session."""

    offers: list[wire.Offer] = field(default_factory=list)
    #: None: the session is fine. Else why this node must drop its connection.
    gone: str | None = None
    #: The session had no free slot (dispatch backpressure).
    at_capacity: bool = False


@dataclass
class Result:
    """One round: an outcome per connection (in the order given), whether more may be due,
    offer slots withheld by limits (by denial kind), and the transactions it ran."""

    outcomes: list[Outcome]
    more: bool = False
    denied: dict[str, int] = field(default_factory=lambda: defaultdict(int))
    transactions: int = 0
    #: Seconds (database clock) until the first task the look saw that is not due yet.
    wake_in: float | None = None


@dataclass
class Look:
    """What the look saw: the due subjects per queue and their owners."""

    subjects: dict[QueueKey, list[bytes]]
    owners: dict[tuple[bytes, bytes, bytes], bytes]
    wake_in: float | None


class NodeRound:
    """The node's dispatch round (see the module docstring). One per dispatcher."""

    def __init__(
        self, db: Database, node_id: str, offer_lease_ms: int, offer_depth_percent: int = 0
    ) -> None:
        self.db = db
        self.node_id = node_id
        self.offer_lease_ms = offer_lease_ms
        #: Most offered, not started attempts a session holds, in percent of its
        #: max_concurrency (0: no limit).
        self.offer_depth_percent = offer_depth_percent
        self.served = Served()
        #: Where the next look continues in a queue with more than LOOK_SUBJECTS subjects.
        self.cursors: dict[QueueKey, bytes] = {}
        #: Subjects each queue had at its last look (sizes the next look's first round trip).
        self.walks: dict[QueueKey, int] = {}
        #: Until when (monotonic) each queue counts as shared by several subjects.
        self.shared: dict[QueueKey, float] = {}
        #: The last look found due work: the next round looks inside its transaction.
        self._busy = False

    async def look(self, conns: Sequence[Connection], now: datetime | None = None) -> Look:
        """One round trip: the due subjects of every queue the sessions declared."""
        asked = self._asked(conns)
        rows = await self.db.read(
            lambda tx: store.round_look(tx, asked, LOOK_SUBJECTS, now, self.walks)
        )
        return self._parse(rows, [k for k, _ in asked])

    def _asked(self, conns: Sequence[Connection]) -> list[tuple[QueueKey, bytes | None]]:
        queues = sorted({(c.info.namespace_id, q.id) for c in conns for q in c.queues})
        return [(k, self.cursors.get(k)) for k in queues]

    def _parse(self, rows: list[Row], queues: list[QueueKey]) -> Look:
        """The look's rows: the due subjects and their owners, when to wake; the cursors of
        queues with more subjects than one look walks move on."""
        subjects: dict[QueueKey, list[bytes]] = defaultdict(list)
        owners: dict[tuple[bytes, bytes, bytes], bytes] = {}
        wake: float | None = None
        walked: set[QueueKey] = set()
        counts: dict[QueueKey, int] = dict.fromkeys(queues, 0)
        for r in rows:
            qk = (bytes(r["namespace_id"]), bytes(r["queue_id"]))
            subject = bytes(r["subject"])
            counts[qk] = counts.get(qk, 0) + 1
            if int(r["n"]) >= LOOK_SUBJECTS:
                self.cursors[qk] = subject
                walked.add(qk)
            if r["owner_id"] is None or r["first_dispatch_at"] is None:
                continue  # the subject's tasks left WAITING between the walk and the dive
            db_now: datetime = r["db_now"]
            if r["first_dispatch_at"] <= db_now:
                subjects[qk].append(subject)
                owners[(qk[0], qk[1], subject)] = bytes(r["owner_id"])
            if r["first_available_at"] > db_now:
                s = (r["first_available_at"] - db_now).total_seconds()
                wake = s if wake is None else min(wake, s)
        for qk in queues:
            if qk not in walked:
                self.cursors.pop(qk, None)
        if len(self.cursors) > 10_000:
            self.cursors.clear()
        if len(self.walks) > 10_000:
            self.walks.clear()
        self.walks.update(counts)
        until = time.monotonic() + SHARED_QUEUE_S
        if len(self.shared) > 10_000:
            self.shared.clear()
        self.shared.update((qk, until) for qk, n in counts.items() if n >= 2)
        return Look(dict(subjects), owners, wake)

    async def run(
        self, conns: Sequence[Connection], *, pool_cap: int, now: datetime | None = None
    ) -> Result:
        """The look, then (work due) the round; one outcome per connection. While the last
        round found work, the look goes inside the round instead, in the round trip of the
        session locks (one round trip and one transaction fewer per round under load)."""
        if self._busy:
            got = await self.db.transaction(lambda tx: self._round(tx, conns, None, pool_cap, now))
            got.transactions = 1
            return got
        seen = await self.look(conns, now)
        self._busy = bool(seen.subjects)
        result = Result([Outcome() for _ in conns], wake_in=seen.wake_in)
        if not seen.subjects:
            return result
        chosen = [
            i
            for i, c in enumerate(conns)
            if any((c.info.namespace_id, q.id) in seen.subjects for q in c.queues)
        ]
        if not chosen:
            return result
        part = [conns[i] for i in chosen]
        got = await self.db.transaction(lambda tx: self._round(tx, part, seen, pool_cap, now))
        result.transactions = 1
        for i, outcome in zip(chosen, got.outcomes, strict=True):
            result.outcomes[i] = outcome
        result.more, result.denied = got.more, got.denied
        return result

    async def _round(
        self,
        tx: Tx,
        conns: Sequence[Connection],
        seen: Look | None,
        pool_cap: int,
        now: datetime | None,
    ) -> Result:
        out = Result([Outcome() for _ in conns])
        ns_ids = sorted({c.info.namespace_id for c in conns})
        gate_keys = KeySet((ns, queue_store.NAMESPACE_GATE) for ns in ns_ids)
        # Level 0: the sessions (sorted), their held counts and the clock; the gates; and,
        # without a look before the round, the look (unlocked reads) — one round trip.
        sessions_lock = store.round_sessions_lock(tx, KeySet(c.key for c in conns), now)
        if seen is None:
            asked = self._asked(conns)
            for qk, _ in asked:
                gate_keys.add(*qk)
            session_rows, gates, rows = await tx.pipeline(
                sessions_lock,
                store.round_gates(tx, gate_keys),
                store.round_look(tx, asked, LOOK_SUBJECTS, now, self.walks),
            )
            seen = self._parse(rows, [k for k, _ in asked])
            self._busy = bool(seen.subjects)
            out.wake_in = seen.wake_in
        else:
            for qk in seen.subjects:
                gate_keys.add(*qk)
            session_rows, gates = await tx.pipeline(sessions_lock, store.round_gates(tx, gate_keys))
        due = seen.subjects
        by_key = {(bytes(r["namespace_id"]), bytes(r["id"])): r for r in session_rows}
        t: datetime | None = now
        if t is None and session_rows:
            t = session_rows[0]["db_now"]
        pools: dict[tuple[Any, ...], Pool] = {}
        for i, c in enumerate(conns):
            row = by_key.get(c.key)
            if (
                row is None
                or row["state"] != "ACTIVE"
                or (t is not None and row["expires_at"] <= t)
            ):
                out.outcomes[i].gone = "expired"
                continue
            if row["node_id"] != self.node_id:
                out.outcomes[i].gone = "moved"
                continue
            if not any((c.info.namespace_id, q.id) in due for q in c.queues):
                continue  # nothing due on its queues
            slots = int(row["max_concurrency"]) - int(row["held"])
            if slots <= 0:
                out.outcomes[i].at_capacity = True
                continue
            if self.offer_depth_percent > 0 and self._shared(c):
                depth = -(-int(row["max_concurrency"]) * self.offer_depth_percent // 100)
                depth_room = depth - int(row["offered"])
                c.depth_capped = depth_room < slots  # its next start wakes the dispatcher
                slots = min(slots, depth_room)
                if slots <= 0:
                    continue
            ns = c.info.namespace_id
            if gates.get((ns, queue_store.NAMESPACE_GATE)):
                continue
            queue_ids = tuple(q.id for q in c.queues if not gates.get((ns, q.id)))
            keys_ok = bool(row["concurrency_keys"])
            pool = pools.setdefault(
                (ns, queue_ids, keys_ok), Pool(c.info.application_id, ns, queue_ids, keys_ok)
            )
            pool.sessions.append((i, slots))
        if t is None or not pools:
            return out
        # Level 1 and 2: the owners of the due subjects (sorted), then the queues' usage rows
        # (sorted by namespace, queue), in ONE statement, with the limits offers are capped by.
        in_play = {(p.namespace_id, q) for p in pools.values() for q in p.queue_ids}
        subjects = {qk: s for qk, s in seen.subjects.items() if qk in in_play}
        if not subjects:
            return out
        owners = sorted({o for k, o in seen.owners.items() if (k[0], k[1]) in subjects})
        apps, usage = await store.round_usage_lock(tx, KeySet(subjects), owners)
        allowance, kinds = owner_allowance(apps)
        room = queue_room(usage)
        pool_list = list(pools.values())
        the_plan = plan(pool_list, subjects, self.served, budget=ROUND_MAX_OFFERS,
                        pool_cap=pool_cap, queue_room=dict(room))  # fmt: skip
        for p in pool_list:  # queues whose permits are all taken: their slots are denials
            for q in p.queue_ids:
                if (p.namespace_id, q) in subjects and room.get((p.namespace_id, q), 1) <= 0:
                    out.denied[DENIAL_QUEUE_PERMITS] += p.free
        # Level 3: the claim, ONE statement (SKIP LOCKED: never waits).
        rows = await store.round_claim(tx, the_plan.parts, t)
        locked = set(owners)
        rows = [r for r in rows if bytes(r["owner_id"]) in locked]
        dealt = deal(pool_list, the_plan, rows, queue_room=room, allowance=allowance)
        # More may be due: a pool used its whole grant and had more free slots (the round's
        # budget or the most one pool takes cut it), a subject gave all it was asked for
        # while its pool had room, or a second task of a key was left for the next round.
        cut = any(
            0 < p.grant <= len(dealt.offers[i]) and p.grant < p.free
            for i, p in enumerate(pool_list)
        )
        out.more = cut or dealt.more or dealt.dropped > 0
        out.denied[DENIAL_QUEUE_PERMITS] += dealt.denied_queue
        for owner, n in dealt.denied_owner.items():
            out.denied[kinds.get(owner, DENIAL_RESERVATIONS)] += n
        offers = [(row, i) for per_pool in dealt.offers for row, i in per_pool]
        if offers:
            await self._write(tx, conns, offers, t, out)
            self._mark(pool_list, the_plan, dealt)
        self.served.round += 1
        return out

    def _shared(self, c: Connection) -> bool:
        """Whether one of the session's queues was shared by several fairness subjects at a
        recent look (the offer depth applies: a one-subject queue gains nothing from it)."""
        mono = time.monotonic()
        return any(self.shared.get((c.info.namespace_id, q.id), 0.0) > mono for q in c.queues)

    async def _write(
        self,
        tx: Tx,
        conns: Sequence[Connection],
        offers: list[tuple[Row, int]],
        t: datetime,
        out: Result,
    ) -> None:
        """Lease the offered tasks, insert their attempts, add the reservations, record the
        events — one round trip; the offers go into ``out`` (pushed after COMMIT)."""
        lease = t + timedelta(milliseconds=self.offer_lease_ms)
        leased: dict[tuple[bytes, bytes], dict[str, Any]] = {}
        attempts: list[Row] = []
        per_owner: dict[bytes, int] = defaultdict(int)
        per_queue: dict[QueueKey, int] = defaultdict(int)
        changes: list[transitions.NsChange] = []
        for row, i in offers:
            ns = bytes(row["namespace_id"])
            session_id = conns[i].info.session_id
            attempt_id = new_id()
            leased[(ns, bytes(row["id"]))] = {
                "attempt_id": attempt_id, "session_id": session_id, "revision": row["revision"],
            }  # fmt: skip
            attempt, after = offer_rows(ns, row, attempt_id, session_id, lease, t)
            attempts.append(attempt)
            per_owner[bytes(row["owner_id"])] += 1
            per_queue[(ns, bytes(row["queue_id"]))] += 1
            out.outcomes[i].offers.append(
                wire.offer_from_row(row, attempt_id, attempt["generation"], lease)
            )
            changes.append(
                (ns, (after, transitions.EVENT_LEASED, {"session_id": id_hex(session_id)}))
            )
        lease_sql = rounds_store.tasks_lease_statement(leased, lease, t)
        usage = queue_store.usage_add_statements(
            {o: (0, n, 0) for o, n in per_owner.items()},
            {q: (0, n, 0) for q, n in per_queue.items()},
        )
        counts, *_ = await tx.pipeline(
            tx.execute_batch([lease_sql, *usage]),
            attempt_store.attempt_insert_many(tx, attempts),
            transitions.record_across(tx, changes, now=t),
        )
        if counts[0] != len(leased):  # pragma: no cover - every claimed row is locked
            raise RuntimeError("a claimed task changed while locked")

    def _mark(self, pools: list[Pool], the_plan: Plan, dealt: Dealt) -> None:
        """Remember who was served this round (the next round serves the others first)."""
        keys: list[Any] = []
        for p, per_pool in zip(pools, dealt.offers, strict=True):
            if not per_pool:
                continue
            keys += [("app", p.application_id), ("pool", p.key)]
            for row, _ in per_pool:
                qk = (bytes(row["namespace_id"]), bytes(row["queue_id"]))
                keys += [("queue", qk), ("subject", qk, bytes(row["fair_subject"]))]
        self.served.mark(keys)


def owner_allowance(apps: dict[bytes, Row]) -> tuple[dict[bytes, int], dict[bytes, str]]:
    """Offers each limited owner may still get, judged on its locked resources row: the
    smaller of ``max_reservations - reservations`` and ``max_active_attempts -
    active_attempts - reservations`` (never below 0); and the denial kind that binds."""
    allowance: dict[bytes, int] = {}
    kinds: dict[bytes, str] = {}
    for o, r in apps.items():
        rooms: list[tuple[int, str]] = []
        if r["max_reservations"] is not None:
            left = int(r["max_reservations"]) - int(r["reservations"])
            rooms.append((max(0, left), DENIAL_RESERVATIONS))
        if r["max_active_attempts"] is not None:
            left = (
                int(r["max_active_attempts"]) - int(r["active_attempts"]) - int(r["reservations"])
            )
            rooms.append((max(0, left), DENIAL_APPLICATION_ACTIVE))
        if rooms:
            allowance[o], kinds[o] = min(rooms)
    return allowance, kinds


def queue_room(usage: dict[QueueKey, Row]) -> dict[QueueKey, int]:
    """Offers each queue with ``max_concurrency`` may still get (running + offered)."""
    return {
        q: max(0, int(r["max_concurrency"]) - int(r["active_attempts"]) - int(r["reservations"]))
        for q, r in usage.items()
        if r["max_concurrency"] is not None
    }
