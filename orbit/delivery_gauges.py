"""``orbit_deliveries{state}``: open deliveries of every subscription, refreshed in the
background with bounded work (never on a scrape).

Each refresh (every ``ORBIT_METRICS_REFRESH_S``, :meth:`orbit.metrics.Registry.run_refresh`)
counts the next ``per_round`` subscriptions in key order, continuing where the last refresh
stopped and starting over after the last one; every state of a subscription is counted up to
``cap`` rows (an index-only range, so a subscription with millions of PENDING deliveries costs
``cap`` index entries). The gauge is the sum of the latest count of every subscription seen in
the current or the previous pass. So one refresh costs at most ``per_round × 3 × cap`` index
entries and one pool connection for the length of one read, whatever the data; a value is at
most one pass old (``ceil(subscriptions / per_round)`` refreshes); a count at the cap is a
lower bound.
"""

from __future__ import annotations

from orbit.metrics import Registry
from orbit.storage import Database, Tx
from orbit.store import delivery_counts as count_store
from orbit.store import subscriptions as sub_store

STATES = ("PENDING", "LEASED", "EXHAUSTED")
#: Subscriptions counted per refresh.
PER_ROUND = 50
#: Rows counted at most per subscription and state.
CAP = 10_000
#: Subscriptions whose counts are remembered (the rest count once room frees up).
MAX_TRACKED = 10_000


class DeliveryGauges:
    """The state of the round-robin count (see the module docstring)."""

    def __init__(
        self,
        registry: Registry,
        db: Database,
        *,
        per_round: int = PER_ROUND,
        cap: int = CAP,
        max_tracked: int = MAX_TRACKED,
    ) -> None:
        self.db = db
        self.per_round = per_round
        self.cap = cap
        self.max_tracked = max_tracked
        self.gauge = registry.gauge(
            "orbit_deliveries",
            "Deliveries not yet acked, by state (all subscriptions; refreshed in the background)",
            ("state",),
        )
        for state in STATES:
            self.gauge.set(0, state=state)
        self._after: tuple[bytes, bytes] | None = None
        self._pass = 0
        #: (namespace id, subscription id) → (pass it was counted in, counts by state)
        self._counts: dict[tuple[bytes, bytes], tuple[int, dict[str, int]]] = {}

    async def refresh_pass(self, max_rounds: int = 10_000) -> None:
        """Refresh until the current pass ends (tests and tools; the loop calls ``refresh``)."""
        start = self._pass
        for _ in range(max_rounds):
            await self.refresh()
            if self._pass != start:
                return

    async def refresh(self) -> None:
        """Count the next page of subscriptions and set the gauge."""

        async def run(tx: Tx) -> list[tuple[tuple[bytes, bytes], dict[str, int]]]:
            keys = await sub_store.subscription_list_page(tx, self._after, self.per_round)
            counted = await tx.pipeline(
                *(
                    count_store.delivery_count_open_capped(tx, k.namespace_id, k.id, self.cap)
                    for k in keys
                )
            )
            return [((k.namespace_id, k.id), c) for k, c in zip(keys, counted, strict=True)]

        page = await self.db.read(run)
        for key, counts in page:
            if any(counts.values()):
                if key in self._counts or len(self._counts) < self.max_tracked:
                    self._counts[key] = (self._pass, counts)
            else:
                self._counts.pop(key, None)
        if len(page) < self.per_round:  # the end of a pass: forget what the pass did not see
            self._counts = {k: v for k, v in self._counts.items() if v[0] >= self._pass}
            self._pass += 1
            self._after = None
        else:
            self._after = page[-1][0]
        totals = dict.fromkeys(STATES, 0)
        for _, counts in self._counts.values():
            for state, n in counts.items():
                totals[state] = totals.get(state, 0) + n
        for state, n in totals.items():
            self.gauge.set(n, state=state)


def install(registry: Registry, db: Database) -> DeliveryGauges:
    """Register the ``orbit_deliveries`` refresher once per registry; return it."""
    return registry.refreshing("orbit_deliveries", lambda: DeliveryGauges(registry, db))
