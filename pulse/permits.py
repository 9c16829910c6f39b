"""Start-time permits: queue and application limits, start-rate windows and keyed
concurrency with fencing tokens, judged inside the start transaction and released with the
attempt's end in the same transaction (docs/api/workers.md#two-step-dispatch,
docs/api/queues.md#limits).

A start batch (:func:`pulse.attempts.start_many`) opens one :class:`StartBudget` after it has
locked, in the lock order, *application resources → queue usage → task → attempt*; the
budget then locks the batch's concurrency-key rows (*permit*, last, in key-digest order) and
judges each item with :meth:`StartBudget.authorise`, in this order:

====================  =======================================================  ==============
check                 denied when                                              reason
====================  =======================================================  ==============
application quota     app ``active_attempts`` + batch grants ≥ ``max_active``  ``application_quota``
application rate      app window starts ≥ its ``max_starts_per_second``        ``rate_limited``
queue permits         queue ``active_attempts`` + batch grants ≥               ``permits_exhausted``
                      ``max_concurrency``
queue rate            queue window starts ≥ its ``max_starts_per_second``      ``rate_limited``
concurrency key       the key's ``held`` ≥ ``max_permits`` (1)                 ``key_busy``
key token space       the key's ``grant_revision`` reached :data:`MAX_TOKEN`   ``key_exhausted``
====================  =======================================================  ==============

* **Queue permit** = the queue usage row's ``active_attempts`` counter (no permit row): it is
  maintained by :func:`pulse.transitions.adjust_usage` in every transaction that starts or
  ends a RUNNING attempt, so it *is* the number of queue permits held.
* **Key permit** = a ``pulse_permits`` row (kind ``key``) plus ``held`` on the key's
  ``pulse_concurrency_limits`` row (created on the key's first grant). Each grant increments
  ``grant_revision``; the new value is the attempt's ``concurrency_token`` — strictly
  increasing per key, never reused, and never wrapped (at :data:`MAX_TOKEN` starts are
  refused with ``key_exhausted``). Invariant: ``held`` = the number of key permit rows that
  point at the key = the number of RUNNING attempts of the key's tasks.
* **Start-rate window**: one second on the database clock. A window begins at the first start
  at or after ``window_start + 1 s`` (``window_start`` = that start's time,
  ``window_starts`` = 0); each grant adds 1. The counters are only written while a rate limit
  is set. A start refused by a window gets its task back to WAITING with ``available_at`` =
  the window's end, so it is not re-offered in a hot loop.
* Denials are counted on the denied task's queue usage row (``denials_permits``,
  ``denials_rate``, ``denials_key``, ``denials_application``) in the same transaction, and
  per node in ``pulse_starts_total{outcome=<reason>}``.
* Lowering a limit never revokes a running attempt: limits are judged only at start.
"""

from __future__ import annotations

from collections import Counter, defaultdict
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import Any

from orbit.errors import Conflict
from orbit.storage import Tx
from pulse.store import permits as store

Row = dict[str, Any]

# Start denial reasons added by the resource checks (``start_denied.reason``).
DENY_APPLICATION = "application_quota"  # the owner's max_active_attempts is reached
DENY_PERMITS = "permits_exhausted"  # the queue's max_concurrency is reached
DENY_RATE = "rate_limited"  # the queue's or the owner's start-rate window is full
DENY_KEY_BUSY = "key_busy"  # another attempt holds the task's concurrency key
DENY_KEY_EXHAUSTED = "key_exhausted"  # the key's fencing tokens are spent (never wraps)

#: Every reason this module can deny a start with.
DENY_REASONS = (DENY_APPLICATION, DENY_PERMITS, DENY_RATE, DENY_KEY_BUSY, DENY_KEY_EXHAUSTED)

#: Largest concurrency token ever handed out: the signed 64-bit maximum, so a token fits a
#: BIGINT (signed) column or a JSON number in any consumer. The schema's own CHECK
#: (ck_pulse_concurrency_limits_nowrap) is the backstop at the unsigned maximum.
MAX_TOKEN = 2**63 - 1

#: Length of a start-rate window.
WINDOW = timedelta(seconds=1)

# Which queue-usage denial counter each reason adds to.
_DENIAL_COLUMN = {
    DENY_APPLICATION: "application",
    DENY_PERMITS: "permits",
    DENY_RATE: "rate",
    DENY_KEY_BUSY: "key",
    DENY_KEY_EXHAUSTED: "key",
}


@dataclass
class Decision:
    """The outcome of :meth:`StartBudget.authorise`."""

    deny: str | None = None  # None: granted
    token: int | None = None  # the concurrency (fencing) token of a keyed grant
    not_before: datetime | None = None  # for ``rate_limited``: when the window ends


@dataclass
class _Window:
    """A one-second start window as this batch sees it."""

    start: datetime
    starts: int
    limit: int
    dirty: bool = False

    @classmethod
    def current(cls, row: Mapping[str, Any], limit: int, now: datetime) -> _Window:
        start = row["window_start"]
        if start is None or now >= start + WINDOW:
            return cls(start=now, starts=0, limit=limit, dirty=True)
        return cls(start=start, starts=int(row["window_starts"]), limit=limit)

    def full(self) -> bool:
        return self.starts >= self.limit


@dataclass
class ApplicationShare:
    """The application-level part of the start budgets of one transaction: an application's
    quota and start-rate window are shared by all its namespaces, so the budgets of several
    namespaces in one node round (:func:`open_budget` with ``share``) count their grants
    here together, and its window counters are written once."""

    apps: dict[bytes, Row] = field(default_factory=dict)
    granted_app: Counter[bytes] = field(default_factory=Counter)
    app_windows: dict[bytes, _Window] = field(default_factory=dict)
    flushed: bool = False


@dataclass
class StartBudget:
    """The limits of one start batch, with the grants and denials made so far in it.

    Built by :func:`open_budget`; :meth:`authorise` per item; :meth:`flush` once at the end
    of the transaction (window counters and denial counters).
    """

    namespace_id: bytes
    now: datetime
    queues: dict[bytes, Row] = field(default_factory=dict)
    keys: dict[bytes, Row] = field(default_factory=dict)
    granted_queue: Counter[bytes] = field(default_factory=Counter)
    queue_windows: dict[bytes, _Window] = field(default_factory=dict)
    denials: dict[bytes, Counter[str]] = field(default_factory=lambda: defaultdict(Counter))
    share: ApplicationShare = field(default_factory=ApplicationShare)

    @property
    def apps(self) -> dict[bytes, Row]:
        return self.share.apps

    @apps.setter
    def apps(self, rows: dict[bytes, Row]) -> None:
        self.share.apps.update(rows)

    @property
    def granted_app(self) -> Counter[bytes]:
        return self.share.granted_app

    @property
    def app_windows(self) -> dict[bytes, _Window]:
        return self.share.app_windows

    def _queue_window(self, queue_id: bytes) -> _Window | None:
        q = self.queues.get(queue_id)
        if q is None or q["max_starts_per_second"] is None:
            return None
        if queue_id not in self.queue_windows:
            self.queue_windows[queue_id] = _Window.current(
                q, int(q["max_starts_per_second"]), self.now
            )
        return self.queue_windows[queue_id]

    def _app_window(self, app_id: bytes) -> _Window | None:
        a = self.apps.get(app_id)
        if a is None or a["max_starts_per_second"] is None:
            return None
        if app_id not in self.app_windows:
            self.app_windows[app_id] = _Window.current(a, int(a["max_starts_per_second"]), self.now)
        return self.app_windows[app_id]

    def _judge(self, task: Mapping[str, Any]) -> Decision:
        queue_id, owner_id = task["queue_id"], task["owner_id"]
        app = self.apps.get(owner_id)
        if app is not None and app["max_active_attempts"] is not None:
            active = int(app["active_attempts"]) + self.granted_app[owner_id]
            if active >= int(app["max_active_attempts"]):
                return Decision(DENY_APPLICATION)
        window = self._app_window(owner_id)
        if window is not None and window.full():
            return Decision(DENY_RATE, not_before=window.start + WINDOW)
        q = self.queues.get(queue_id)
        if q is not None and q["max_concurrency"] is not None:
            active = int(q["active_attempts"]) + self.granted_queue[queue_id]
            if active >= int(q["max_concurrency"]):
                return Decision(DENY_PERMITS)
        window = self._queue_window(queue_id)
        if window is not None and window.full():
            return Decision(DENY_RATE, not_before=window.start + WINDOW)
        digest = task["concurrency_key_digest"]
        if digest is not None:
            key = self.keys.get(bytes(digest))
            if key is None:  # pragma: no cover - open_budget locked every key of the batch
                raise Conflict("concurrency key row not locked", kind="start")
            if int(key["held"]) >= int(key["max_permits"]):
                return Decision(DENY_KEY_BUSY)
            if int(key["grant_revision"]) >= MAX_TOKEN:
                return Decision(DENY_KEY_EXHAUSTED)
        return Decision()

    async def authorise(
        self, tx: Tx, task: Mapping[str, Any], attempt: Mapping[str, Any]
    ) -> Decision:
        """Judge one start (the task LEASED to ``attempt``, every other check passed) and, when
        granted, take its permits: the batch counts, and for a keyed task the key permit row,
        ``held`` + 1 and the next token. A denial is counted for :meth:`flush`."""
        decision = self._judge(task)
        if decision.deny is not None:
            self.denials[task["queue_id"]][_DENIAL_COLUMN[decision.deny]] += 1
            return decision
        queue_id, owner_id = task["queue_id"], task["owner_id"]
        self.granted_queue[queue_id] += 1
        self.granted_app[owner_id] += 1
        for window in (self._app_window(owner_id), self._queue_window(queue_id)):
            if window is not None:
                window.starts += 1
                window.dirty = True
        digest = task["concurrency_key_digest"]
        if digest is not None:
            key = self.keys[bytes(digest)]
            ok = await store.limit_grant_if_revision(
                tx, self.namespace_id, key["id"], int(key["revision"]), self.now
            )
            if not ok:  # pragma: no cover - the key row is locked
                raise Conflict("concurrency key changed while locked", kind="start")
            token = int(key["grant_revision"]) + 1
            key.update(
                held=int(key["held"]) + 1, grant_revision=token, revision=int(key["revision"]) + 1
            )
            await store.permit_insert(
                tx, self.namespace_id, attempt["id"], "key", key["id"], token, self.now
            )
            decision.token = token
        return decision

    async def flush(self, tx: Tx) -> None:
        """Write the batch's window counters (application rows first, then queues: the lock
        order) and its denial counters. Call once per budget, at the end of the start
        transaction; the application windows of a shared :class:`ApplicationShare` are
        written by the first budget flushed."""
        if not self.share.flushed:
            self.share.flushed = True
            for app_id, w in sorted(self.app_windows.items()):
                if w.dirty:
                    await store.application_window_set(tx, app_id, w.start, w.starts)
        for queue_id, w in sorted(self.queue_windows.items()):
            if w.dirty:
                await store.queue_window_set(tx, self.namespace_id, queue_id, w.start, w.starts)
        for queue_id, counts in sorted(self.denials.items()):
            await store.queue_denials_add(tx, self.namespace_id, queue_id, **counts)


async def open_budget(
    tx: Tx,
    namespace_id: bytes,
    tasks: Iterable[Mapping[str, Any]],
    *,
    limited: bool,
    now: datetime,
    share: ApplicationShare | None = None,
) -> StartBudget:
    """The :class:`StartBudget` of a start batch over ``tasks`` (locked rows).

    ``share``: the application part shared with the other namespaces' budgets of the same
    transaction (a node round), else a fresh one.

    ``limited``: the caller locked the usage rows of the tasks' queues and owners (it must
    whenever one of them has a limit or a task is keyed); only then are the limits read —
    else nothing but concurrency keys is judged. Locks (creating on first use) the key rows
    of the batch's LEASED keyed tasks, last in the lock order, in key-digest order.
    """
    budget = StartBudget(namespace_id=namespace_id, now=now, share=share or ApplicationShare())
    rows = list(tasks)
    if limited:
        budget.queues = await store.queue_limits_many(
            tx, namespace_id, [t["queue_id"] for t in rows]
        )
        # Applications another namespace's budget of this round read already keep their
        # rows (and the grants counted against them).
        owners = [t["owner_id"] for t in rows if t["owner_id"] not in budget.apps]
        budget.apps = await store.application_limits_many(tx, owners)
    wanted: dict[bytes, str] = {
        bytes(t["concurrency_key_digest"]): t["concurrency_key"]
        for t in rows
        if t["concurrency_key_digest"] is not None and t["state"] == "LEASED"
    }
    if wanted:
        budget.keys = await lock_keys(tx, namespace_id, wanted, now)
    return budget


async def lock_keys(
    tx: Tx, namespace_id: bytes, wanted: Mapping[bytes, str], now: datetime
) -> dict[bytes, Row]:
    """Lock the key rows of ``wanted`` (digest → key text), creating missing ones; by digest.

    Existing rows are locked in one statement (digest order); missing ones are inserted one
    by one in digest order (a concurrent first grant of the same key makes the INSERT a
    no-op that still locks the row) and then read under that lock.
    """
    keys = await store.limit_lock_many(tx, namespace_id, list(wanted))
    missing = sorted(d for d in wanted if d not in keys)
    for d in missing:
        await store.limit_insert_if_absent(tx, namespace_id, d, wanted[d], now)
    if missing:
        keys.update(await store.limit_lock_many(tx, namespace_id, missing))
    return keys


async def release_many(
    tx: Tx,
    namespace_id: bytes,
    ended: Iterable[tuple[bytes, bytes | None]],
    now: datetime,
) -> int:
    """Release the key permits of attempts that just left RUNNING, in the transaction that
    ends them: ``ended`` is ``(attempt id, the task's concurrency_key_digest)``. Locks the
    key rows (last in the lock order, digest order), deletes the attempts' permit rows and
    lowers each key's ``held`` by the rows deleted. Returns the number released.

    The queue permit needs nothing here: it is ``active_attempts``, lowered by the caller's
    :func:`pulse.transitions.adjust_usage`.
    """
    keyed = [(aid, bytes(d)) for aid, d in ended if d is not None]
    if not keyed:
        return 0
    await store.limit_lock_many(tx, namespace_id, [d for _, d in keyed])
    held = await store.permit_list_for_attempts(tx, namespace_id, [a for a, _ in keyed])
    if not held:
        return 0
    await store.permit_delete_many(tx, namespace_id, [p["id"] for p in held])
    per_key = Counter(bytes(p["holder_ref"]) for p in held)
    for limit_id, n in sorted(per_key.items()):
        await store.limit_release(tx, namespace_id, limit_id, n, now)
    return len(held)
