"""Schedules as the HTTP API returns them, and the task template of a PUT.

Like :mod:`orbit_sdk.types`: every field except an id has a default and unknown fields are
ignored, so the server may add fields. The template's ``payload`` stays :class:`msgspec.Raw`
(the stored bytes); ``decode_payload()`` turns it into Python values.
"""

from __future__ import annotations

import builtins
import enum
from datetime import datetime
from typing import Any, TypeVar, overload

import msgspec
from msgspec import UNSET, Raw, UnsetType

from . import _json
from .types import Task
from .wire import NULL

__all__ = [
    "Backfill",
    "Occurrence",
    "OccurrenceOutcome",
    "Overlap",
    "Schedule",
    "ScheduleTask",
    "ScheduleTaskSpec",
    "Trigger",
]

T = TypeVar("T")


class OccurrenceOutcome(enum.StrEnum):
    """What happened at a fire time (``Occurrence.outcome`` compares equal to these)."""

    CREATED = "created"  # the task was created
    SKIPPED = "skipped"  # not fired (outside catch-up/grace, or paused); may cover a range


class Overlap(enum.StrEnum):
    """What a fire time does while the schedule's previous run is unfinished
    (``Schedule.overlap`` compares equal to these)."""

    ALLOW = "allow"  # fire anyway (the default)
    SKIP = "skip"  # record the fire time as skipped (reason "overlap")
    BUFFER_ONE = "buffer_one"  # hold one fire time back until the previous run ends
    CANCEL_PREVIOUS = "cancel_previous"  # cancel the previous run, then fire


class ScheduleTaskSpec(msgspec.Struct, kw_only=True):
    """The task template of a schedule version (``task`` of ``PUT .../schedules/{name}``).

    ``payload`` is any msgspec-encodable value, or :class:`msgspec.Raw` JSON bytes sent as
    given. Unset fields are not sent (the server's defaults apply). ``dedup_key`` is a
    template with ``{schedule}``, ``{fire_at}``, ``{fire_at_local}``, ``{version}``;
    ``deadline_ms`` is each task's deadline counted from its fire time.
    """

    kind: str
    payload: Any = None
    priority: int | UnsetType = UNSET
    pipeline_version: str | UnsetType = UNSET
    dedup_key: str | UnsetType | None = UNSET
    max_attempts: int | UnsetType | None = UNSET
    retry_safe: bool | UnsetType = UNSET
    deadline_ms: int | UnsetType | None = UNSET


class ScheduleTask(msgspec.Struct, kw_only=True):
    """The task template of a published version, as the server stored it."""

    kind: str = ""
    payload: Raw = NULL
    priority: int = 0
    pipeline_version: str = ""
    dedup_key: str | None = None
    max_attempts: int | None = None
    retry_safe: bool = False
    deadline_ms: int | None = None

    @overload
    def decode_payload(self) -> Any: ...
    @overload
    def decode_payload(self, type: builtins.type[T]) -> T: ...
    def decode_payload(self, type: Any = Any) -> Any:
        """The payload as Python values (or as ``type``)."""
        return _json.decode(self.payload, type)


class Schedule(msgspec.Struct, kw_only=True):
    """A schedule: identity, pause state, its current version's configuration, the next fire
    time and ``covered_until`` (exclusive: every fire time before it is decided).

    ``etag`` comes from the ``ETag`` header (pass it back as ``if_match``); ``created`` is
    True when a PUT created the schedule (HTTP 201).
    """

    id: str
    name: str = ""
    owner_id: str = ""
    revision: int = 0
    paused: bool = False
    control_revision: int = 0
    version: int = 0
    queue: str = ""
    cron: str | None = None
    every_ms: int | None = None
    timezone: str = "UTC"
    tzdata_version: str | None = None
    tzdata_current: str | None = None
    task: ScheduleTask = msgspec.field(default_factory=ScheduleTask)
    catchup_window_ms: int = 0
    grace_ms: int = 0
    start_at: datetime | None = None
    end_at: datetime | None = None
    overlap: str = "allow"
    """The overlap policy of the current version (:class:`Overlap`)."""
    published_at: datetime | None = None
    next_fire_at: datetime | None = None
    next_fire_at_local: str | None = None
    """The next fire time on the schedule's wall clock, ISO 8601 with its offset."""
    covered_until: datetime | None = None
    check_at: datetime | None = None
    last_task_id: str | None = None
    """The previous run: the task of the latest scheduled or triggered occurrence."""
    buffered_fire_at: datetime | None = None
    """A fire time ``buffer_one`` holds back until the previous run has finished."""
    created_at: datetime | None = None
    updated_at: datetime | None = None
    etag: str | None = None
    created: bool = False


class Occurrence(msgspec.Struct, kw_only=True):
    """One fire time of a schedule: the task it created, or a skipped range.

    A skipped row may stand for several fire times: ``skipped_count`` of them, up to
    ``covered_until`` (exclusive); ``reason`` says why (e.g. ``paused``). ``late`` marks a
    fire after the grace period that the catch-up window still allowed.
    """

    id: str = ""
    fire_at: datetime | None = None
    fire_at_local: str = ""
    version: int = 0
    task_id: str | None = None
    outcome: str = ""
    late: bool = False
    covered_until: datetime | None = None
    skipped_count: int | None = None
    reason: str | None = None
    origin: str = "schedule"
    """``schedule`` (the scheduler), ``trigger`` (fired by hand) or ``backfill``."""
    idempotency_key: str | None = None
    """The key of a trigger that carried one."""
    created_at: datetime | None = None


class Trigger(msgspec.Struct, kw_only=True):
    """The answer of :meth:`SchedulesAPI.trigger`: the occurrence and its task.

    ``replayed`` is True when the ``idempotency_key`` was used before on this schedule (the
    occurrence it created then is returned, nothing new is created)."""

    occurrence: Occurrence = msgspec.field(default_factory=Occurrence)
    task: Task | None = None
    replayed: bool = False


class Backfill(msgspec.Struct, kw_only=True, rename={"from_": "from"}):
    """The answer of :meth:`SchedulesAPI.backfill`: ``count`` tasks created for the fire
    times of ``[from_, to)`` that had not run; ``already_occurred`` were skipped (they had
    run already). ``to`` is the effective end (at most the schedule's ``covered_until``)."""

    count: int = 0
    already_occurred: int = 0
    fire_times: int = 0
    from_: datetime | None = None
    to: datetime | None = None
