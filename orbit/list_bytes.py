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

A refused page or pull starts a *refusal window* for its application and that kind of read
(task pages, event pages, pulls): until the Retry-After it was given, the application's
requests of that kind are refused (same 429, the Retry-After left) before their key is
checked or anything is sized — a client looping on 429s costs the node
an HTTP exchange each, not an authentication and a sizing query. The application of a
request not yet authenticated is the one its bearer token last authenticated as on this
node (orbit/http/tenancy.py); a token the node does not know is never refused early.
"""

from __future__ import annotations

import math
import time
from collections import OrderedDict
from collections.abc import Callable, Hashable

from orbit.errors import RateLimited
from orbit.ratelimit import BucketMap, TokenBucket

#: Refusal windows (application and kind of read) a node remembers at most (oldest forgotten first).
MAX_REFUSED = 100_000


class ListBytes:
    """The buckets of list bytes of every application on this node."""

    def __init__(self, rate: float, burst: float) -> None:
        self.rate = max(1.0, float(rate))
        self.burst = max(1.0, float(burst))
        self._buckets = BucketMap(lambda: TokenBucket(self.rate, self.burst), max_keys=100_000)
        #: (application, kind of read) → monotonic time its refusal window ends.
        self._refused: OrderedDict[tuple[bytes, str], float] = OrderedDict()

    def charge(self, application_id: bytes, nbytes: int, kind: str = "tasks") -> None:
        """Spend ``nbytes`` of the application's budget (a page larger than the burst costs
        the whole burst); 429 ``rate_limited`` when it cannot pay, which starts a refusal
        window for ``kind`` (``tasks`` or ``events`` pages)."""
        if nbytes <= 0:
            return
        cost = min(float(nbytes), self.burst)
        bucket = self._buckets.get(application_id)
        if not bucket.take(cost):
            wait = bucket.retry_after_s(cost)
            self._refuse_until(application_id, kind, wait)
            raise _too_fast(wait)

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
        its previous hand-outs to be paid for); starts a refusal window for ``pulls``."""
        wait = self.wait_s(application_id)
        if wait > 0:
            self._refuse_until(application_id, "pulls", wait)
            raise _too_fast(wait)

    def refuse_early(self, tenant: Hashable, kind: str) -> None:
        """429 ``rate_limited`` at once when ``tenant`` (the request's provisional tenant,
        ``("app", application_id)``) is inside a refusal window for ``kind`` (``tasks``,
        ``events``, ``pulls``; module docstring)."""
        if not (isinstance(tenant, tuple) and len(tenant) == 2 and tenant[0] == "app"):
            return
        key = (tenant[1], kind)
        until = self._refused.get(key)
        if until is None:
            return
        left = until - time.monotonic()
        if left <= 0:
            del self._refused[key]
            return
        raise _too_fast(left)

    def _refuse_until(self, application_id: bytes, kind: str, wait_s: float) -> None:
        key = (application_id, kind)
        self._refused[key] = time.monotonic() + wait_s
        self._refused.move_to_end(key)
        while len(self._refused) > MAX_REFUSED:
            self._refused.popitem(last=False)

    def charge_for(self, application_id: bytes, kind: str = "tasks") -> Callable[[int], None]:
        """:meth:`charge` for one application and kind of page (what list services take as
        ``charge``)."""
        return lambda nbytes: self.charge(application_id, nbytes, kind)


def _too_fast(wait_s: float) -> RateLimited:
    return RateLimited(
        "this application reads list pages or deliveries faster than the node allows: retry "
        "after Retry-After or ask for fewer bytes (smaller limit or max)",
        retry_after=max(1, math.ceil(wait_s)),
        reason="list_bytes",
    )
