"""Coalesced hand-out probes: the non-locking look before a hand-out
(:func:`orbit.delivery_pump.lease`), for many consumers of one node in one statement."""

from __future__ import annotations

import asyncio

from orbit.storage import Database
from orbit.store import deliveries as store
from orbit.store.subscriptions import SubscriptionRow

#: Most subscriptions one coalesced probe statement looks at.
PROBE_BATCH = 200

_Probed = tuple[SubscriptionRow, store.LeaseProbe] | None


class LeaseProbes:
    """Coalesces the hand-out probes of this node's consumers (:func:`orbit.delivery_pump.lease`): the probes
    asked for while one probe statement is in flight, or in the same turn of the event loop,
    go together in the next one (``delivery_lease_probe_many``, at most :data:`PROBE_BATCH`
    subscriptions a statement). Consumers that poll on a shared tick (the subscription
    stream does) therefore cost one read a tick, not one each. Same answers as one probe
    each; a failed statement fails the probes it carried.
    """

    def __init__(self, db: Database) -> None:
        self.db = db
        self._pending: dict[tuple[bytes, bytes], list[asyncio.Future[_Probed]]] = {}
        self._drainer: asyncio.Task[None] | None = None
        #: Probe statements sent and subscriptions they carried (tests, metrics).
        self.statements = 0
        self.probed = 0

    async def probe(self, namespace_id: bytes, subscription_id: bytes) -> _Probed:
        """The subscription row and its :class:`~orbit.store.deliveries.LeaseProbe`, or None
        when the subscription is gone."""
        fut: asyncio.Future[_Probed] = asyncio.get_running_loop().create_future()
        self._pending.setdefault((namespace_id, subscription_id), []).append(fut)
        if self._drainer is None or self._drainer.done():
            self._drainer = asyncio.ensure_future(self._drain())
        return await fut

    async def _drain(self) -> None:
        while self._pending:
            await asyncio.sleep(0)  # let the probes of this turn of the loop join
            keys = list(self._pending)[:PROBE_BATCH]
            waiters = {k: self._pending.pop(k) for k in keys}
            self.statements += 1
            self.probed += len(keys)
            try:
                seen = await self.db.read(
                    lambda tx, k=keys: store.delivery_lease_probe_many(tx, k)  # type: ignore[misc]
                )
            except Exception as exc:
                for futs in waiters.values():
                    for f in futs:
                        if not f.done():
                            f.set_exception(exc)
                continue
            for k, futs in waiters.items():
                for f in futs:
                    if not f.done():
                        f.set_result(seen.get(k))
