"""Pulse's errors. Each subclasses an :mod:`orbit.errors` class, so code and HTTP status follow.

PulseError (orbit.errors.OrbitError)
 ├── QueueNotFound          404 not_found        (absent or another namespace's: same body)
 ├── TaskNotFound           404 not_found
 ├── AttemptNotFound        404 not_found
 ├── TaskStateConflict      409 conflict         (``state`` = the task's current state)
 ├── QueueQuotaExceeded     429 quota_exceeded   (``scope`` = queue | application; Retry-After)
 ├── CursorMismatch         400 invalid_request  (a list cursor used with other filters)
 └── SessionGone            401 unauthenticated  (the worker session expired or was closed)

The worker side adds its own classes below these (sessions, attempts, stale tokens).
"""

from __future__ import annotations

from typing import Any

from orbit.errors import (
    Conflict,
    InvalidRequest,
    NotFound,
    OrbitError,
    QuotaExceeded,
    Unauthenticated,
)


class PulseError(OrbitError):
    """Base of every Pulse error."""


class QueueNotFound(NotFound, PulseError):
    """The queue does not exist in this namespace (or the caller may not see it)."""

    def __init__(self) -> None:
        super().__init__("queue")


class TaskNotFound(NotFound, PulseError):
    """The task does not exist in this namespace (or the caller may not see it)."""

    def __init__(self) -> None:
        super().__init__("task")


class AttemptNotFound(NotFound, PulseError):
    """The attempt does not exist in this namespace."""

    def __init__(self) -> None:
        super().__init__("attempt")


class TaskStateConflict(Conflict, PulseError):
    """The operation is not allowed in the task's current state (e.g. cancel a SUCCEEDED task)."""

    def __init__(self, message: str, state: str, **details: Any) -> None:
        super().__init__(message, kind="task_state", state=state, **details)
        self.state = state


class QueueQuotaExceeded(QuotaExceeded, PulseError):
    """Admitting the task would exceed ``max_unfinished_tasks`` of the queue or application."""

    def __init__(self, scope: str, limit: int, retry_after: int = 1) -> None:
        super().__init__(
            f"{scope} max_unfinished_tasks ({limit}) reached",
            retry_after=retry_after,
            scope=scope,
            limit=limit,
        )
        self.scope = scope
        self.limit = limit


class CursorMismatch(InvalidRequest, PulseError):
    """A list cursor was produced for other filters (or is malformed)."""

    def __init__(self, message: str = "cursor does not match these filters") -> None:
        super().__init__(message, field="cursor")


class SessionGone(Unauthenticated, PulseError):
    """The worker session is no longer ACTIVE (expired or closed), or its credential or
    application no longer allows it (``credential`` true): a call on it is answered 401 and
    its stream ends (close 4401)."""

    def __init__(self, message: str = "", *, credential: bool = False) -> None:
        default = "the session credential no longer allows it" if credential else ""
        super().__init__(message or default or "the session expired")
        self.credential = credential
