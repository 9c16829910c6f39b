"""Resources returned by the HTTP API (tasks, queues, events, administration).

Every field except an id has a default and unknown fields are ignored, so the server can
add fields without breaking older SDKs. Business JSON (``payload``, ``result``) stays
:class:`msgspec.Raw` (the server's exact bytes); ``decode_payload()`` / ``decode_result()``
turn it into Python values, optionally into a given type.
"""

from __future__ import annotations

import builtins
import enum
from datetime import datetime
from typing import Any, Generic, Literal, TypeVar, overload

import msgspec
from msgspec import UNSET, Raw, UnsetType

from . import _json
from .wire import NULL

__all__ = [
    "Application",
    "Attempt",
    "BatchItem",
    "CancelAllResult",
    "CreatedCredential",
    "Event",
    "EventPage",
    "Namespace",
    "Page",
    "Queue",
    "QueueConfig",
    "RetryAllResult",
    "RetryBounds",
    "RetryPolicy",
    "Task",
    "TaskRetry",
    "TaskSpec",
    "TaskState",
]

T = TypeVar("T")


class TaskState(enum.StrEnum):
    """Task states (``Task.state`` compares equal to these)."""

    WAITING = "WAITING"  # submitted, not yet offered to a worker
    LEASED = "LEASED"  # offered to a worker session, not started
    RUNNING = "RUNNING"  # a worker started it and holds the execution token
    SUCCEEDED = "SUCCEEDED"  # terminal: completed with a result
    FAILED = "FAILED"  # terminal: failed for good (or deadline passed)
    CANCELLED = "CANCELLED"  # terminal: cancelled
    NEEDS_REVIEW = "NEEDS_REVIEW"  # an operator must resolve it (e.g. effect uncertain)

    @property
    def is_terminal(self) -> bool:
        """True for SUCCEEDED, FAILED and CANCELLED."""
        return self in (TaskState.SUCCEEDED, TaskState.FAILED, TaskState.CANCELLED)


class Page(msgspec.Struct, Generic[T], kw_only=True):
    """One page of a list; pass ``next_cursor`` back to get the next (None: last page)."""

    items: list[T] = msgspec.field(default_factory=list)
    next_cursor: str | None = None


class Task(msgspec.Struct, kw_only=True):
    """A task as the server returns it."""

    id: str
    queue: str = ""
    owner_id: str = ""
    kind: str = ""
    pipeline_version: str | None = None
    dedup_key: str | None = None
    state: str = ""
    priority: int = 0
    payload: Raw = NULL
    result: Raw = NULL
    error: Any = None
    attempts: int = 0
    max_attempts: int | None = None
    retry_safe: bool = False
    concurrency_key: str | None = None
    fairness_key: str | None = None
    """The task's fairness subject within its queue (None: its owner)."""
    retry: TaskRetry | None = None
    """The backoff policy frozen into the task at submit (its own, else its queue's)."""
    effect_uncertain: bool = False
    created_at: datetime | None = None
    available_at: datetime | None = None
    deadline_at: datetime | None = None
    finished_at: datetime | None = None
    revision: int = 0
    deduplicated: bool = False
    """True when submit found an existing task with the same identity (HTTP 200)."""
    cancel_requested: bool = False
    """True when cancel reached a running task (HTTP 202): the worker is asked to stop."""
    stuck_at: datetime | None = None
    """When the server's stuck-work watchdog surfaced the task in its current state (None
    when it is not stuck)."""
    stuck_reason: str | None = None
    """Why it was surfaced, e.g. ``RUNNING for 612 s > stuck_after_ms 600000 on queue x``."""
    progress: Any = None
    """The latest progress document its running (or last) attempt reported with a heartbeat
    (``TaskContext.set_progress``), decoded; None when that attempt reported none."""
    progress_at: datetime | None = None
    """When that progress was written (server clock)."""

    @overload
    def decode_payload(self) -> Any: ...
    @overload
    def decode_payload(self, type: builtins.type[T]) -> T: ...
    def decode_payload(self, type: Any = Any) -> Any:
        """The payload as Python values (or as ``type``)."""
        return _json.decode(self.payload, type)

    @overload
    def decode_result(self) -> Any: ...
    @overload
    def decode_result(self, type: builtins.type[T]) -> T: ...
    def decode_result(self, type: Any = Any) -> Any:
        """The result as Python values (or as ``type``); None while there is none."""
        return _json.decode(self.result, type)

    @property
    def is_terminal(self) -> bool:
        """True once the task is SUCCEEDED, FAILED or CANCELLED."""
        return self.state in ("SUCCEEDED", "FAILED", "CANCELLED")


class TaskRetry(msgspec.Struct, kw_only=True, omit_defaults=True):
    """A task's own backoff (``retry`` of a submit): the fields given replace the queue's
    default for this task, within the queue's :class:`RetryBounds` (a value outside them
    raises :class:`~orbit_sdk.errors.InvalidRequest` naming the field). Also the frozen
    policy on a :class:`Task`."""

    backoff_initial_ms: int | None = None
    backoff_max_ms: int | None = None
    backoff_multiplier: float | None = None


class TaskSpec(msgspec.Struct, kw_only=True):
    """A task to submit (the body of ``POST .../tasks``; one item of a batch).

    ``payload`` may be any msgspec-encodable value, or a :class:`msgspec.Raw` holding JSON
    bytes that are sent exactly as given.
    """

    queue: str
    kind: str
    payload: Any = None
    pipeline_version: str | UnsetType = UNSET
    dedup_key: str | UnsetType = UNSET
    priority: int | UnsetType = UNSET
    delay_ms: int | UnsetType = UNSET
    available_at: datetime | UnsetType = UNSET
    deadline_at: datetime | UnsetType = UNSET
    max_attempts: int | UnsetType = UNSET
    retry_safe: bool | UnsetType = UNSET
    concurrency_key: str | UnsetType = UNSET
    fairness_key: str | UnsetType = UNSET
    retry: TaskRetry | UnsetType = UNSET


class BatchItem(msgspec.Struct, kw_only=True):
    """Per-item result of a batch submit: ``status`` 201/200 with ``task``, else ``error``."""

    status: int
    task: Task | None = None
    error: dict[str, Any] | None = None

    @property
    def ok(self) -> bool:
        """True when the item was created (201) or deduplicated (200)."""
        return self.status in (200, 201)


class CancelAllResult(msgspec.Struct, kw_only=True):
    """Bulk cancel: tasks cancelled at once, and running tasks asked to stop."""

    cancelled: int = 0
    cancel_requested: int = 0


class RetryAllResult(msgspec.Struct, kw_only=True):
    """Bulk re-run: tasks re-run and those a full quota refused; for a dry run, how many
    match (``more``: past the count's cap)."""

    retried: int = 0
    quota_refused: int = 0
    matched: int | None = None
    more: bool = False


class Attempt(msgspec.Struct, kw_only=True):
    """One execution generation of a task, with the server's evidence records."""

    id: str = ""
    generation: int = 0
    state: str = ""
    session_id: str | None = None
    concurrency_token: int | None = None
    lease_expires_at: datetime | None = None
    offered_at: datetime | None = None
    started_at: datetime | None = None
    finished_at: datetime | None = None
    result: Raw = NULL
    error: Any = None
    retryable: bool | None = None
    progress: Any = None
    """The last progress document this attempt reported (decoded), or None."""
    progress_at: datetime | None = None
    evidence: Any = None


class Event(msgspec.Struct, kw_only=True):
    """A result event (``task.succeeded``, ``task.failed``, ``task.cancelled``,
    ``task.needs_review``) with the frozen task snapshot."""

    seq: int
    event_id: str = ""
    type: str = ""
    created_at: datetime | None = None
    task_id: str = ""
    queue: str = ""
    kind: str | None = None
    owner_id: str = ""
    state: str = ""
    result: Raw = NULL
    error: Any = None
    attempts: int = 0
    finished_at: datetime | None = None

    @overload
    def decode_result(self) -> Any: ...
    @overload
    def decode_result(self, type: builtins.type[T]) -> T: ...
    def decode_result(self, type: Any = Any) -> Any:
        """The snapshot's result as Python values (or as ``type``)."""
        return _json.decode(self.result, type)


class EventPage(msgspec.Struct, kw_only=True):
    """A page of result events. Poll on with ``after_seq=next_after_seq`` (the seq of the
    last item, or the one asked for when the page is empty)."""

    items: list[Event] = msgspec.field(default_factory=list)
    next_cursor: str | None = None
    next_after_seq: int | None = None


class RetryPolicy(msgspec.Struct, kw_only=True, omit_defaults=True):
    """A queue's default retry policy (frozen into each task at submit)."""

    max_attempts: int | None = None
    backoff_initial_ms: int | None = None
    backoff_max_ms: int | None = None
    backoff_multiplier: float | None = None


class RetryBounds(msgspec.Struct, kw_only=True, omit_defaults=True):
    """What a task's own retry policy may ask for in a queue: delays within
    ``[min_delay_ms, max_delay_ms]``, a multiplier at most ``max_multiplier`` (None: no
    bound of that kind)."""

    min_delay_ms: int | None = None
    max_delay_ms: int | None = None
    max_multiplier: float | None = None


class QueueConfig(msgspec.Struct, kw_only=True):
    """Body of ``PUT .../queues/{queue}``; unset fields are left out of the request."""

    max_unfinished_tasks: int | UnsetType | None = UNSET
    max_concurrency: int | UnsetType | None = UNSET
    max_starts_per_second: float | UnsetType | None = UNSET
    lease_ms: int | UnsetType = UNSET
    retry: RetryPolicy | UnsetType = UNSET
    retry_bounds: RetryBounds | UnsetType = UNSET
    stuck_after_ms: int | UnsetType | None = UNSET


class Queue(msgspec.Struct, kw_only=True):
    """A queue's configuration, gate and live counts. ``etag`` comes from the ETag header;
    ``created`` is True when a PUT created it (201)."""

    name: str = ""
    id: str = ""
    max_unfinished_tasks: int | None = None
    max_concurrency: int | None = None
    max_starts_per_second: float | None = None
    lease_ms: int | None = None
    retry: RetryPolicy | None = None
    retry_bounds: RetryBounds | None = None
    stuck_after_ms: int | None = None
    paused: bool = False
    namespace_paused: bool = False
    counts: dict[str, int] = msgspec.field(default_factory=dict)
    usage: dict[str, Any] = msgspec.field(default_factory=dict)
    revision: int = 0
    etag: str | None = None
    created: bool = False


class Application(msgspec.Struct, kw_only=True):
    """An application (tenant and owner of tasks)."""

    id: str
    name: str = ""
    status: str = ""
    created_at: datetime | None = None
    revision: int = 0


class Namespace(msgspec.Struct, kw_only=True):
    """A namespace of an application (the isolation boundary of runtime data)."""

    id: str = ""
    name: str = ""
    application_id: str = ""
    created_at: datetime | None = None


class CreatedCredential(msgspec.Struct, kw_only=True):
    """A new API key. ``key`` is shown once; it is hidden from ``repr``."""

    id: str
    key: str
    name: str = ""
    namespaces: list[str] = msgspec.field(default_factory=list)
    actions: list[str] = msgspec.field(default_factory=list)
    queues: list[str] | None = None
    expires_at: datetime | None = None

    def __repr__(self) -> str:
        return f"CreatedCredential(id={self.id!r}, key='[redacted]', name={self.name!r})"


ResolveAction = Literal["retry", "succeed", "fail"]
