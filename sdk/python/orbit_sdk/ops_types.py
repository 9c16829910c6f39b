"""Operator views as the HTTP API returns them: worker sessions and audit events.

Like :mod:`orbit_sdk.types`: every field except an id has a default and unknown fields are
ignored, so the server may add fields.
"""

from __future__ import annotations

from datetime import datetime
from typing import Any

import msgspec

__all__ = [
    "AuditActor",
    "AuditEvent",
    "HeldAttempt",
    "Retention",
    "WorkerInstance",
    "WorkerPage",
    "WorkerSession",
]


class WorkerInstance(msgspec.Struct, kw_only=True):
    """The worker process a session belongs to."""

    id: str = ""
    host: str | None = None
    pid: int | None = None
    sdk: str | None = None
    """SDK name and version, as the worker reported it."""
    created_at: datetime | None = None
    last_seen_at: datetime | None = None


class HeldAttempt(msgspec.Struct, kw_only=True):
    """An attempt a session holds: offered (not started yet) or running."""

    id: str = ""
    task_id: str = ""
    generation: int = 0
    state: str = ""
    offered_at: datetime | None = None
    started_at: datetime | None = None
    lease_expires_at: datetime | None = None


class WorkerSession(msgspec.Struct, kw_only=True):
    """A worker session in the workers view.

    ``in_flight`` (offered + running attempts) is exact; ``attempts`` shows at most 20 of
    them. ``heartbeat_age_ms`` is measured by the database clock; ``node`` is the server
    node holding the session's stream (None while none is attached). ``live`` is False once
    the session is closed, expired, or past its expiry and waiting for recovery.
    """

    id: str
    state: str = ""
    live: bool = False
    instance: WorkerInstance = msgspec.field(default_factory=WorkerInstance)
    sdk: str | None = None
    application_id: str = ""
    credential_id: str = ""
    queues: list[str] = msgspec.field(default_factory=list)
    capacity: int = 0
    concurrency_keys: bool = False
    in_flight: int = 0
    offered: int = 0
    running: int = 0
    free: int = 0
    attempts: list[HeldAttempt] = msgspec.field(default_factory=list)
    node: str | None = None
    connected: bool = False
    heartbeat_ms: int = 0
    lease_ms: int = 0
    last_heartbeat_at: datetime | None = None
    heartbeat_age_ms: int = 0
    expires_at: datetime | None = None
    created_at: datetime | None = None
    closed_at: datetime | None = None


class WorkerPage(msgspec.Struct, kw_only=True):
    """One page of :meth:`WorkersAPI.list`."""

    sessions: list[WorkerSession] = msgspec.field(default_factory=list)
    next_cursor: str | None = None


class AuditActor(msgspec.Struct, kw_only=True):
    """Who acted: the credential (and its name) and its application; both None for the
    ``orbit admin`` CLI acting directly on the database."""

    credential_id: str | None = None
    credential_name: str | None = None
    application_id: str | None = None


class AuditEvent(msgspec.Struct, kw_only=True):
    """One audit event: who did what to which resource, with what outcome, when."""

    id: str
    created_at: datetime | None = None
    action: str = ""
    outcome: str = ""
    """``ok``, ``denied``, ``conflict`` or ``error``."""
    status_code: int = 0
    resource_kind: str = ""
    resource_id: str | None = None
    actor: AuditActor = msgspec.field(default_factory=AuditActor)
    request_id: str | None = None
    details: Any = None


class Retention(msgspec.Struct, kw_only=True):
    """A namespace's retention windows (None: that history is kept forever; for
    ``idempotency_hours``: the server default) and the purge's progress."""

    finished_tasks_days: int | None = None
    events_days: int | None = None
    audit_days: int | None = None
    idempotency_hours: int | None = None
    revision: int = 1
    purged_total: int = 0
    last_run_at: datetime | None = None
