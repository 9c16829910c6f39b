"""The byte budget of a hand-out: how many deliveries one pull answer or one stream hand-out
carries.

A hand-out is bounded in items (``max`` of a pull, the free slots of a stream,
``max_in_flight``) and in bytes: it stops adding deliveries once the stored JSON of their
events' results and errors would pass ``max_bytes`` (``settings.max_page_bytes``, 4 MiB by
default, the budget of a list page), and always carries at least one, so a consumer makes
progress whatever the size of one result. The sizes are read before anything is leased or
read in full (``delivery_event_sizes_by_seq``, ``delivery_event_scan_after``), so the
deliveries left out are never leased: they stay PENDING (rows) or after the cursor (new
events) for the next hand-out, and the range row of new events covers exactly the events
handed out.

Several consumers of one subscription can share one hand-out (a node round,
:func:`orbit.delivery_pump.lease_round`): each ask takes deliveries in order until its
``want`` or its own byte budget is reached, then the next ask takes over, so every
delivery leased belongs to exactly one ask.

What was handed out is then paid for from the application's list-bytes budget
(:func:`handed_out_bytes`, :meth:`orbit.list_bytes.ListBytes.spend`).
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field

from orbit.deliveries import Leased
from orbit.pagination import MAX_PAGE_BYTES


@dataclass(frozen=True, slots=True)
class Ask:
    """One consumer's share of a hand-out: at most ``want`` deliveries, at most ``max_bytes``
    of stored result JSON (at least one delivery when ``want`` > 0)."""

    want: int
    max_bytes: int = MAX_PAGE_BYTES


@dataclass(slots=True)
class HandOutBudget:
    """Decides, delivery by delivery in hand-out order, whether it is handed out
    (:meth:`take`), within ``limit`` deliveries in all (free in-flight room) and each ask's
    want and bytes. ``shares`` are the deliveries each ask got, in ask order."""

    asks: Sequence[Ask]
    limit: int
    shares: list[int] = field(default_factory=list)
    taken: int = 0
    bytes: int = 0
    cut: bool = False  # an ask stopped at its byte budget with room left: more may be due
    _ask: int = 0
    _bytes: int = 0

    def __post_init__(self) -> None:
        self.shares = [0] * len(self.asks)

    @classmethod
    def single(cls, want: int, max_bytes: int = MAX_PAGE_BYTES) -> HandOutBudget:
        return cls([Ask(want, max_bytes)], want)

    @property
    def wanted(self) -> int:
        return sum(max(0, a.want) for a in self.asks)

    @property
    def open(self) -> bool:
        """May another delivery still be handed out?"""
        return self.taken < self.limit and self._ask < len(self.asks)

    @property
    def bytes_left(self) -> int:
        """Most bytes the deliveries still to come may carry (the current ask's rest and every
        later ask's budget): how far a scan needs to size events."""
        if not self.open:
            return 0
        rest = sum(a.max_bytes for a in self.asks[self._ask + 1 :] if a.want > 0)
        return max(0, self.asks[self._ask].max_bytes - self._bytes) + rest

    def take(self, size: int) -> bool:
        """Hand out a delivery whose event carries ``size`` bytes of stored JSON? False once
        the budget is closed (no more room, every ask full or at its byte budget); after a
        False, every later call is False too."""
        size = max(0, int(size))
        while self.open:
            ask = self.asks[self._ask]
            got = self.shares[self._ask]
            if got < ask.want and (got == 0 or self._bytes + size <= ask.max_bytes):
                self.shares[self._ask] = got + 1
                self._bytes += size
                self.taken += 1
                self.bytes += size
                return True
            if got < ask.want:
                self.cut = True
            self._ask += 1
            self._bytes = 0
        return False

    def close(self) -> None:
        """No more deliveries (every later :meth:`take` is False)."""
        self._ask = len(self.asks)


def handed_out_bytes(deliveries: Iterable[Leased]) -> int:
    """The stored JSON (results and errors) of the events of ``deliveries``: what the byte
    budget counts."""
    return sum(len(d.event.result or "") + len(d.event.error or "") for d in deliveries)
