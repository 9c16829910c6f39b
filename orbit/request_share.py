"""A node's fair share of HTTP request handling between tenants.

A node serves every HTTP request on one event loop: requests in progress take turns on it
in the order they become ready, so a tenant with a dozen requests in progress gets a dozen
turns for every turn of a tenant with one. :class:`RequestShare` bounds how many requests
each tenant has in progress at once, and only while another tenant is active:

* **Slots.** A node handles at most ``slots`` HTTP requests at once
  (``ORBIT_HTTP_SLOTS``, default 8; WebSocket streams are not counted, their frames have
  their own fair share in pulse/http/admission.py).
* **Fair share while others are active.** A tenant is *active* while it has requests in
  progress or waiting, and for ``active_window_s`` (1 s) after its last one ended. With
  ``n`` tenants active, each may hold ``ceil(slots / n)`` slots (at least one); a tenant
  alone on a node may hold them all (work-conserving).
* **Queue, round-robin.** A request over its tenant's share, or when every slot is taken,
  waits in its tenant's queue before anything of it is read (no body, no authentication,
  no database work); a freed slot goes to the waiting tenant that holds the fewest (ties:
  the one that has waited longest), then that tenant goes to the back.
* **Early refusal.** A request that finds its tenant's queue at ``queue`` requests
  (``ORBIT_HTTP_TENANT_QUEUE``, 256), or that waited ``wait_s`` (10 s) without a slot, is
  answered 429 ``rate_limited`` with ``Retry-After`` at once.
* **Long requests give their slot back.** A request holds its slot at most ``hold_s``
  (1 s; a long-poll or a slow client after that): then the slot is freed for the next
  request, the request itself goes on.

The tenant of a request is the one its bearer token *probably* belongs to
(orbit/http/tenancy.py): the application this node last saw authenticate with that key or
session token, else one shared "unknown" tenant, so a flood of unknown or bad tokens
competes only with itself. The share is node memory only (no database).
"""

from __future__ import annotations

import asyncio
import contextlib
import math
import os
import time
from collections import deque
from collections.abc import Callable, Hashable
from dataclasses import dataclass, fields


@dataclass(frozen=True, slots=True)
class ShareSettings:
    """Tunables; ``ORBIT_HTTP_<NAME>`` environment overrides (``ORBIT_HTTP_SLOTS``…)."""

    #: HTTP requests a node handles at once (0: no fair share, every request runs at once).
    slots: int = 8
    #: Requests one tenant may have waiting; more → 429 at once.
    tenant_queue: int = 256
    #: Longest wait for a slot (seconds); longer → 429.
    wait_s: float = 10.0
    #: Longest a request holds its slot (seconds).
    hold_s: float = 1.0
    #: A tenant counts as active this long after its last request ended (seconds).
    active_window_s: float = 1.0

    @classmethod
    def from_env(cls, env: dict[str, str] | None = None) -> ShareSettings:
        source = os.environ if env is None else env
        values: dict[str, float | int] = {}
        for f in fields(cls):
            raw = source.get(f"ORBIT_HTTP_{f.name.upper()}")
            if raw is not None:
                values[f.name] = int(raw) if f.type in ("int", int) else float(raw)
        return cls(**values)  # type: ignore[arg-type]


class QueueFull(Exception):
    """The tenant's queue is full: answer 429 at once."""


class RequestShare:
    """The slots of one node (see the module docstring). Single-threaded: use from one
    event loop. ``clock`` is injectable for tests."""

    def __init__(
        self, settings: ShareSettings | None = None, *, clock: Callable[[], float] = time.monotonic
    ) -> None:
        self.settings = settings or ShareSettings()
        self.slots = max(1, self.settings.slots)
        self._clock = clock
        #: Slots held, by tenant.
        self.held: dict[Hashable, int] = {}
        self.in_use = 0
        #: Waiting tenants in the order they started waiting, each with its FIFO of waiters.
        self._waiting: dict[Hashable, deque[asyncio.Future[None]]] = {}
        #: When each tenant's last request ended (for the active window).
        self._last_seen: dict[Hashable, float] = {}
        #: Grants made at once / after a wait, refusals (for tests and metrics).
        self.immediate = 0
        self.queued = 0
        self.refused = 0

    # -- the share --------------------------------------------------------------------
    def active(self) -> int:
        """Tenants active now: holding or waiting, or seen within the active window."""
        now = self._clock()
        window = self.settings.active_window_s
        for tenant, seen in list(self._last_seen.items()):
            if now - seen > window and tenant not in self.held and tenant not in self._waiting:
                del self._last_seen[tenant]
        names = set(self._last_seen) | set(self.held) | set(self._waiting)
        return max(1, len(names))

    def share(self) -> int:
        """Slots one tenant may hold now."""
        return max(1, math.ceil(self.slots / self.active()))

    def _may_take(self, tenant: Hashable, share: int) -> bool:
        return self.in_use < self.slots and self.held.get(tenant, 0) < share

    # -- entering and leaving ---------------------------------------------------------
    def try_enter(self, tenant: Hashable) -> bool:
        """Take a slot for ``tenant`` at once if nobody waits and its share allows."""
        self._last_seen[tenant] = self._clock()
        if not self._waiting and self._may_take(tenant, self.share()):
            self._take(tenant)
            self.immediate += 1
            return True
        return False

    def enqueue(self, tenant: Hashable) -> asyncio.Future[None]:
        """Queue ``tenant`` for a slot: a future done when the slot is granted (the slot is
        then held: :meth:`release` it, or :meth:`cancel` the future before it is done).
        :class:`QueueFull` when the tenant's queue is full."""
        queue = self._waiting.get(tenant)
        if queue is not None and len(queue) >= max(1, self.settings.tenant_queue):
            self.refused += 1
            raise QueueFull()
        future: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self._waiting.setdefault(tenant, deque()).append(future)
        self.grant()
        return future

    def cancel(self, tenant: Hashable, future: asyncio.Future[None]) -> None:
        """Give up waiting (or give back the slot if it was granted meanwhile)."""
        if future.done() and not future.cancelled():
            self.release(tenant)
            return
        future.cancel()
        queue = self._waiting.get(tenant)
        if queue is not None:
            with contextlib.suppress(ValueError):
                queue.remove(future)
            if not queue:
                del self._waiting[tenant]
        self.grant()

    def release(self, tenant: Hashable) -> None:
        """Give back a slot held by ``tenant``."""
        n = self.held.get(tenant, 0) - 1
        if n > 0:
            self.held[tenant] = n
        else:
            self.held.pop(tenant, None)
        self.in_use = max(0, self.in_use - 1)
        self._last_seen[tenant] = self._clock()
        self.grant()

    def _take(self, tenant: Hashable) -> None:
        self.in_use += 1
        self.held[tenant] = self.held.get(tenant, 0) + 1

    def grant(self) -> None:
        """Hand free slots to waiting tenants: the one holding the fewest first (ties: the
        longest waiting), within its share; a served tenant goes to the back."""
        while self.in_use < self.slots and self._waiting:
            share = self.share()
            best: Hashable | None = None
            best_held = -1
            for tenant in self._waiting:  # insertion order: longest wait first
                held = self.held.get(tenant, 0)
                if held >= share:
                    continue
                if best_held < 0 or held < best_held:
                    best, best_held = tenant, held
            if best_held < 0:
                return  # everyone waiting holds its share
            queue = self._waiting.pop(best)
            future = queue.popleft()
            if queue:
                self._waiting[best] = queue  # to the back: the others go first next time
            self._take(best)
            self.queued += 1
            future.set_result(None)

    def waiting(self, tenant: Hashable) -> int:
        """Requests of ``tenant`` waiting for a slot."""
        queue = self._waiting.get(tenant)
        return len(queue) if queue is not None else 0


def request_share_from_env(env: dict[str, str] | None = None) -> RequestShare | None:
    """The node's :class:`RequestShare` from ``ORBIT_HTTP_*`` settings; None when
    ``ORBIT_HTTP_SLOTS`` is 0 (no fair share)."""
    settings = ShareSettings.from_env(env)
    return RequestShare(settings) if settings.slots > 0 else None
