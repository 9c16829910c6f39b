"""The dispatcher: two-step dispatch, step 1 (lease due tasks to connected sessions).

The loop (:meth:`Dispatcher.run`, :meth:`Dispatcher.run_once`) serves every waiting session
of the node, of every namespace, with the node dispatch round (:mod:`pulse.dispatch_round`:
one look, then ONE transaction; capacity by application → namespace/queue → fairness
subject). This module keeps the per-group transaction below for a session's first dispatch
(:meth:`Dispatcher.dispatch_to`, the HTTP poll) and as the fallback when a round fails as a
whole.

For each group of sessions connected to this node that want offers — one namespace, the
same declared queues, the same keyed-task ability (``_group_key``) — one transaction:

1. lock the session rows (in id order) and check, by the database, that each is ACTIVE,
   not expired and held by this node; count the attempts each holds (OFFERED + RUNNING) —
   ``free = max_concurrency - held`` is the flow-control budget, so a session never holds
   more than its ``max_concurrency`` (a full session is counted as dispatch backpressure);
2. skip queues whose gate (namespace or queue) is closed;
3. per queue, find the owners (applications) with waiting work — an in-memory *hint* per
   queue, refreshed by walking the owners (one index dive each) every
   ``owner_refresh_uses`` uses or ``owner_refresh_ms`` (lost on restart: one probe, no harm);
4. lock, in ONE statement and before any task, the resources rows of the owners in play
   (the hint's due owners plus the owners it saw recently on the queue) and the usage rows
   of the session's queues (lock order: application resources → queue → task/attempt →
   permit); an owner with a reservation quota (``max_reservations``) or an active-attempt
   quota (``max_active_attempts``, running + offered) is offered at most what its quota
   leaves, and a queue with ``max_concurrency`` at most what its permits leave (running +
   offered), judged on the locked rows (the lock statement returns the limits too), so a
   start is not offered only to be refused;
5. claim due tasks (``WAITING``, available, not past the deadline, keyed only for sessions
   that handle keys and only while the key is not held to its limit; never two tasks with
   the same key in one batch) with ``SELECT … FOR UPDATE SKIP LOCKED``, in ``dispatch_at``
   then id order, at most ``min(free, batch × sessions, GROUP_MAX_CLAIM)`` per queue
   (``free`` summed over the group; the claimed tasks are then dealt out round-robin in
   claim order, each session at most its own free slots): with one owner in play, one
   queue-wide claim (as before fairness existed); with several, the capacity is split
   round-robin across the owners (starting from a rotating offset) with one claim per owner,
   and what an owner could not use goes to the others. A queue-wide claim may return a
   task of an owner whose row this transaction did not lock (an owner the hint never saw):
   the transaction rolls back and runs again at once with that owner locked too (at most
   ``_MAX_RERUNS`` times; the last run leaves such tasks WAITING for the next round);
6. update the claimed tasks by primary key with their revisions (WAITING → LEASED, each to
   its session; one guarded multi-row UPDATE), insert the OFFERED attempts (generation =
   attempts + 1, a short offer lease) with one INSERT;
7. add the reservations to the owners' application rows and the queues' usage rows (all
   locked in step 4; one round trip), write the raw events;
8. commit — and only then push the offers to the worker (a transaction may be retried; a
   push cannot be taken back). An offer that never arrives expires and recovery returns the
   task to WAITING.

Groups and sessions rotate round-robin per node (one round = every group once), queues
rotate per round within a session, owners rotate per queue. Concurrent dispatchers
(threads, processes, nodes) get disjoint tasks from SKIP LOCKED; the guarded UPDATEs and the
start transaction's checks mean no task is offered twice at once and no attempt starts
twice. New work wakes this node's dispatcher at once (Hub.notify_new_work); other nodes find
it within ``dispatch_poll_ms``. docs/dispatch.md explains the whole picture.
"""

from __future__ import annotations

import asyncio
import logging
import random
import time
from collections import Counter, defaultdict
from collections.abc import Sequence
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import Any

from orbit.ids import id_hex, new_id
from orbit.metrics import Registry
from orbit.shards import shard_group
from orbit.storage import Database, Tx
from orbit.store.clock import clock_now
from pulse import transitions, wire
from pulse.attempt_rules import offer_rows
from pulse.attempts import Change
from pulse.dispatch_round import NodeRound
from pulse.hub import CLOSE_REPLACED, CLOSE_SESSION_GONE, Connection, Hub
from pulse.sessions import QueueRef
from pulse.store import attempts as attempt_store
from pulse.store import dispatch as store
from pulse.store import queues as queue_store
from pulse.store import sessions as session_store

log = logging.getLogger("pulse.dispatch")

#: Denial kinds of ``pulse_dispatch_denials_total``.
DENIAL_SESSION_CAPACITY = "session_capacity"
DENIAL_RESERVATIONS = "reservations"
#: Offer slots withheld because the queue's ``max_concurrency`` is taken by running and
#: offered attempts (its start would be refused with ``permits_exhausted``).
DENIAL_QUEUE_PERMITS = "queue_permits"
#: Offer slots withheld because the owner's ``max_active_attempts`` is taken by running and
#: offered attempts (its start would be refused with ``application_quota``).
DENIAL_APPLICATION_ACTIVE = "application_active"

#: Most owners one probe of a queue lists (more owners: the next probe continues after the
#: last one, so they all get turns over successive probes).
OWNERS_PER_PROBE = 64

#: A hint marked stale is probed again no sooner than this (a queue that keeps running dry
#: must not cost a probe per dispatch).
_MIN_REPROBE_MS = 50

#: Re-runs of a dispatch transaction whose queue-wide claim met owners it had not locked
#: (each re-run locks them too); the last run leaves their tasks for the next round.
_MAX_RERUNS = 2

#: Most tasks one dispatch transaction claims from one queue for a group of sessions (keeps
#: a large group's transaction, its lease UPDATE and its hold on the usage rows bounded).
GROUP_MAX_CLAIM = 256

#: An owner seen on a queue (by a probe or a claim) stays in the queue's lock set this long
#: after it was last seen, so a queue whose owner's tasks come one at a time does not cost a
#: re-run each time it ran dry in between.
_SEEN_TTL_S = 60.0

Row = dict[str, Any]


@dataclass
class OwnerHint:
    """What this node believes about one queue's owners (a hint: stale or lost is safe —
    the claims themselves decide what is due, and the quota is checked under lock)."""

    #: Owners with WAITING tasks → dispatch_at of their first task, at probe time.
    owners: dict[bytes, datetime]
    #: Owners that had a ``max_reservations`` at probe time.
    limited: set[bytes]
    probed_at: float
    uses: int = 0
    #: Rotation offset: which owner gets the first share next time.
    turn: int = 0
    #: Set when a claim met an owner the hint did not list: re-probe on next use.
    stale: bool = False
    #: Where the next probe continues when a queue has more than OWNERS_PER_PROBE owners.
    cursor: bytes | None = None
    #: Owners seen on the queue (probe or claim) → when last seen (monotonic): their rows
    #: are locked first with the due owners' (a queue-wide claim may return their tasks).
    seen: dict[bytes, float] = field(default_factory=dict)

    def lock_set(self, due: list[bytes], mono: float) -> set[bytes]:
        """The owners whose resources rows a dispatch on this queue locks first."""
        for o, at in list(self.seen.items()):
            if mono - at > _SEEN_TTL_S:
                del self.seen[o]
        if len(self.seen) > OWNERS_PER_PROBE:  # keep the most recently seen
            recent = sorted(self.seen.items(), key=lambda kv: kv[1])[-OWNERS_PER_PROBE:]
            self.seen = dict(recent)
        return set(due) | set(self.seen)


@dataclass
class _Outcome:
    """What one dispatch transaction decided for one session of its group."""

    offers: list[wire.Offer]
    #: None: the session is fine. Else why this node must drop its connection.
    gone: str | None = None
    #: The session had no free slot (dispatch backpressure).
    at_capacity: bool = False


@dataclass
class _Round:
    """What one dispatch transaction decided for a group of sessions."""

    outcomes: list[_Outcome]  # one per session, in the group's order
    more: bool = False  # some queue gave a full batch (more may be due)
    #: Offer slots withheld by limits, by denial kind (reservations, queue permits,
    #: application active attempts).
    denied: Counter[str] = field(default_factory=Counter)


class OwnersNotLocked(Exception):
    """A queue-wide claim returned tasks of owners whose resources rows this transaction did
    not lock first: it rolls back and runs again with them in the lock set (taking their
    rows now, after task rows, would break the lock order)."""

    def __init__(self, owner_ids: set[bytes]) -> None:
        super().__init__(f"{len(owner_ids)} owner(s) not locked")
        self.owner_ids = owner_ids


@dataclass
class _Batch:
    """What one dispatch transaction claimed so far."""

    rows: list[tuple[Row, bytes]] = field(default_factory=list)  # (claimed row, attempt id)
    keys: set[bytes] = field(default_factory=set)  # concurrency key digests offered
    dropped: int = 0  # claimed rows left out (same key as an earlier one in the batch)
    denied: Counter[str] = field(default_factory=Counter)  # offer slots withheld, by kind
    #: The denial kind of each limited owner's allowance (the limit that binds).
    owner_kind: dict[bytes, str] = field(default_factory=dict)

    def add(self, rows: list[Row]) -> int:
        """Keep ``rows`` except a second task of a concurrency key; the number kept."""
        kept = 0
        for row in rows:
            digest = row["concurrency_key_digest"]
            if digest is not None:
                if digest in self.keys:
                    self.dropped += 1  # locked until COMMIT, not offered: stays WAITING
                    continue
                self.keys.add(digest)
            self.rows.append((row, new_id()))
            kept += 1
        return kept


class Dispatcher:
    """Leases due tasks to this node's connected sessions. Safe on many nodes at once."""

    def __init__(
        self,
        db: Database,
        hub: Hub,
        *,
        metrics: Registry | None = None,
        owner_refresh_uses: int = 16,
        owner_refresh_ms: int = 1_000,
    ) -> None:
        self.db = db
        self.hub = hub
        self.settings = hub.settings
        self.owner_refresh_uses = owner_refresh_uses
        self.owner_refresh_ms = owner_refresh_ms
        self._rotation = 0
        self._more = False
        #: The node dispatch round of each shard group this node serves sessions of.
        self._nodes: dict[int, NodeRound] = {}
        #: Seconds until the first task the last look saw that is not due yet (None: none).
        self._wake_in: float | None = None
        self._hints: dict[tuple[bytes, bytes], OwnerHint] = {}
        self._metrics = metrics
        if metrics is not None:
            self._offers = metrics.counter("pulse_offers_total", "Attempts offered to workers")
            self._seconds = metrics.histogram(
                "pulse_dispatch_seconds", "Time of one dispatch transaction"
            )
            self._denials = metrics.counter(
                "pulse_dispatch_denials_total",
                "Dispatch backpressure: sessions at capacity, offer slots withheld by quotas"
                " and permits",
                ("kind",),
            )
            self._probes = metrics.counter(
                "pulse_dispatch_owner_probes_total",
                "Probes of a queue's owners with waiting tasks (fair dispatch hint refreshes)",
            )

    async def run_once(self, *, now: datetime | None = None) -> int:
        """One node dispatch round over every connected session that wants offers, of every
        namespace (:mod:`pulse.dispatch_round`: one look; when work is due, ONE transaction);
        return the number of offers."""
        conns = [c for c in self.hub.connections() if c.wants_offers()]
        if not conns:
            self._wake_in = None
            return 0
        # A round spans the namespaces of one shard group only (orbit.shards): one round per
        # group, each with its own look, rotation and budget.
        by_group: dict[int, list[Connection]] = {}
        for c in conns:
            by_group.setdefault(shard_group(c.info.namespace_id), []).append(c)
        self._wake_in = None
        total = 0
        for group, members in sorted(by_group.items()):
            node = self._nodes.get(group)
            if node is None:
                node = self._nodes[group] = NodeRound(
                    self.db, self.hub.node_id, self.settings.offer_lease_ms
                )
            total += await self._run_node(node, members, now)
        return total

    async def _run_node(
        self, node: NodeRound, conns: Sequence[Connection], now: datetime | None
    ) -> int:
        began = time.perf_counter()
        try:
            result = await node.run(conns, pool_cap=GROUP_MAX_CLAIM, now=now)
        except asyncio.CancelledError:
            raise
        except Exception:
            # The round failed as a whole (not a lock wait: those are retried inside): serve
            # the groups one transaction each, so one namespace's failure cannot hold back
            # the others.
            log.exception("node dispatch round failed; serving the groups one by one")
            return await self._run_groups(conns, now)
        if result.wake_in is not None:
            self._wake_in = (
                result.wake_in if self._wake_in is None else min(self._wake_in, result.wake_in)
            )
        if result.more:
            self._more = True
        if self._metrics is not None:
            if result.transactions:
                self._seconds.observe(time.perf_counter() - began)
            for outcome in result.outcomes:
                if outcome.at_capacity:
                    self._denials.inc(kind=DENIAL_SESSION_CAPACITY)
            for kind, n in sorted(result.denied.items()):
                if n:
                    self._denials.inc(n, kind=kind)
        return await self._deliver(conns, result.outcomes)

    async def _run_groups(self, conns: Sequence[Connection], now: datetime | None) -> int:
        """One transaction per group of sessions (:meth:`dispatch_group`), groups rotating."""
        total = 0
        self._rotation += 1
        start = self._rotation % len(conns)
        groups: dict[tuple[Any, ...], list[Connection]] = {}
        for conn in [*conns[start:], *conns[:start]]:
            groups.setdefault(_group_key(conn), []).append(conn)
        for group in groups.values():
            try:
                total += await self.dispatch_group(group, now=now)
            except asyncio.CancelledError:
                raise
            except Exception:
                log.exception(
                    "dispatch to sessions %s failed",
                    ", ".join(id_hex(c.info.session_id) for c in group),
                )
        return total

    async def _deliver(self, conns: Sequence[Connection], outcomes: Sequence[Any]) -> int:
        """After COMMIT: close the connections of sessions gone, push each the offers."""
        total = 0
        for conn, outcome in zip(conns, outcomes, strict=True):
            if outcome.gone is not None:
                self.hub.unregister(conn)
                code = CLOSE_REPLACED if outcome.gone == "moved" else CLOSE_SESSION_GONE
                await conn.close(code, "session_" + outcome.gone)
                continue
            if outcome.offers:
                if self._metrics is not None:
                    self._offers.inc(len(outcome.offers))
                await self.hub.push_offers(conn, outcome.offers)
                total += len(outcome.offers)
        return total

    async def dispatch_to(self, conn: Connection, *, now: datetime | None = None) -> int:
        """Offer due tasks to one session (one transaction), then push them."""
        return await self.dispatch_group([conn], now=now)

    async def dispatch_group(
        self, conns: Sequence[Connection], *, now: datetime | None = None
    ) -> int:
        """Offer due tasks to sessions of ONE namespace that take the same queues, in one
        transaction (the usage rows are locked once for all of them), then push each its
        offers. Claimed tasks are dealt out round-robin in ``conns`` order."""
        began = time.perf_counter()
        extra: set[bytes] = set()
        for rerun in range(_MAX_RERUNS + 1):
            strict = rerun < _MAX_RERUNS
            try:
                round_ = await self.db.transaction(
                    lambda tx, e=frozenset(extra), s=strict: self._lease_group(tx, conns, now, e, s)
                )
                break
            except OwnersNotLocked as missed:
                # Rolled back before any counter changed: run again with their rows locked
                # first (they are in the queues' hints now too).
                extra |= missed.owner_ids
        if self._metrics is not None:
            self._seconds.observe(time.perf_counter() - began)
            for outcome in round_.outcomes:
                if outcome.at_capacity:
                    self._denials.inc(kind=DENIAL_SESSION_CAPACITY)
            for kind, n in sorted(round_.denied.items()):
                if n:
                    self._denials.inc(n, kind=kind)
        if round_.more:
            self._more = True
        return await self._deliver(conns, round_.outcomes)

    # -- the owner hint ----------------------------------------------------------------------

    def owner_hint(self, namespace_id: bytes, queue_id: bytes) -> OwnerHint | None:
        """This node's current hint for a queue (tests and introspection)."""
        return self._hints.get((namespace_id, queue_id))

    async def refresh_owner_hint(self, namespace_id: bytes, queue_id: bytes) -> OwnerHint:
        """Probe a queue's owners now (in a read transaction of its own); the new hint."""

        async def run(tx: Tx) -> OwnerHint:
            hint = self._hints.get((namespace_id, queue_id))
            if hint is not None:
                hint.probed_at = float("-inf")
            return await self._hint(tx, namespace_id, queue_id)

        return await self.db.read(run)

    async def _hint(self, tx: Tx, namespace_id: bytes, queue_id: bytes) -> OwnerHint:
        key = (namespace_id, queue_id)
        hint = self._hints.get(key)
        mono = time.monotonic()
        age_ms = 0.0 if hint is None else (mono - hint.probed_at) * 1000
        if (
            hint is None
            or (hint.stale and age_ms >= min(_MIN_REPROBE_MS, self.owner_refresh_ms))
            or hint.uses >= self.owner_refresh_uses
            or age_ms >= self.owner_refresh_ms
        ):
            cursor = None if hint is None else hint.cursor
            owners, cursor = await self._probe(tx, namespace_id, queue_id, cursor)
            limits = await store.application_reservation_limits_many(tx, list(owners))
            limited = {o for o, m in limits.items() if m is not None}
            turn = 0 if hint is None else hint.turn
            seen = {} if hint is None else hint.seen
            seen.update(dict.fromkeys(owners, mono))
            if len(self._hints) > 10_000:  # queues no session of this node uses any more
                self._hints.clear()
            hint = self._hints[key] = OwnerHint(
                owners, limited, mono, turn=turn, cursor=cursor, seen=seen
            )
            if self._metrics is not None:
                self._probes.inc()
        hint.uses += 1
        return hint

    async def _probe(
        self, tx: Tx, namespace_id: bytes, queue_id: bytes, start_after: bytes | None
    ) -> tuple[dict[bytes, datetime], bytes | None]:
        """Walk the owners with WAITING tasks in the queue (one index dive each), at most
        ``OWNERS_PER_PROBE``, starting after ``start_after`` and wrapping around; return
        them and where the next probe continues (None: from the first; all were seen)."""
        owners: dict[bytes, datetime] = {}
        after = start_after
        wrapped = start_after is None
        while len(owners) < OWNERS_PER_PROBE:
            found = await store.task_owner_next(tx, namespace_id, queue_id, after)
            if found is None:
                if wrapped:
                    return owners, None
                wrapped, after = True, None
                continue
            owner, first = found
            if owner in owners:  # wrapped around to owners seen already
                return owners, None
            owners[owner] = first
            after = owner
        return owners, after

    def _note_owners(
        self, hint: OwnerHint, rows: list[Row], locked: set[bytes], strict: bool
    ) -> list[Row]:
        """Check a queue-wide claim's rows: an owner the hint did not list marks it for a
        probe on next use; an owner whose row is not locked ends the transaction
        (:class:`OwnersNotLocked`) or, on the last run, its tasks are left out (claimed,
        so they stay WAITING, locked until COMMIT). Returns the rows to offer."""
        mono = time.monotonic()
        for r in rows:
            hint.seen[r["owner_id"]] = mono
            if r["owner_id"] not in hint.owners:
                hint.stale = True
        unlocked = {r["owner_id"] for r in rows} - locked
        if not unlocked:
            return rows
        if strict:
            raise OwnersNotLocked(unlocked)
        return [r for r in rows if r["owner_id"] in locked]

    # -- one dispatch transaction ------------------------------------------------------------

    async def _lease_group(
        self,
        tx: Tx,
        conns: Sequence[Connection],
        now: datetime | None,
        extra: frozenset[bytes] = frozenset(),
        strict: bool = True,
    ) -> _Round:
        ns = conns[0].info.namespace_id
        queues = conns[0].queues
        outcomes = [_Outcome([]) for _ in conns]
        # The sessions (locked first, in id order), the clock, what each session holds and
        # the gates: ONE round trip (Tx.pipeline; the same statements in the same order).
        order = sorted(range(len(conns)), key=lambda i: conns[i].info.session_id)
        k = len(conns)
        got = await tx.pipeline(
            *(session_store.session_lock(tx, ns, conns[i].info.session_id) for i in order),
            clock_now(tx, now),
            *(session_store.session_count_held(tx, ns, conns[i].info.session_id) for i in order),
            queue_store.gate_get_many(
                tx, ns, [queue_store.NAMESPACE_GATE, *(q.id for q in queues)]
            ),
        )
        t: datetime = got[k]
        gates = got[-1]
        sessions: dict[int, Row] = {}
        free: dict[int, int] = {}  # offers each session may still take
        for pos, i in enumerate(order):
            session, held = got[pos], got[k + 1 + pos]
            if session is None or session["state"] != "ACTIVE" or session["expires_at"] <= t:
                outcomes[i].gone = "expired"
            elif session["node_id"] != self.hub.node_id:
                outcomes[i].gone = "moved"
            elif queues:
                room = int(session["max_concurrency"]) - held
                if room <= 0:
                    outcomes[i].at_capacity = True
                else:
                    sessions[i], free[i] = session, room
        if not free or _paused(gates, queue_store.NAMESPACE_GATE):
            return _Round(outcomes)
        keys_ok = all(bool(s["concurrency_keys"]) for s in sessions.values())
        n = len(queues)
        first = self._rotation % n
        # Each session takes at most `dispatch_batch` from one queue, as when served alone,
        # and one transaction claims at most GROUP_MAX_CLAIM of a queue (a full claim asks
        # for another round at once: a large group is served over several transactions).
        batch_size = min(self.settings.dispatch_batch * len(free), GROUP_MAX_CLAIM)
        capacity = sum(free.values())
        candidates = [q for q in queues[first:] + queues[:first] if not _paused(gates, q.id)]
        if not candidates:
            return _Round(outcomes)
        # Owners in play per queue (non-locking probes, before any lock is taken).
        hints = await tx.pipeline(*(self._hint(tx, ns, q.id) for q in candidates))
        plans = [(q, hint, _due_owners(hint, t)) for q, hint in zip(candidates, hints, strict=True)]
        # The lock order's first two steps, in ONE statement, before any task: the
        # resources rows of every owner in play or seen lately on these queues (and of the
        # owners a rolled-back run met), then the queues' usage rows.
        mono = time.monotonic()
        locked = set(extra)
        for _, hint, owners in plans:
            locked |= hint.lock_set(owners, mono)
        queue_ids = [q.id for q, _, _ in plans]
        if locked:  # the same locks, plus the limits the offers are capped by
            apps, usage = await store.usage_lock_with_limits(tx, ns, queue_ids, locked)
        else:  # no owner in play: nothing of an owner can be offered (limits not needed)
            apps, usage = await transitions.lock_usage(tx, ns, queue_ids, locked)
        # Owners' quotas (reservations, active attempts) and queues' permits are judged on
        # the locked rows: what is running plus what is offered may not pass them.
        batch = _Batch()
        allowance = _owner_allowance(apps, batch.owner_kind)
        room = _queue_room(usage)
        more = False
        for q, hint, owners in plans:
            if capacity <= 0:
                more = True
                break
            want = min(capacity, batch_size)
            capped = room.get(q.id)
            if capped is not None and capped < want:
                # The queue's permits leave fewer slots than the sessions have: offer only
                # those (a start beyond them would be refused). Withheld slots are denials
                # where the queue shows due work; a full queue is skipped without a claim.
                if capped == 0:
                    if owners:
                        batch.denied[DENIAL_QUEUE_PERMITS] += want
                    continue
                got_n, full = await self._claim(tx, ns, q, hint, owners, t, keys_ok, capped,
                                                allowance, batch, locked, strict)  # fmt: skip
                if full:  # not `more`: the queue has no room left for another round
                    batch.denied[DENIAL_QUEUE_PERMITS] += want - capped
                capacity -= got_n
                continue
            got_n, full = await self._claim(tx, ns, q, hint, owners, t, keys_ok, want,
                                            allowance, batch, locked, strict)  # fmt: skip
            more = more or full
            capacity -= got_n
        if batch.dropped:
            more = True
        if not batch.rows:
            return _Round(outcomes, more=more, denied=batch.denied)
        # Deal the claimed tasks out round-robin (in their claim order: priority and
        # fairness kept) to the sessions with room, each at most its free slots.
        takers = [i for i in range(len(conns)) if i in free]
        # Never more rows than free slots (each claim asked for at most what was left).
        assert len(batch.rows) <= sum(free.values()), "claimed past the group's free slots"
        dealt: list[bytes] = []
        turn = 0
        for _ in batch.rows:
            while free[takers[turn % len(takers)]] == 0:
                turn += 1
            i = takers[turn % len(takers)]
            free[i] -= 1
            dealt.append(conns[i].info.session_id)
            turn += 1
        offers = await self._write(tx, ns, t, batch, dealt, apps)
        by_session = {conns[i].info.session_id: outcomes[i] for i in takers}
        for session_id, offer in zip(dealt, offers, strict=True):
            by_session[session_id].offers.append(offer)
        return _Round(outcomes, more=more, denied=batch.denied)

    async def _claim(
        self,
        tx: Tx,
        ns: bytes,
        q: QueueRef,
        hint: OwnerHint,
        owners: list[bytes],
        t: datetime,
        keys_ok: bool,
        want: int,
        allowance: dict[bytes, int] | None,
        batch: _Batch,
        locked: set[bytes],
        strict: bool,
    ) -> tuple[int, bool]:
        """Claim up to ``want`` due tasks of one queue into ``batch``; (tasks kept, True when
        every slot was filled: more may be due)."""
        if allowance is None and len(owners) <= 1:
            # One owner (or none known) in play: the queue-wide claim, as cheap as ever.
            rows = await store.task_claim_due_in_queue(tx, ns, q.id, t, keys_ok, want)
            kept = self._note_owners(hint, rows, locked, strict)
            return batch.add(kept), len(rows) == want
        return await self._claim_fair(tx, ns, q.id, hint, owners, t, keys_ok, want, allowance,
                                      batch, locked, strict)  # fmt: skip

    async def _claim_fair(
        self,
        tx: Tx,
        ns: bytes,
        queue_id: bytes,
        hint: OwnerHint,
        owners: list[bytes],
        t: datetime,
        keys_ok: bool,
        want: int,
        allowance: dict[bytes, int] | None,
        batch: _Batch,
        locked: set[bytes],
        strict: bool,
    ) -> tuple[int, bool]:
        """Split ``want`` across ``owners`` round-robin from the hint's rotating offset, one
        claim per owner; then give what some could not use to those that filled their
        share. Returns (tasks kept for offers, True when every slot was filled)."""
        if not owners:
            hint.stale = True  # locked mode only: nothing known is due here; look again
            return 0, False
        start = hint.turn % len(owners)
        hint.turn += 1
        order = owners[start:] + owners[:start]
        base, extra = divmod(want, len(order))
        after: dict[bytes, tuple[datetime, bytes]] = {}
        more_work: list[bytes] = []  # owners that may have more due tasks
        dry = False  # some owner had fewer due tasks than asked (not only quotas held back)
        claimed = 0
        kept_before = len(batch.rows)
        for i, owner in enumerate(order):
            share = base + (1 if i < extra else 0)
            cap = _cap(allowance, owner, share)
            if cap < share:
                # The owner's quota withholds slots: a denial, counted where the owner
                # shows (by its first task) that it had work for them.
                n = await self._claim_owner(tx, ns, queue_id, owner, t, keys_ok, cap, after,
                                            allowance, batch) if cap > 0 else 0  # fmt: skip
                claimed += n
                if n == cap:
                    batch.denied[batch.owner_kind[owner]] += share - cap
                else:
                    dry = True
                continue
            n = await self._claim_owner(tx, ns, queue_id, owner, t, keys_ok, share, after,
                                        allowance, batch) if share > 0 else 0  # fmt: skip
            claimed += n
            if n == share:
                more_work.append(owner)
            else:
                dry = True
        # Leftover slots (owners with fewer due tasks than their share) go to the others.
        for owner in more_work:
            cap = _cap(allowance, owner, want - claimed)
            if want - claimed <= 0:
                break
            if cap > 0:
                n = await self._claim_owner(tx, ns, queue_id, owner, t, keys_ok, cap, after,
                                            allowance, batch)  # fmt: skip
                claimed += n
                dry = dry or n < cap
        if claimed < want:
            if allowance is None:
                # The known owners ran dry: one queue-wide claim finds what the hint does not
                # list (a new owner). It also returns rows this transaction holds already
                # (SKIP LOCKED skips only others' locks): those are left out.
                left = want - claimed
                have = {row["id"] for row, _ in batch.rows}
                rows = await store.task_claim_due_in_queue(
                    tx, ns, queue_id, t, keys_ok, claimed + left
                )
                fresh = [r for r in rows if r["id"] not in have][:left]
                fresh = self._note_owners(hint, fresh, locked, strict)
                batch.add(fresh)
                claimed += len(fresh)
            elif dry:
                # Locked mode takes no unknown owner's task: probe again (not when only
                # quotas held slots back: a probe would find the same owners).
                hint.stale = True
        return len(batch.rows) - kept_before, claimed >= want

    async def _claim_owner(
        self,
        tx: Tx,
        ns: bytes,
        queue_id: bytes,
        owner: bytes,
        t: datetime,
        keys_ok: bool,
        limit: int,
        after: dict[bytes, tuple[datetime, bytes]],
        allowance: dict[bytes, int] | None,
        batch: _Batch,
    ) -> int:
        """Claim up to ``limit`` of one owner's due tasks after what this transaction took
        of it already; the number of rows claimed (kept or dropped as a duplicate key)."""
        rows = await store.task_claim_due_for_owner(
            tx, ns, queue_id, owner, t, keys_ok, limit, after.get(owner)
        )
        if rows:
            last = rows[-1]
            after[owner] = (last["dispatch_at"], last["id"])
            kept = batch.add(rows)
            if allowance is not None and owner in allowance:
                allowance[owner] -= kept
        return len(rows)

    async def _write(
        self,
        tx: Tx,
        ns: bytes,
        t: datetime,
        batch: _Batch,
        sessions: list[bytes],
        apps: dict[bytes, Row],
    ) -> list[wire.Offer]:
        """Lease the claimed tasks (``batch.rows[i]`` to session ``sessions[i]``), insert
        their attempts, add the reservations to the rows locked first (``apps``: the owners'
        rows; owners, then queues, sorted) and record the events; the offers to push after
        COMMIT, in ``batch.rows`` order."""
        offer_lease = t + timedelta(milliseconds=self.settings.offer_lease_ms)
        offers: list[wire.Offer] = []
        attempts: list[Row] = []
        leased: list[dict[str, Any]] = []
        per_owner: dict[bytes, int] = defaultdict(int)
        per_queue: dict[bytes, int] = defaultdict(int)
        changes: list[Change] = []
        for (row, attempt_id), session_id in zip(batch.rows, sessions, strict=True):
            leased.append({"id": row["id"], "attempt_id": attempt_id, "revision": row["revision"],
                           "session_id": session_id})  # fmt: skip
            attempt, after = offer_rows(ns, row, attempt_id, session_id, offer_lease, t)
            attempts.append(attempt)
            changes.append((after, transitions.EVENT_LEASED, {"session_id": id_hex(session_id)}))
            per_owner[row["owner_id"]] += 1
            per_queue[row["queue_id"]] += 1
            offers.append(
                wire.offer_from_row(row, attempt_id, attempt["generation"], offer_lease)
            )
        # Every claimed row and every usage row is locked by this transaction already: ONE
        # guarded UPDATE of all the claimed rows (WAITING → LEASED, each row's own revision
        # and attempt by id; the matched count must be the number of rows) followed by the
        # reservations added to the usage rows (owners, then queues, sorted; the quota guard
        # cannot refuse: the allowance was judged on the rows as locked).
        leases = [attempt_store.tasks_lease_statement(ns, leased, offer_lease, t)]
        counters = store.reservation_statements(ns, per_owner, per_queue)
        # The writes, the attempts and the events in ONE round trip (Tx.pipeline).
        counts, *_ = await tx.pipeline(
            tx.execute_batch(leases + counters),
            attempt_store.attempt_insert_many(tx, attempts),
            transitions.record_many(tx, ns, changes, now=t),
        )
        if counts[0] != len(leased):  # pragma: no cover - rows locked
            raise RuntimeError("a claimed task changed while locked")
        added = counts[len(leases) :]
        if any(added[i] != 1 and o in apps for i, o in enumerate(sorted(per_owner))):
            raise RuntimeError("reservation quota exceeded under lock")  # pragma: no cover
        return offers

    async def run(self, stop: asyncio.Event | None = None) -> None:
        """Dispatch until ``stop`` is set (or the task is cancelled): at once when woken, else
        every ``dispatch_poll_ms`` (with jitter, so nodes do not poll in step)."""
        poll_s = self.settings.dispatch_poll_ms / 1000
        while stop is None or not stop.is_set():
            self._more = False
            try:
                await self.run_once()
            except asyncio.CancelledError:
                raise
            except Exception:
                log.exception("dispatch round failed")
                await asyncio.sleep(poll_s)
            if self._more:
                await asyncio.sleep(0)
                continue
            wait = poll_s * random.uniform(0.8, 1.2)
            if self._wake_in is not None:  # a delayed task becomes due sooner: wake then
                wait = min(wait, max(0.0, self._wake_in) + 0.001)
            await self.hub.wait_for_work(wait, stop)


def _group_key(conn: Connection) -> tuple[Any, ...]:
    """Sessions served by one dispatch transaction: one namespace, the same queues in the
    same order, the same ability to take keyed tasks."""
    info = conn.info
    return (info.namespace_id, tuple(q.id for q in conn.queues), info.concurrency_keys)


def _owner_allowance(apps: dict[bytes, Row], kinds: dict[bytes, str]) -> dict[bytes, int] | None:
    """Offers each limited owner may still get, judged on its locked resources row: the
    smaller of ``max_reservations - reservations`` and ``max_active_attempts -
    active_attempts - reservations`` (never below 0); None when no owner has a limit (the
    unlimited path). ``kinds`` receives the denial kind of the limit that binds."""
    allowance: dict[bytes, int] = {}
    for o, r in apps.items():
        rooms: list[tuple[int, str]] = []
        if r["max_reservations"] is not None:
            left = int(r["max_reservations"]) - int(r["reservations"])
            rooms.append((max(0, left), DENIAL_RESERVATIONS))
        if r.get("max_active_attempts") is not None:
            left = (
                int(r["max_active_attempts"]) - int(r["active_attempts"]) - int(r["reservations"])
            )
            rooms.append((max(0, left), DENIAL_APPLICATION_ACTIVE))
        if rooms:
            allowance[o], kinds[o] = min(rooms)
    return allowance or None


def _queue_room(usage: dict[bytes, Row]) -> dict[bytes, int]:
    """Offers each queue with ``max_concurrency`` may still get, judged on its locked usage
    row: ``max_concurrency - active_attempts - reservations`` (never below 0)."""
    return {
        q: max(0, int(r["max_concurrency"]) - int(r["active_attempts"]) - int(r["reservations"]))
        for q, r in usage.items()
        if r.get("max_concurrency") is not None
    }


def _cap(allowance: dict[bytes, int] | None, owner: bytes, slots: int) -> int:
    """``slots`` limited by what the owner's reservation quota still allows."""
    if allowance is None or owner not in allowance:
        return slots
    return max(0, min(slots, allowance[owner]))


def _due_owners(hint: OwnerHint, t: datetime) -> list[bytes]:
    """Owners of the hint whose first task may be due at ``t``, in owner id order."""
    return [o for o, first in sorted(hint.owners.items()) if first is not None and first <= t]


def _paused(gates: dict[bytes, dict[str, Any]], queue_id: bytes) -> bool:
    gate = gates.get(queue_id)
    return gate is not None and bool(gate["paused"])
