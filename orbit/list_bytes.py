"""A node's budget of list bytes per application: how fast one tenant may read stored JSON
(payloads, results, errors) through list pages (``GET …/tasks``, ``GET …/events``).

A page is bounded in bytes (orbit/pagination.py), but a tenant asking for 4 MiB pages in a
loop still keeps the node busy encoding and sending them, and every other tenant's requests
wait behind that work. Each application has a token bucket of bytes per node
(``settings.list_bytes_per_s``, default 8 MiB a second, bursts of
``settings.list_bytes_burst``, 32 MiB): a page is charged its bytes after it is sized and
before its rows are read; a page the bucket cannot pay is 429 ``rate_limited`` with
``Retry-After``, having read nothing. Pages of small items cost next to nothing.

Subscription pulls and stream hand-outs spend the same bucket, but they are sized only
while the deliveries are leased, so they pay afterwards (:meth:`ListBytes.spend`, the
bucket may go into debt by one hand-out) and the next one waits until the debt is paid
(:meth:`ListBytes.wait_s`): a pull is then 429 ``rate_limited`` before anything is leased,
a stream waits before its next hand-out.
"""

from __future__ import annotations

import math
from collections.abc import Callable

from orbit.errors import RateLimited
from orbit.ratelimit import BucketMap, TokenBucket


class ListBytes:
    """The buckets of list bytes of every application on this node."""

    def __init__(self, rate: float, burst: float) -> None:
        self.rate = max(1.0, float(rate))
        self.burst = max(1.0, float(burst))
        self._buckets = BucketMap(lambda: TokenBucket(self.rate, self.burst), max_keys=100_000)

    def charge(self, application_id: bytes, nbytes: int) -> None:
        """Spend ``nbytes`` of the application's budget (a page larger than the burst costs
        the whole burst); 429 ``rate_limited`` when it cannot pay."""
        if nbytes <= 0:
            return
        cost = min(float(nbytes), self.burst)
        bucket = self._buckets.get(application_id)
        if not bucket.take(cost):
            raise RateLimited(
                "this application reads list pages faster than the node allows: retry after "
                "Retry-After or ask for fewer bytes (smaller limit)",
                retry_after=math.ceil(bucket.retry_after_s(cost)),
                reason="list_bytes",
            )

    def spend(self, application_id: bytes, nbytes: int) -> None:
        """Spend ``nbytes`` (at most the burst) of the application's budget, even past what
        is left: bytes already handed out (a subscription pull or stream hand-out)."""
        if nbytes > 0:
            self._buckets.get(application_id).spend(min(float(nbytes), self.burst))

    def wait_s(self, application_id: bytes) -> float:
        """Seconds until the application's budget is out of debt (0.0: it may read now)."""
        return self._buckets.get(application_id).retry_after_s(0.0)

    def check(self, application_id: bytes) -> None:
        """429 ``rate_limited`` while the application's budget is in debt (a pull waits for
        its previous hand-outs to be paid for)."""
        wait = self.wait_s(application_id)
        if wait > 0:
            raise RateLimited(
                "this application reads deliveries faster than the node allows: retry after "
                "Retry-After or pull fewer bytes (smaller max)",
                retry_after=max(1, math.ceil(wait)),
                reason="list_bytes",
            )

    def charge_for(self, application_id: bytes) -> Callable[[int], None]:
        """:meth:`charge` for one application (what list services take as ``charge``)."""
        return lambda nbytes: self.charge(application_id, nbytes)
