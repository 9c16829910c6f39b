"""Orbit Python SDK: producer/admin client (:class:`OrbitClient`, :class:`SyncOrbitClient`)
and task worker (:class:`Worker`).

Logging goes to ``logging.getLogger("orbit_sdk")`` (children ``orbit_sdk.worker``,
``orbit_sdk.connection``, ``orbit_sdk.http``, ``orbit_sdk.websockets``); API keys, session
tokens and execution tokens are never logged. The wire types of the worker protocol are
in :mod:`orbit_sdk.wire`.
"""

from ._backoff import Backoff
from ._execution import Outcome
from ._version import __version__
from .client import OrbitClient
from .context import TaskContext
from .errors import (
    Conflict,
    EffectUncertain,
    Forbidden,
    IdempotencyInProgress,
    IdempotencyMismatch,
    InvalidRequest,
    NotFound,
    NotReady,
    OrbitConnectionError,
    OrbitError,
    PayloadTooLarge,
    PermanentError,
    PreconditionFailed,
    QuotaExceeded,
    RateLimited,
    RetryableError,
    StaleToken,
    TaskError,
    Unauthenticated,
)
from .sync import SyncOrbitClient
from .types import (
    Application,
    Attempt,
    BatchItem,
    CancelAllResult,
    CreatedCredential,
    Event,
    EventPage,
    Namespace,
    Page,
    Queue,
    RetryPolicy,
    Task,
    TaskSpec,
    TaskState,
)
from .worker import Worker, WorkerStats

__all__ = [
    "Application",
    "Attempt",
    "Backoff",
    "BatchItem",
    "CancelAllResult",
    "Conflict",
    "CreatedCredential",
    "EffectUncertain",
    "Event",
    "EventPage",
    "Forbidden",
    "IdempotencyInProgress",
    "IdempotencyMismatch",
    "InvalidRequest",
    "Namespace",
    "NotFound",
    "NotReady",
    "OrbitClient",
    "OrbitConnectionError",
    "OrbitError",
    "Outcome",
    "Page",
    "PayloadTooLarge",
    "PermanentError",
    "PreconditionFailed",
    "Queue",
    "QuotaExceeded",
    "RateLimited",
    "RetryPolicy",
    "RetryableError",
    "StaleToken",
    "SyncOrbitClient",
    "Task",
    "TaskContext",
    "TaskError",
    "TaskSpec",
    "TaskState",
    "Unauthenticated",
    "Worker",
    "WorkerStats",
    "__version__",
]
from .subscriber import Delivery, Subscriber, SubscriberStats, SyncDelivery, SyncSubscriber

__all__ += ["Delivery", "Subscriber", "SubscriberStats", "SyncDelivery", "SyncSubscriber"]
