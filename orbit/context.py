"""The application context every HTTP handler and background loop receives.

The composition root (``cmd/orbit_cmd/server.py``) builds one :class:`AppContext` per process
and stores it on ``app.state.ctx``. Other packages keep their long-lived objects (dispatcher,
connection hub, batches) in their own typed runtime built from it once
(``pulse.runtime.PulseRuntime``, ``weave.runtime.WeaveRuntime``), so the platform never
imports them. The platform's own per-process objects are typed fields here.
"""

from __future__ import annotations

import os
import socket
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from orbit.delivery_loop import DeliveryHub
from orbit.http.subscription_stream import StreamRegistry
from orbit.http.tenancy import TenantHints
from orbit.list_bytes import ListBytes
from orbit.metrics import Registry
from orbit.request_share import RequestShare, request_share_from_env
from orbit.settings import Settings
from orbit.storage import Database

if TYPE_CHECKING:
    from orbit.http.ops import Readiness


def default_node_id() -> str:
    """``<host>:<pid>``: names this process in logs, metrics and worker sessions."""
    return f"{socket.gethostname()}:{os.getpid()}"


@dataclass(slots=True)
class OpsCache:
    """The operations routes' per-process answers: /readyz's last result and until when it
    holds (monotonic seconds), and the encoded /openapi.json."""

    readiness: Readiness | None = None
    readiness_until: float = 0.0
    openapi: bytes | None = None


@dataclass
class AppContext:
    """Process-wide state: the pool, settings, metrics registry and a node id."""

    db: Database
    settings: Settings = field(default_factory=Settings)
    metrics: Registry = field(default_factory=Registry)
    node_id: str = field(default_factory=default_node_id)
    #: Which application a bearer token was last seen for (the pool's fair share).
    tenant_hints: TenantHints = field(default_factory=TenantHints)
    ops: OpsCache = field(default_factory=OpsCache)
    #: Wakes this node's subscription consumers when their deliveries move.
    delivery_hub: DeliveryHub = field(default_factory=DeliveryHub)
    #: This node's subscription WebSockets and the options new ones take.
    streams: StreamRegistry = field(default_factory=StreamRegistry)
    #: The HTTP request fair share between tenants (None: ``ORBIT_HTTP_SLOTS=0``, none).
    request_share: RequestShare | None = field(default_factory=request_share_from_env)
    #: Each application's budget of list bytes on this node (from ``settings``).
    list_bytes: ListBytes = field(init=False)

    def __post_init__(self) -> None:
        self.list_bytes = ListBytes(self.settings.list_bytes_per_s, self.settings.list_bytes_burst)
