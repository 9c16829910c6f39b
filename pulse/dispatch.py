"""The dispatcher: two-step dispatch, step 1 (lease due tasks to connected sessions).

Every dispatch is a node dispatch round (:mod:`pulse.dispatch_round`: one look, then ONE
transaction; capacity by application → namespace/queue → fairness subject, planned by
:mod:`pulse.dispatch_plan`):

* the loop (:meth:`Dispatcher.run`, :meth:`Dispatcher.run_once`) serves every waiting
  session of the node, of every namespace, one round per shard group
  (:func:`orbit.shards.shard_group`: a round never spans two groups);
* a session's first dispatch and the HTTP long poll (:meth:`Dispatcher.dispatch_to`) run
  the same round over that one session, on the node round of its shard group (the same
  look, plan, claim and memory of who was served last);
* when a round fails as a whole (not a lock wait: those are retried inside), its sessions
  are served again by the same round code, one namespace at a time (one session at a time
  when they are all of one namespace), so one namespace's failure cannot hold back the
  others.

After COMMIT the offers are pushed (a transaction may be retried; a push cannot be taken
back) and sessions found expired or moved are closed. An offer that never arrives expires
and recovery returns the task to WAITING. Concurrent dispatchers (threads, processes,
nodes) get disjoint tasks from SKIP LOCKED; the guarded lease UPDATE and the start
transaction's checks mean no task is offered twice at once and no attempt starts twice.
New work wakes this node's dispatcher at once (Hub.notify_new_work); other nodes find it
within ``dispatch_poll_ms`` — or, on a node whose looks keep finding nothing due, within
``dispatch_idle_poll_ms`` (the interval doubles after each empty round up to it).
docs/dispatch.md explains the whole picture.
"""

from __future__ import annotations

import asyncio
import logging
import random
import time
from collections.abc import Callable, Sequence
from datetime import datetime

from orbit.ids import id_hex
from orbit.metrics import Registry
from orbit.shards import shard_group
from orbit.storage import Database
from pulse.dispatch_round import (
    DENIAL_APPLICATION_ACTIVE,
    DENIAL_QUEUE_PERMITS,
    DENIAL_RESERVATIONS,
    POOL_MAX_OFFERS,
    NodeRound,
    Outcome,
    Result,
)
from pulse.hub import CLOSE_REPLACED, CLOSE_SESSION_GONE, Connection, Hub

log = logging.getLogger("pulse.dispatch")

#: Denial kinds of ``pulse_dispatch_denials_total``: a session that had no free slot
#: (dispatch backpressure), offer slots withheld by an owner's ``max_reservations``, by a
#: queue's ``max_concurrency`` (running + offered) and by an owner's
#: ``max_active_attempts`` (running + offered).
DENIAL_SESSION_CAPACITY = "session_capacity"

__all__ = [
    "DENIAL_APPLICATION_ACTIVE",
    "DENIAL_QUEUE_PERMITS",
    "DENIAL_RESERVATIONS",
    "DENIAL_SESSION_CAPACITY",
    "Dispatcher",
]


class Dispatcher:
    """Leases due tasks to this node's connected sessions. Safe on many nodes at once.

    ``pool_cap``: the most one pool (sessions of one namespace with the same queues and key
    ability) is offered in one round; ``shard_of``: the shard group of a namespace (rounds
    split along it)."""

    def __init__(
        self,
        db: Database,
        hub: Hub,
        *,
        metrics: Registry | None = None,
        pool_cap: int = POOL_MAX_OFFERS,
        shard_of: Callable[[bytes], int] = shard_group,
    ) -> None:
        self.db = db
        self.hub = hub
        self.settings = hub.settings
        self.pool_cap = pool_cap
        self.shard_of = shard_of
        self._more = False
        #: The node dispatch round of each shard group this node serves sessions of.
        self._nodes: dict[int, NodeRound] = {}
        #: Seconds until the first task the last look saw that is not due yet (None: none).
        self._wake_in: float | None = None
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

    def _node(self, group: int) -> NodeRound:
        node = self._nodes.get(group)
        if node is None:
            node = self._nodes[group] = NodeRound(
                self.db, self.hub.node_id, self.settings.offer_lease_ms,
                self.settings.offer_depth_percent,
            )
        return node

    async def run_once(self, *, now: datetime | None = None) -> int:
        """One node dispatch round over every connected session that wants offers, of every
        namespace (:mod:`pulse.dispatch_round`: one look; when work is due, ONE transaction)
        per shard group; return the number of offers."""
        conns = [c for c in self.hub.connections() if c.wants_offers()]
        self._wake_in = None
        if not conns:
            return 0
        # A round spans the namespaces of one shard group only (orbit.shards): one round per
        # group, each with its own look, rotation and budget.
        by_group: dict[int, list[Connection]] = {}
        for c in conns:
            by_group.setdefault(self.shard_of(c.info.namespace_id), []).append(c)
        total = 0
        for group, members in sorted(by_group.items()):
            try:
                total += await self._serve(self._node(group), members, now)
            except asyncio.CancelledError:
                raise
            except Exception:  # one group's failure does not hold back the others
                log.exception("dispatch round of shard group %d failed", group)
        return total

    async def dispatch_to(self, conn: Connection, *, now: datetime | None = None) -> int:
        """Offer due tasks to one session — a node round over just that session, on the
        round of its shard group — then push them; the number of offers."""
        return await self._serve(self._node(self.shard_of(conn.info.namespace_id)), [conn], now)

    async def _serve(
        self, node: NodeRound, conns: Sequence[Connection], now: datetime | None
    ) -> int:
        """One round over ``conns``; when it fails as a whole, the same round again per
        namespace (per session when they share one), each part's failure logged and
        contained. A round over one session that fails raises."""
        try:
            return await self._round(node, conns, now)
        except asyncio.CancelledError:
            raise
        except Exception:
            parts = _split(conns)
            if len(parts) <= 1:
                raise
            log.exception("dispatch round failed; serving its %d parts one by one", len(parts))
        total = 0
        for part in parts:
            try:
                total += await self._serve(node, part, now)
            except asyncio.CancelledError:
                raise
            except Exception:
                log.exception("dispatch to session %s failed", id_hex(part[0].info.session_id))
        return total

    async def _round(
        self, node: NodeRound, conns: Sequence[Connection], now: datetime | None
    ) -> int:
        began = time.perf_counter()
        result = await node.run(conns, pool_cap=self.pool_cap, now=now)
        self._note(result, time.perf_counter() - began)
        return await self._deliver(conns, result.outcomes)

    def _note(self, result: Result, seconds: float) -> None:
        """What a round tells the loop (when to wake, whether to run again at once) and the
        metrics."""
        if result.wake_in is not None:
            self._wake_in = (
                result.wake_in if self._wake_in is None else min(self._wake_in, result.wake_in)
            )
        if result.more:
            self._more = True
        if self._metrics is None:
            return
        if result.transactions:
            self._seconds.observe(seconds)
        for outcome in result.outcomes:
            if outcome.at_capacity:
                self._denials.inc(kind=DENIAL_SESSION_CAPACITY)
        for kind, n in sorted(result.denied.items()):
            if n:
                self._denials.inc(n, kind=kind)

    async def _deliver(self, conns: Sequence[Connection], outcomes: Sequence[Outcome]) -> int:
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

    async def run(self, stop: asyncio.Event | None = None) -> None:
        """Dispatch until ``stop`` is set (or the task is cancelled): at once when woken, else
        every ``dispatch_poll_ms`` (with jitter, so nodes do not poll in step) — doubled
        after each round that offered nothing and saw nothing due later, up to
        ``dispatch_idle_poll_ms``, until a round offers, a look sees a due time or the hub
        wakes it (:func:`idle_poll_s`)."""
        poll_s = self.settings.dispatch_poll_ms / 1000
        idle_max_s = max(poll_s, self.settings.dispatch_idle_poll_ms / 1000)
        empty = 0  # rounds in a row that offered nothing and saw nothing due later
        while stop is None or not stop.is_set():
            self._more = False
            offered = 0
            try:
                offered = await self.run_once()
            except asyncio.CancelledError:
                raise
            except Exception:
                log.exception("dispatch round failed")
                await asyncio.sleep(poll_s)
            if self._more:
                await asyncio.sleep(0)
                continue
            empty = empty + 1 if offered == 0 and self._wake_in is None else 0
            wait = idle_poll_s(poll_s, idle_max_s, empty) * random.uniform(0.8, 1.2)
            if self._wake_in is not None:  # a delayed task becomes due sooner: wake then
                wait = min(wait, max(0.0, self._wake_in) + 0.001)
            if await self.hub.wait_for_work(wait, stop):
                empty = 0  # woken: new work here, back to the short interval


def idle_poll_s(poll_s: float, idle_max_s: float, empty_rounds: int) -> float:
    """The dispatcher's wait after ``empty_rounds`` rounds in a row that offered nothing
    and saw nothing due later: ``poll_s`` after the first, doubled after each further one,
    at most ``idle_max_s``."""
    cap = max(poll_s, idle_max_s)
    wait = poll_s
    for _ in range(max(0, empty_rounds - 1)):
        wait *= 2
        if wait >= cap:
            return cap
    return wait


def _split(conns: Sequence[Connection]) -> list[list[Connection]]:
    """The parts a failed round is served again in: one per namespace, or one per session
    when all are of one namespace."""
    by_ns: dict[bytes, list[Connection]] = {}
    for c in conns:
        by_ns.setdefault(c.info.namespace_id, []).append(c)
    if len(by_ns) > 1:
        return [by_ns[ns] for ns in sorted(by_ns)]
    return [[c] for c in conns]
