"""Subscriptions and deliveries as the HTTP API returns them.

A pulled delivery keeps its event as :class:`msgspec.Raw` (the server's exact bytes; the
snapshot's ``result`` keeps its digits); ``decode_event()`` gives the typed
:class:`~orbit_sdk.types.Event`. Delivery proofs are secrets: they never appear in ``repr``.
"""

from __future__ import annotations

import enum
from datetime import datetime
from typing import Any, Literal

import msgspec
from msgspec import Raw

from . import _json
from .types import Event
from .wire import NULL

__all__ = [
    "AckResult",
    "Backlog",
    "DeliveryInfo",
    "DeliveryState",
    "PulledDelivery",
    "StartPosition",
    "Subscription",
    "SubscriptionFilter",
]

StartPosition = Literal["earliest", "latest"] | int
"""Where a new subscription starts: ``"earliest"``, ``"latest"`` or after a sequence number."""


class DeliveryState(enum.StrEnum):
    """Delivery states (``DeliveryInfo.state`` compares equal to these)."""

    PENDING = "PENDING"  # waiting to be handed out (possibly in backoff until next_at)
    LEASED = "LEASED"  # handed out under a proof until lease_expires_at
    ACKED = "ACKED"  # acknowledged: final
    EXHAUSTED = "EXHAUSTED"  # budget spent; kept until an operator adds budget


class SubscriptionFilter(msgspec.Struct, kw_only=True, omit_defaults=True):
    """Which result events a subscription selects. None means "any"; every present field
    must match, and a list matches any of its values. ``states`` are task states
    (``SUCCEEDED``, ``FAILED``, ``CANCELLED``, ``NEEDS_REVIEW``)."""

    queues: list[str] | None = None
    kinds: list[str] | None = None
    states: list[str] | None = None
    owner_id: str | None = None


class Backlog(msgspec.Struct, kw_only=True):
    """Delivery counts of a subscription by state, plus events not yet scanned."""

    pending: int = 0
    in_flight: int = 0
    exhausted: int = 0
    acked: int = 0
    unscanned_events: int = 0
    last_seq: int = 0


class Subscription(msgspec.Struct, kw_only=True):
    """A subscription's configuration; ``backlog`` only from ``get``.

    ``start`` is as created (``"earliest"``, ``"latest"`` or ``{"after_seq": n}``);
    ``position`` is the scan position (every event with ``seq <= position`` was considered).
    ``etag`` comes from the ``ETag`` header; ``created`` is True when a PUT created it (201).
    """

    id: str
    name: str = ""
    filter: SubscriptionFilter = msgspec.field(default_factory=SubscriptionFilter)
    start: Any = None
    ack_timeout_ms: int = 0
    max_deliveries: int = 0
    max_in_flight: int = 0
    position: int = 0
    revision: int = 0
    created_at: datetime | None = None
    updated_at: datetime | None = None
    backlog: Backlog | None = None
    etag: str | None = None
    created: bool = False


class PulledDelivery(msgspec.Struct, kw_only=True):
    """One hand-out of a delivery from ``subscriptions.pull``. Ack it with its ``proof``
    (``subscriptions.ack(d.delivery_id, d.proof)``) once the effect is committed.

    ``attempt`` counts hand-outs (2 or more: a redelivery, with a new proof). The proof is
    hidden from ``repr``.
    """

    delivery_id: str
    seq: int = 0
    event_id: str = ""
    proof: str = ""
    event: Raw = NULL
    attempt: int = 1
    lease_expires_at: datetime | None = None

    def __repr__(self) -> str:
        return (
            f"PulledDelivery(delivery_id={self.delivery_id!r}, seq={self.seq}, "
            f"event_id={self.event_id!r}, attempt={self.attempt}, proof='[redacted]')"
        )

    def decode_event(self) -> Event:
        """The result event snapshot (``type``, ``task_id``, ``state``, ``result``, ...)."""
        return _json.decode(self.event, Event)


class DeliveryInfo(msgspec.Struct, kw_only=True):
    """A delivery in history and in ack, nack and budget answers (never with a proof)."""

    delivery_id: str
    seq: int = 0
    event_id: str = ""
    state: str = ""
    attempts: int = 0
    budget: int = 0
    lease_expires_at: datetime | None = None
    next_at: datetime | None = None
    acked_at: datetime | None = None
    created_at: datetime | None = None
    updated_at: datetime | None = None


class AckResult(msgspec.Struct, kw_only=True):
    """An ack's answer: ``outcome`` is ``applied`` the first time, ``replayed`` after."""

    outcome: str = ""
    delivery: DeliveryInfo | None = None

    @property
    def replayed(self) -> bool:
        """True when the delivery had already been acked with this proof."""
        return self.outcome == "replayed"
