"""Fair shares of a node's database connections between tenants.

Every pooled connection is taken through a :class:`FairGate` on behalf of the *tenant* of the
running task (:data:`current_tenant`, a context variable: the application of the request's
key or worker session once authenticated, a provisional key from the bearer token before
that, ``None`` for the node's own background loops). Two rules:

* **A cap per tenant.** One tenant holds at most ``per_tenant`` connections of the pool at
  once (default 80 % of it, at least one), so a tenant's flood always leaves connections for
  the others, even when its transactions are slow (lock waits, big reads).
* **Fair hand-over.** When the pool is busy, waiting requests queue *per tenant*; a freed
  connection goes to the waiting tenant that holds the fewest connections (ties: the one that
  has waited longest), never simply to the oldest waiter. A tenant with one request waiting
  is served at the next release however many requests a flooding tenant has queued.

Work-conserving: while nobody else waits, one tenant may use everything up to its cap. The
cap and the wait both count against the pool timeout (``--pool-timeout``): a request that
cannot get a connection in time gets 503 ``pool_exhausted`` as before.
"""

from __future__ import annotations

import asyncio
import contextvars
from collections import deque
from collections.abc import Hashable

#: The tenant the running task works for (None: the node itself, e.g. a background loop).
current_tenant: contextvars.ContextVar[Hashable | None] = contextvars.ContextVar(
    "orbit_current_tenant", default=None
)

#: Share of the pool one tenant may hold at once (at least one connection).
DEFAULT_SHARE = 0.8
#: Pools smaller than this are not capped per tenant (a cap would leave one connection).
MIN_CAPPED_POOL = 4

#: Slots the running task holds already: a transaction opened while another is open (rare)
#: is not held back by its tenant's cap, so it cannot wait on itself.
_holding: contextvars.ContextVar[int] = contextvars.ContextVar("orbit_gate_holding", default=0)


def enter_tenant(tenant: Hashable | None) -> None:
    """Make ``tenant`` the owner of the running task's database work from here on (the rest
    of the request, and tasks it starts)."""
    current_tenant.set(tenant)


class GateTimeout(Exception):
    """No connection became free for this tenant in time."""


class FairGate:
    """Admission to ``capacity`` connections, by tenant (see the module docstring)."""

    def __init__(self, capacity: int, *, share: float = DEFAULT_SHARE) -> None:
        if capacity < 1:
            raise ValueError("capacity must be >= 1")
        self.capacity = capacity
        self.per_tenant = (
            capacity if capacity < MIN_CAPPED_POOL else max(1, min(capacity, int(capacity * share)))
        )
        self.in_use = 0
        self.held: dict[Hashable | None, int] = {}
        #: Waiting tenants in the order they started waiting, each with its FIFO of waiters.
        self._waiting: dict[Hashable | None, deque[tuple[asyncio.Future[None], bool]]] = {}
        #: Grants made at once / after a wait (for tests and metrics).
        self.immediate = 0
        self.queued = 0

    def _may_take(self, tenant: Hashable | None) -> bool:
        return self.in_use < self.capacity and self.held.get(tenant, 0) < self.per_tenant

    async def acquire(self, tenant: Hashable | None, wait_s: float | None = None) -> None:
        """Take one slot for ``tenant``; :class:`GateTimeout` after ``wait_s`` seconds."""
        nested = _holding.get() > 0
        if not self._waiting and (
            self._may_take(tenant) or (nested and self.in_use < self.capacity)
        ):
            self._take(tenant)
            self.immediate += 1
            return
        future: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self._waiting.setdefault(tenant, deque()).append((future, nested))
        self._grant()
        try:
            if wait_s is None:
                await asyncio.shield(future)
            else:
                await asyncio.wait_for(asyncio.shield(future), wait_s)
        except BaseException as exc:
            if future.done() and not future.cancelled():
                self.release(tenant)  # granted while we gave up: hand it on
            else:
                future.cancel()
                self._forget(tenant, future)
            if isinstance(exc, TimeoutError):
                raise GateTimeout() from None
            raise
        self.queued += 1

    def hold(self) -> contextvars.Token[int]:
        """Mark the running task as holding a slot (until :meth:`unhold`)."""
        return _holding.set(_holding.get() + 1)

    @staticmethod
    def unhold(token: contextvars.Token[int]) -> None:
        _holding.reset(token)

    def release(self, tenant: Hashable | None) -> None:
        """Give back a slot taken for ``tenant``."""
        n = self.held.get(tenant, 0) - 1
        if n > 0:
            self.held[tenant] = n
        else:
            self.held.pop(tenant, None)
        self.in_use -= 1
        self._grant()

    def _take(self, tenant: Hashable | None) -> None:
        self.in_use += 1
        self.held[tenant] = self.held.get(tenant, 0) + 1

    def _forget(self, tenant: Hashable | None, future: asyncio.Future[None]) -> None:
        queue = self._waiting.get(tenant)
        if queue is None:
            return
        for entry in queue:
            if entry[0] is future:
                queue.remove(entry)
                break
        if not queue:
            del self._waiting[tenant]

    def _grant(self) -> None:
        while self.in_use < self.capacity and self._waiting:
            best: Hashable | None = None
            best_held = -1
            for tenant, queue in self._waiting.items():  # insertion order: longest wait first
                held = self.held.get(tenant, 0)
                if held >= self.per_tenant and not queue[0][1]:  # at its cap (unless nested)
                    continue
                if best_held < 0 or held < best_held:
                    best, best_held = tenant, held
            if best_held < 0:
                return  # everyone waiting is at its cap
            queue = self._waiting.pop(best)
            future, _nested = queue.popleft()
            if queue:
                self._waiting[best] = queue  # to the back: the others go first next time
            if future.done():  # cancelled meanwhile
                continue
            self._take(best)
            future.set_result(None)
