"""Admission of worker traffic: what one stream, one session and one tenant may ask of a node.

A legitimate worker sends a handful of frames per task (start, report, an effect or two) and
one heartbeat every ``heartbeat_ms``. Everything beyond that, per stream or per session, is a
flood, and floods of one tenant must not slow another down:

* **Frame budget, per stream.** A token bucket of ``frame_rate`` frames a second (default
  1,000, at least ``4 × max_concurrency``) with a burst of ``frame_burst`` (2,000, at least
  ``4 × max_concurrency``). A stream that exceeds it gets an ``error`` frame
  ``rate_limited`` and is closed with 1008 (policy violation); the session stays usable.
* **Error budget, per stream.** A worker's frames are well formed and name its own attempts;
  a stream whose frames keep being refused as malformed, too large or naming attempts that
  do not exist (``invalid_request``, ``payload_too_large``, ``not_found``) more than
  ``error_rate`` a second (default 20, bursts of ``error_burst``, 100) gets ``rate_limited``
  and is closed with 1008.
* **Heartbeat budget, per session.** Heartbeats are the only frames a worker sends on its
  own clock, and each one is a locking transaction: at most ``20 + 2 × max_concurrency`` at
  once, refilled at ``(4 + 2 × max_concurrency)`` per ``heartbeat_ms`` (at least 2 a second).
  Over the stream: ``error`` ``rate_limited`` and close 1008. Over HTTP
  (``…/sessions/{sid}/heartbeat``, ``…/attempts/{aid}/heartbeat``): 429 ``rate_limited`` with
  ``Retry-After``.
* **Cool-down after a refusal.** A stream closed with 1008 leaves its session cooling down
  until the budget it spent has refilled (at least :data:`COOL_DOWN_MIN_S`, doubled for each
  further refusal of the session within :data:`STRIKE_MEMORY_S`, at most
  :data:`COOL_DOWN_MAX_S`): an upgrade of
  that session's stream meanwhile is refused with HTTP 429 ``rate_limited`` and
  ``Retry-After`` before any authentication or database work, so a flood that reconnects at
  once costs the node an HTTP exchange per attempt, not a session check, a bind and a burst.
  Only frames on an authenticated stream can start a cool-down.
* **``attempt_ids`` bound.** A heartbeat may list at most the session's ``max_concurrency``
  attempts (it cannot hold more); a longer list is 400 ``invalid_request`` naming the field.
* **Fair share per tenant.** A node handles at most ``frame_slots`` worker frames at once
  (default 2,048, over all streams), one application at most ``tenant_frame_share_pct`` % of
  them (80): when others wait, a freed slot goes to the waiting application that holds the
  fewest (the pool's fair gate, orbit/storage/fairness.py, on frames), so a tenant's flood
  leaves room for the others while a tenant alone on a node may use nearly all of it. A
  tenant's further frames wait (back-pressure on its own sockets only). The database side is
  shared fairly by the pool's gate.

Every refusal is counted in ``pulse_worker_frames_refused_total{reason}``.
"""

from __future__ import annotations

import time
from collections import OrderedDict
from dataclasses import dataclass
from typing import Any

from orbit.errors import InvalidRequest, RateLimited
from orbit.ratelimit import BucketMap, TokenBucket
from orbit.storage.fairness import FairGate
from pulse.rounds import settings_from_env
from pulse.sessions import SessionInfo

#: WebSocket close code for a stream over its budget (policy violation).
CLOSE_POLICY = 1008
#: Shortest cool-down of a session whose stream was closed for its budget (seconds).
COOL_DOWN_MIN_S = 1.0
#: Longest cool-down (seconds), reached by a session refused again and again.
COOL_DOWN_MAX_S = 60.0
#: A refusal this long after the previous one starts the doubling again (seconds).
STRIKE_MEMORY_S = 300.0
#: Sessions cooling down that a node remembers (oldest forgotten first).
COOL_DOWN_MAX_KEYS = 100_000


@dataclass(frozen=True, slots=True)
class AdmissionSettings:
    """Tunables; ``ORBIT_PULSE_<NAME>`` environment overrides."""

    #: Frames a second one stream may send (raised to 4 × max_concurrency).
    frame_rate: int = 1_000
    #: Frames one stream may send at once (raised to 4 × max_concurrency).
    frame_burst: int = 2_000
    #: Refused frames (malformed, too large, unknown attempt) a second one stream may send.
    error_rate: int = 20
    #: Refused frames one stream may send at once.
    error_burst: int = 100
    #: Worker frames handled at once on a node, over all streams.
    frame_slots: int = 2_048
    #: Most of them one application may hold while others wait (percent).
    tenant_frame_share_pct: int = 80

    @classmethod
    def from_env(cls, env: dict[str, str] | None = None, **overrides: int) -> AdmissionSettings:
        return settings_from_env(cls, env, overrides)


def frame_bucket(settings: AdmissionSettings, info: SessionInfo) -> TokenBucket:
    """The frame budget of one stream of the session."""
    floor = 4 * info.max_concurrency
    return TokenBucket(max(settings.frame_rate, floor), max(settings.frame_burst, floor))


def error_bucket(settings: AdmissionSettings) -> TokenBucket:
    """The error budget of one stream."""
    return TokenBucket(max(1, settings.error_rate), max(1, settings.error_burst))


def heartbeat_bucket(info: SessionInfo) -> TokenBucket:
    """The heartbeat budget of the session."""
    per_interval = 4 + 2 * info.max_concurrency
    rate = max(2.0, per_interval * 1000.0 / max(1, info.heartbeat_ms))
    return TokenBucket(rate, 20 + 2 * info.max_concurrency)


def check_attempt_ids(info: SessionInfo, attempt_ids: list[str]) -> None:
    """400 when a heartbeat lists more attempts than the session can hold."""
    if len(attempt_ids) > info.max_concurrency:
        raise InvalidRequest(
            f"a heartbeat lists at most the session's max_concurrency ({info.max_concurrency}) "
            f"attempts, not {len(attempt_ids)}",
            field="attempt_ids",
            max_items=info.max_concurrency,
        )


class Admission:
    """A node's admission state: heartbeat buckets per session, frame slots per tenant."""

    def __init__(self, settings: AdmissionSettings | None = None, metrics: Any = None) -> None:
        self.settings = settings or AdmissionSettings.from_env()
        self._heartbeats = BucketMap(lambda: TokenBucket(1, 1), max_keys=100_000)
        self._cooling: OrderedDict[tuple[str, str], float] = OrderedDict()
        self._strikes: OrderedDict[tuple[str, str], tuple[int, float]] = OrderedDict()
        self._gate = FairGate(
            max(1, self.settings.frame_slots),
            share=min(100, max(1, self.settings.tenant_frame_share_pct)) / 100,
        )
        self._refused = (
            metrics.counter(
                "pulse_worker_frames_refused_total",
                "Worker frames and heartbeats refused by admission, by reason",
                ("reason",),
            )
            if metrics is not None
            else None
        )

    def refused(self, reason: str) -> None:
        """Count a refusal (``frame_budget``, ``error_budget``, ``heartbeat_budget``,
        ``attempt_ids``, ``progress``, ``cooling_down``)."""
        if self._refused is not None:
            self._refused.inc(reason=reason)

    def heartbeat(self, info: SessionInfo) -> None:
        """Spend one heartbeat of the session's budget; 429 ``rate_limited`` when spent."""
        bucket = self._heartbeats.get(info.key, lambda: heartbeat_bucket(info))
        if not bucket.take():
            self.refused("heartbeat_budget")
            raise RateLimited(
                "too many heartbeats for this session: send one every heartbeat_ms",
                retry_after=int(bucket.retry_after_s()) + 1,
                reason="heartbeat_budget",
            )

    def heartbeat_retry_s(self, info: SessionInfo) -> float:
        """Seconds until the session's heartbeat budget has a heartbeat again."""
        return self._heartbeats.get(info.key, lambda: heartbeat_bucket(info)).retry_after_s()

    def cool_down(self, namespace: str, session_id: str, seconds: float) -> float:
        """Refuse upgrades of the session's stream (``namespace`` and ``session_id`` as in
        its path) for ``seconds`` (at least :data:`COOL_DOWN_MIN_S`), doubled for each
        refusal of the session since its last quiet :data:`STRIKE_MEMORY_S`; returns the
        cool-down given."""
        key = (namespace, session_id)
        now = time.monotonic()
        count, last = self._strikes.get(key, (0, now))
        count = count + 1 if now - last < STRIKE_MEMORY_S else 1
        self._strikes[key] = (count, now)
        wait = min(COOL_DOWN_MAX_S, max(COOL_DOWN_MIN_S, seconds) * 2.0 ** min(count - 1, 16))
        self._cooling[key] = now + wait
        for table in (self._cooling, self._strikes):
            table.move_to_end(key)
            while len(table) > COOL_DOWN_MAX_KEYS:
                table.popitem(last=False)
        return wait

    def cooling(self, namespace: str, session_id: str) -> float:
        """Seconds the session's stream is still cooling down (0: it may connect)."""
        until = self._cooling.get((namespace, session_id))
        if until is None:
            return 0.0
        left = until - time.monotonic()
        if left <= 0:
            del self._cooling[(namespace, session_id)]
            return 0.0
        return left

    def tenant_slots(self, application_id: bytes) -> TenantSlots:
        """The frame slots of ``application_id`` on this node (see the module docstring)."""
        return TenantSlots(self._gate, ("app", application_id))

    def leave(self, application_id: bytes) -> None:
        """A stream of the application ended (nothing to give back: slots are per frame)."""


class TenantSlots:
    """One application's share of the node's frame slots: ``acquire`` before handling a
    frame, ``release`` after."""

    __slots__ = ("_gate", "_tenant")

    def __init__(self, gate: FairGate, tenant: tuple[str, bytes]) -> None:
        self._gate = gate
        self._tenant = tenant

    async def acquire(self) -> None:
        await self._gate.acquire(self._tenant)

    def release(self) -> None:
        self._gate.release(self._tenant)
