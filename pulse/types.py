"""Wire types of Pulse's producer/operator HTTP bodies (msgspec Structs) and task states.

Request bodies reject unknown fields (a typo such as ``"prority"`` is a 400 naming it, never
silently ignored). Responses are plain dicts built by :mod:`pulse.transitions` and the
services, so additive fields cost nothing.
"""

from __future__ import annotations

from enum import StrEnum
from typing import Annotated

import msgspec
from msgspec import Meta

from orbit.times import Time
from orbit.types import NAME_PATTERN, IdText

Name = Annotated[str, Meta(pattern=NAME_PATTERN)]
UInt32 = Annotated[int, Meta(ge=0, le=4_294_967_295)]
Limit = Annotated[int, Meta(ge=0, le=4_294_967_295)]
BigLimit = Annotated[int, Meta(ge=0, le=2**63 - 1)]


#: The schema's statement of a refusal the submit and schedule checks make: a text that ends
#: with a space is refused (the PAD SPACE collation would make "a" and "a " one identity).
NO_TRAILING_SPACE = {"pattern": "(^|[^ ])$"}


class TaskState(StrEnum):
    """States of a task (docs/api/tasks.md#states)."""

    WAITING = "WAITING"  # submitted, not offered yet (or back after a release/retry)
    LEASED = "LEASED"  # offered to a worker session, not started
    RUNNING = "RUNNING"  # start authorised; the worker runs the handler
    SUCCEEDED = "SUCCEEDED"  # terminal: completed with a result
    FAILED = "FAILED"  # terminal: failed (attempts exhausted, permanent, deadline)
    CANCELLED = "CANCELLED"  # terminal: cancelled before or while running
    NEEDS_REVIEW = "NEEDS_REVIEW"  # a running attempt was lost: an operator decides


class RetryPolicy(msgspec.Struct, forbid_unknown_fields=True, kw_only=True):
    """A queue's default retry policy, frozen into each task at submit."""

    max_attempts: Annotated[int, Meta(ge=1, le=1000)] = 3
    backoff_initial_ms: UInt32 = 1000
    backoff_max_ms: UInt32 = 300_000
    backoff_multiplier: Annotated[float, Meta(ge=1.0, le=100.0)] = 2.0


class RetryBounds(msgspec.Struct, forbid_unknown_fields=True, kw_only=True):
    """What a task's own retry policy (``TaskSubmit.retry``) may ask for in this queue: its
    ``backoff_initial_ms`` and ``backoff_max_ms`` within ``[min_delay_ms, max_delay_ms]``, its
    ``backoff_multiplier`` at most ``max_multiplier``. Absent (None) = no bound of that kind."""

    min_delay_ms: UInt32 | None = None
    max_delay_ms: UInt32 | None = None
    max_multiplier: Annotated[float, Meta(ge=1.0, le=100.0)] | None = None


class TaskRetry(msgspec.Struct, forbid_unknown_fields=True, kw_only=True):
    """A task's own backoff (``retry`` of a submit): what is given replaces the queue's
    default, what is absent keeps it; frozen into the task (pulse/retry_bounds.py)."""

    backoff_initial_ms: UInt32 | None = None
    backoff_max_ms: UInt32 | None = None
    backoff_multiplier: Annotated[float, Meta(ge=1.0, le=100.0)] | None = None


class QueuePut(msgspec.Struct, forbid_unknown_fields=True, kw_only=True):
    """``PUT /v1/namespaces/{ns}/queues/{queue}``: the whole configuration (absent = default)."""

    max_unfinished_tasks: BigLimit | None = None
    max_concurrency: Limit | None = None
    max_starts_per_second: Limit | None = None
    lease_ms: Annotated[int, Meta(ge=1000, le=86_400_000)] = 30_000
    retry: RetryPolicy | None = None
    retry_bounds: RetryBounds | None = None
    stuck_after_ms: Annotated[int, Meta(ge=1, le=2**63 - 1)] | None = None


class TaskSubmit(msgspec.Struct, forbid_unknown_fields=True, kw_only=True):
    """``POST /v1/namespaces/{ns}/tasks`` (and each item of a batch).

    ``payload`` is kept as the exact bytes sent (``msgspec.Raw``) and stored verbatim.
    Times are RFC 3339 strings with an offset, parsed by :func:`orbit.times.parse_time`.
    """

    queue: Name
    kind: Annotated[str, Meta(min_length=1, max_length=255, extra_json_schema=NO_TRAILING_SPACE)]
    pipeline_version: Annotated[str, Meta(max_length=64, extra_json_schema=NO_TRAILING_SPACE)] = ""
    dedup_key: (
        Annotated[str, Meta(min_length=1, max_length=255, extra_json_schema=NO_TRAILING_SPACE)]
        | None
    ) = None
    payload: msgspec.Raw = msgspec.field(default_factory=lambda: msgspec.Raw(b"null"))
    priority: Annotated[int, Meta(ge=0, le=9)] = 0
    delay_ms: Annotated[int, Meta(ge=0, le=10 * 365 * 86_400_000)] | None = None
    available_at: Time | None = None
    deadline_at: Time | None = None
    max_attempts: Annotated[int, Meta(ge=1, le=1000)] | None = None
    retry_safe: bool = False
    concurrency_key: Annotated[str, Meta(min_length=1, max_length=255)] | None = None
    #: Fair dispatch within the queue rotates across these (additive; an application's own
    #: end user or subject). None: the owner is the task's subject.
    fairness_key: Annotated[str, Meta(min_length=1, max_length=128)] | None = None
    #: This task's own backoff, within the queue's ``retry_bounds`` (additive).
    retry: TaskRetry | None = None


class BatchSubmit(msgspec.Struct, forbid_unknown_fields=True, kw_only=True):
    """``POST /v1/namespaces/{ns}/tasks:batch``: items are decoded one by one so an invalid
    item is reported (400) and skipped without failing the others."""

    tasks: Annotated[list[msgspec.Raw], Meta(max_length=1000)]


class CancelBulk(msgspec.Struct, forbid_unknown_fields=True, kw_only=True):
    """``POST /v1/namespaces/{ns}/tasks:cancel``: every filter is optional (none = all tasks
    of the namespace)."""

    owner_id: IdText | None = None
    queue: Name | None = None
    kind: Annotated[str, Meta(min_length=1, max_length=255)] | None = None


class ResolveAction(StrEnum):
    """What an operator decides for a NEEDS_REVIEW task."""

    RETRY = "retry"  # back to WAITING for another attempt
    SUCCEED = "succeed"  # SUCCEEDED with the given result
    FAIL = "fail"  # FAILED with the given error


class Resolve(msgspec.Struct, forbid_unknown_fields=True, kw_only=True):
    """``POST /v1/namespaces/{ns}/tasks/{id}/resolve``."""

    action: ResolveAction
    note: Annotated[str, Meta(min_length=1, max_length=2000)]
    #: JSON value of a ``succeed`` (kept byte-exact); absent or ``null`` = no result.
    result: msgspec.Raw | msgspec.UnsetType = msgspec.UNSET
    error: dict[str, object] | None = None


class TaskListFilters(msgspec.Struct, frozen=True, kw_only=True):
    """Filters of ``GET /v1/namespaces/{ns}/tasks`` (a cursor is bound to exactly these)."""

    queue: str | None = None
    state: str | None = None
    kind: str | None = None
    owner_id: str | None = None
    dedup_key: str | None = None
