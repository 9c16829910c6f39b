"""Planning of the node dispatch round (pure functions; :mod:`pulse.dispatch_round` runs it).

A round serves every *pool* of the node — the sessions of one namespace that take the same
queues with the same keyed-task ability — in one transaction. Capacity is shared at three
levels, each least recently served first:

1. **application** — the round offers at most ``budget`` tasks; when the pools ask for more,
   the budget is split evenly across the applications with demand (water-filling: what one
   cannot use goes to the others), the remainder to the least recently served;
2. **namespace / queue** — an application's share is split the same way across its pools,
   and a pool's across its queues with due work;
3. **fairness subject** — a queue's share across its due subjects (a task's
   ``fairness_key`` within its owner, or the owner itself).

:func:`plan` turns that into the claim's parts (one per (namespace, queue, subject), each
LIMIT twice its share, so a subject with fewer due tasks leaves room the others fill in the
same round); :func:`deal` then hands the claimed rows out, one per queue and subject in turn
(the same order), within every limit: the sessions' free slots, the queues' permits, the
owners' quotas, one task per concurrency key.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Callable, Hashable, Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any

Row = dict[str, Any]
QueueKey = tuple[bytes, bytes]  # (namespace id, queue id)
SubjectKey = tuple[bytes, bytes, bytes]  # (namespace id, queue id, fairness subject)


@dataclass
class Pool:
    """Sessions served together: one namespace, the same queues, the same key ability."""

    application_id: bytes
    namespace_id: bytes
    queue_ids: tuple[bytes, ...]
    keys_ok: bool
    #: (index of the session in the round, free slots), in the order offers are dealt.
    sessions: list[tuple[int, int]] = field(default_factory=list)
    #: Most this pool may be offered in one round (its free slots, at most ``pool_cap``).
    grant: int = 0

    @property
    def key(self) -> tuple[bytes, tuple[bytes, ...], bool]:
        return (self.namespace_id, self.queue_ids, self.keys_ok)

    @property
    def free(self) -> int:
        return sum(n for _, n in self.sessions)


@dataclass
class Plan:
    """The claim: its parts (one per subject) and, per pool, the shares it was built from."""

    parts: list[tuple[bytes, bytes, bytes, bool, int]]
    #: Per pool (by position): the queues in play, each with its subjects in serving order.
    order: list[list[tuple[QueueKey, list[bytes]]]]
    #: Some pool was given less than its free slots (the round budget, or the most one pool
    #: takes in a round): run again at once.
    cut: bool = False


class Served:
    """When each application, queue and subject was last served (round numbers, in memory:
    an order, never a decision the database has not made). Never served comes first."""

    def __init__(self, limit: int = 100_000) -> None:
        self.round = 0
        self._last: dict[Hashable, int] = {}
        self._limit = limit

    def last(self, key: Hashable) -> int:
        return self._last.get(key, -1)

    def mark(self, keys: Iterable[Hashable]) -> None:
        if len(self._last) > self._limit:  # keys of queues and subjects long gone
            self._last.clear()
        for key in keys:
            self._last[key] = self.round

    def order(self, keys: Iterable[Any], scope: Callable[[Any], Hashable]) -> list[Any]:
        """``keys`` least recently served first (ties: in key order)."""
        return sorted(keys, key=lambda k: (self.last(scope(k)), scope(k)))


def split(total: int, demands: Sequence[int]) -> list[int]:
    """Water-filling: ``total`` split evenly over ``demands`` (in the order given, which is
    the order the remainder goes), no one above its demand, what one cannot use going to
    the others."""
    out = [0] * len(demands)
    left = total
    open_ = [i for i, d in enumerate(demands) if d > 0]
    while left > 0 and open_:
        share, extra = divmod(left, len(open_))
        if share == 0:
            for i in open_[:extra]:
                out[i] += 1
            break
        still: list[int] = []
        for i in open_:
            give = min(share, demands[i] - out[i])
            out[i] += give
            left -= give
            if out[i] < demands[i]:
                still.append(i)
        open_ = still
    return out


def plan(
    pools: Sequence[Pool],
    subjects: dict[QueueKey, list[bytes]],
    served: Served,
    *,
    budget: int,
    pool_cap: int,
    queue_room: dict[QueueKey, int],
) -> Plan:
    """The claim of one round (see the module docstring). ``subjects``: the due subjects of
    each queue; ``queue_room``: offers a queue's permits still allow (queues without a limit
    are absent). Sets each pool's ``grant``."""
    live = [
        p
        for p in pools
        if p.free > 0 and any(subjects.get((p.namespace_id, q)) for q in p.queue_ids)
    ]
    for p in pools:
        p.grant = 0
    # Level 1 and 2: the round budget across applications, then across their pools.
    by_app: dict[bytes, list[Pool]] = defaultdict(list)
    for p in live:
        by_app[p.application_id].append(p)
    apps = served.order(by_app, lambda a: ("app", a))
    demand = [sum(min(p.free, pool_cap) for p in by_app[a]) for a in apps]
    cut = False
    for a, share in zip(apps, split(budget, demand), strict=True):
        group = served.order(by_app[a], lambda p: ("pool", p.key))
        wants = [min(p.free, pool_cap) for p in group]
        for p, g in zip(group, split(share, wants), strict=True):
            p.grant = g
            cut = cut or g < p.free
    # Level 2 and 3: a pool's grant across its queues, a queue's across its subjects.
    limits: dict[tuple[bytes, bytes, bytes], list[Any]] = {}
    order: list[list[tuple[QueueKey, list[bytes]]]] = []
    for p in pools:
        queues = [
            (p.namespace_id, q)
            for q in p.queue_ids
            if subjects.get((p.namespace_id, q)) and queue_room.get((p.namespace_id, q), 1) > 0
        ]
        queues = served.order(queues, lambda k: ("queue", k))
        mine: list[tuple[QueueKey, list[bytes]]] = []
        if p.grant <= 0 or not queues:
            order.append(mine)
            continue
        for qk, q_share in zip(queues, split(p.grant, [p.grant] * len(queues)), strict=True):
            subs = served.order(subjects[qk], _subject_scope(qk))
            mine.append((qk, subs))
            room = queue_room.get(qk, p.grant)
            for s, s_share in zip(subs, split(q_share, [q_share] * len(subs)), strict=True):
                if s_share <= 0:
                    continue
                limit = min(p.grant, room, 2 * s_share)
                part = limits.setdefault((qk[0], qk[1], s), [False, 0])
                part[0] = part[0] or p.keys_ok
                part[1] += limit
        order.append(mine)
    parts = [
        (ns, q, s, bool(v[0]), int(v[1])) for (ns, q, s), v in sorted(limits.items()) if v[1] > 0
    ]
    return Plan(parts, order, cut)


def _subject_scope(qk: QueueKey) -> Callable[[bytes], Hashable]:
    """The key :class:`Served` remembers a subject of queue ``qk`` by."""

    def scope(s: bytes) -> Hashable:
        return ("subject", qk, s)

    return scope


@dataclass
class Dealt:
    """What :func:`deal` decided."""

    #: Per pool (by position): (row, index of the session in the round) in offer order.
    offers: list[list[tuple[Row, int]]]
    #: Claimed rows held back by a queue's permits.
    denied_queue: int = 0
    #: Claimed rows held back by their owner's quota, by owner.
    denied_owner: dict[bytes, int] = field(default_factory=lambda: defaultdict(int))
    #: Claimed rows not offered (a second task of a key, a pool full): they stay WAITING.
    left: int = 0
    #: Some subject gave all it was asked for and its pool still had room: more may be due.
    more: bool = False
    #: Claimed rows left out as a second task of a concurrency key in the round.
    dropped: int = 0


def deal(
    pools: Sequence[Pool],
    the_plan: Plan,
    rows: Iterable[Row],
    *,
    queue_room: dict[QueueKey, int],
    allowance: dict[bytes, int],
) -> Dealt:
    """Hand the claimed ``rows`` out to the pools: per pool, one task per queue in turn and
    within a queue one per subject in turn (the plan's order), each to the next session with
    a free slot, within the queues' permits (``queue_room``: queues without a limit are
    absent), the owners' quotas (``allowance``: owners without a limit are absent) and one
    task per concurrency key in the round. ``queue_room`` and ``allowance`` are consumed."""
    lists: dict[SubjectKey, list[Row]] = defaultdict(list)
    for r in rows:
        lists[(bytes(r["namespace_id"]), bytes(r["queue_id"]), bytes(r["fair_subject"]))].append(r)
    for rs in lists.values():
        rs.sort(key=lambda r: (r["dispatch_at"], r["id"]))
    claimed = {k: len(v) for k, v in lists.items()}
    asked = {(ns, q, s): limit for ns, q, s, _, limit in the_plan.parts}
    taken: set[bytes] = set()
    keys: set[tuple[bytes, bytes]] = set()
    out = Dealt([[] for _ in pools])
    for pi, p in enumerate(pools):
        free = {i: n for i, n in p.sessions if n > 0}
        takers = [i for i, _ in p.sessions if free.get(i, 0) > 0]
        left = min(p.grant, sum(free.values()))
        turn = 0
        queues = [(qk, list(subs)) for qk, subs in the_plan.order[pi]]
        while left > 0 and queues:
            still: list[tuple[QueueKey, list[bytes]]] = []
            for qk, subs in queues:
                if left <= 0:
                    break
                row = None
                while subs and row is None:
                    s = subs.pop(0)
                    row = _next_row(lists[(qk[0], qk[1], s)], p.keys_ok, taken, keys,
                                    queue_room, allowance, out)  # fmt: skip
                    if row is not None:
                        subs.append(s)  # its turn again after the others
                if row is None:
                    continue  # the queue has nothing more for this pool
                while free[takers[turn % len(takers)]] == 0:
                    turn += 1
                i = takers[turn % len(takers)]
                free[i] -= 1
                turn += 1
                left -= 1
                out.offers[pi].append((row, i))
                still.append((qk, subs))
            queues = still
        if left > 0:
            # Room left: a subject that gave every row it was asked for may have more due.
            out.more = out.more or any(
                asked.get((qk[0], qk[1], s), 0) > 0
                and claimed.get((qk[0], qk[1], s), 0) >= asked[(qk[0], qk[1], s)]
                and not lists[(qk[0], qk[1], s)]
                for qk, subs in the_plan.order[pi]
                for s in subs
            )
    for rs in lists.values():
        for r in rs:
            qk = (bytes(r["namespace_id"]), bytes(r["queue_id"]))
            if queue_room.get(qk, 1) <= 0:
                out.denied_queue += 1
            elif allowance.get(bytes(r["owner_id"]), 1) <= 0:
                out.denied_owner[bytes(r["owner_id"])] += 1
    out.left = sum(claimed.values()) - len(taken)
    return out


def _next_row(
    rows: list[Row],
    keys_ok: bool,
    taken: set[bytes],
    keys: set[tuple[bytes, bytes]],
    queue_room: dict[QueueKey, int],
    allowance: dict[bytes, int],
    out: Dealt,
) -> Row | None:
    """The first of ``rows`` this pool may be offered (removed from ``rows``, its limits
    counted), or None. A second task of a key is dropped (it stays WAITING)."""
    i = 0
    while i < len(rows):
        r = rows[i]
        qk = (bytes(r["namespace_id"]), bytes(r["queue_id"]))
        owner = bytes(r["owner_id"])
        digest = r["concurrency_key_digest"]
        if r["id"] in taken:
            del rows[i]
            continue
        if queue_room.get(qk, 1) <= 0:
            return None  # the queue's permits are taken: nothing of it can be offered
        if allowance.get(owner, 1) <= 0 or (digest is not None and not keys_ok):
            i += 1  # another owner's row, or a pool that takes keys, may still use it
            continue
        if digest is not None and (qk[0], bytes(digest)) in keys:
            del rows[i]  # the key is offered already in this round: stays WAITING
            out.dropped += 1
            continue
        del rows[i]
        taken.add(r["id"])
        if digest is not None:
            keys.add((qk[0], bytes(digest)))
        if qk in queue_room:
            queue_room[qk] -= 1
        if owner in allowance:
            allowance[owner] -= 1
        return r
    return None
