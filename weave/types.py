"""Weave's stored rows, state enums and wire types (msgspec Structs).

Rows are what store modules return (ids bytes, times naive UTC). ``*Out`` types are response
bodies; request bodies forbid unknown fields so a typo never silently does nothing.
"""

from __future__ import annotations

from datetime import datetime
from enum import StrEnum
from typing import Annotated, Any

import msgspec
from msgspec import Meta

from pulse.types import NO_TRAILING_SPACE


class InstanceState(StrEnum):
    """weave_instances.state (the paused flag is separate)."""

    RUNNING = "RUNNING"  # started, not finished (possibly paused)
    SUCCEEDED = "SUCCEEDED"  # reached succeed or the end of the top level; output set
    FAILED = "FAILED"  # a fail step, an uncaught task failure, timeout or exhaustion; error set
    CANCELLED = "CANCELLED"  # cancelled by a client; running tasks were cancelled


class StepState(StrEnum):
    """weave_steps.state."""

    RUNNING = "RUNNING"  # entered, waiting for its activation, wait or branches
    SUCCEEDED = "SUCCEEDED"  # ended normally
    TIMED_OUT = "TIMED_OUT"  # wait_signal timeout, or poll exhausted
    FAILED = "FAILED"  # the task failed (even when on_failure routed onwards), or a fail step
    CANCELLED = "CANCELLED"  # the instance was cancelled or a sibling branch failed


class ActivationKind(StrEnum):
    """weave_activations.kind."""

    TASK = "task"  # one Pulse task of a task step
    POLL_ROUND = "poll_round"  # one Pulse task of a poll round
    TIMER = "timer"  # a sleep
    SIGNAL = "signal"  # a signal wait


class WaitKind(StrEnum):
    """weave_waits.kind."""

    SIGNAL = "signal"  # waits for a named signal (due_at = timeout, optional)
    SLEEP = "sleep"  # a sleep step's timer
    POLL_INTERVAL = "poll_interval"  # the delay before the next poll round
    POLL_DEADLINE = "poll_deadline"  # the poll step's deadline


class WaitState(StrEnum):
    """weave_waits.state."""

    OPEN = "OPEN"  # waiting
    MATCHED = "MATCHED"  # a signal satisfied it
    FIRED = "FIRED"  # its timer or timeout fired
    CANCELLED = "CANCELLED"  # the step ended another way or the instance ended


class InboxKind(StrEnum):
    """weave_inbox.kind."""

    TASK_FINISHED = "task_finished"  # a Pulse task of an activation reached a terminal state
    TIMER_FIRED = "timer_fired"  # a wait's due_at passed
    SIGNAL_ARRIVED = "signal_arrived"  # a signal was accepted for the instance


# ----------------------------------------------------------------------------- stored rows


class DefinitionRow(msgspec.Struct, frozen=True):
    """A weave_definitions row."""

    namespace_id: bytes
    id: bytes
    name: str
    owner_id: bytes
    latest_version: int
    revision: int
    created_at: datetime
    updated_at: datetime


class VersionRow(msgspec.Struct, frozen=True):
    """A weave_definition_versions row (``definition`` is the exact published JSON text)."""

    namespace_id: bytes
    id: bytes
    definition_id: bytes
    version: int
    definition: str
    definition_digest: bytes
    language_version: int
    step_count: int
    published_by: bytes | None
    created_at: datetime


# ----------------------------------------------------------------------------- wire types


class PublishBody(msgspec.Struct, forbid_unknown_fields=True):
    """``POST .../workflows/{name}/versions`` body. ``definition`` is kept byte-exact."""

    definition: msgspec.Raw


class VersionOut(msgspec.Struct, frozen=True):
    """One version. ``definition`` (the exact published text) only when reading one version;
    ``unchanged`` only in the publish response (true: identical to the latest version, which
    is returned with 200 instead of creating a new one)."""

    name: str
    workflow_id: str
    version: int
    digest: str
    step_count: int
    language_version: int
    created_at: str
    definition: msgspec.Raw | msgspec.UnsetType = msgspec.UNSET
    unchanged: bool | msgspec.UnsetType = msgspec.UNSET


class WorkflowOut(msgspec.Struct, frozen=True):
    """``GET .../workflows/{name}``: the workflow and its versions, newest first."""

    id: str
    name: str
    owner_id: str
    latest_version: int
    created_at: str
    updated_at: str
    versions: list[VersionOut]
    next_cursor: str | None


class WorkflowSummary(msgspec.Struct, frozen=True):
    """An item of ``GET .../workflows``."""

    id: str
    name: str
    owner_id: str
    latest_version: int
    created_at: str
    updated_at: str


class WorkflowPage(msgspec.Struct, frozen=True):
    items: list[WorkflowSummary]
    next_cursor: str | None


# ============================================================================= the engine
# Rows of the engine's tables (weave/store/*.py return them) and the instance wire types.
# Rows are mutable: the engine updates them in memory under the instance lock and writes
# them back with guarded UPDATEs.


class PollState(StrEnum):
    """weave_poll_states.state."""

    ACTIVE = "ACTIVE"  # rounds are running or the next one is scheduled
    SATISFIED = "SATISFIED"  # a round's result met the condition
    EXHAUSTED = "EXHAUSTED"  # max_rounds, deadline or a failed round
    CANCELLED = "CANCELLED"  # the instance ended another way


class InboxOutcome(StrEnum):
    """weave_inbox.outcome."""

    APPLIED = "applied"  # the event advanced the instance (or a signal was kept for later)
    IGNORED = "ignored"  # stale (its activation or wait had ended) or the instance had ended
    DEFERRED = "deferred"  # the instance was paused: recorded as a pending advance


class InstanceRow(msgspec.Struct, kw_only=True):
    """A weave_instances row (``input``/``output`` exact JSON text, ``error`` JSON text)."""

    namespace_id: bytes
    id: bytes
    owner_id: bytes
    definition_id: bytes
    definition_name: str
    version: int
    business_key: str | None
    input: str
    output: str | None
    error: str | None
    state: str
    paused: int
    control_revision: int
    history_seq: int
    created_by: bytes | None
    revision: int
    created_at: datetime
    updated_at: datetime
    finished_at: datetime | None


class StepRow(msgspec.Struct, kw_only=True):
    """A weave_steps row."""

    namespace_id: bytes
    id: bytes
    instance_id: bytes
    step_path: str
    step_type: str
    state: str
    next_step: str | None
    activations: int
    output: str | None
    error: str | None
    seq: int
    started_at: datetime
    finished_at: datetime | None
    revision: int


class ActivationRow(msgspec.Struct, kw_only=True):
    """A weave_activations row."""

    namespace_id: bytes
    id: bytes
    instance_id: bytes
    step_path: str
    activation_no: int
    kind: str
    task_id: bytes | None
    state: str
    result: str | None
    error: str | None
    condition_met: int | None
    seq: int
    started_at: datetime
    finished_at: datetime | None
    revision: int


class WaitRow(msgspec.Struct, kw_only=True):
    """A weave_waits row."""

    namespace_id: bytes
    id: bytes
    instance_id: bytes
    step_path: str
    activation_id: bytes | None
    kind: str
    signal_name: str | None
    correlation_key: str | None
    due_at: datetime | None
    state: str
    signal_row_id: bytes | None
    notified_at: datetime | None
    seq: int
    created_at: datetime
    resolved_at: datetime | None
    revision: int


class SignalRow(msgspec.Struct, kw_only=True):
    """A weave_signals row (``payload`` exact JSON text)."""

    namespace_id: bytes
    id: bytes
    instance_id: bytes
    signal_id: str
    name: str
    correlation_key: str | None
    payload: str
    request_digest: bytes
    matched_wait_id: bytes | None
    matched_at: datetime | None
    sent_by: bytes | None
    received_at: datetime
    revision: int


class PollStateRow(msgspec.Struct, kw_only=True):
    """A weave_poll_states row."""

    namespace_id: bytes
    id: bytes
    instance_id: bytes
    step_path: str
    state: str
    rounds_started: int
    rounds_completed: int
    max_rounds: int
    max_attempts: int
    interval_ms: int
    deadline_at: datetime | None
    next_round_at: datetime | None
    current_activation_id: bytes | None
    last_result: str | None
    exhausted_reason: str | None
    started_at: datetime
    finished_at: datetime | None
    revision: int


class InboxRow(msgspec.Struct, kw_only=True):
    """A weave_inbox row (``payload`` business JSON text, ``data`` metadata JSON text)."""

    namespace_id: bytes
    id: bytes
    instance_id: bytes
    kind: str
    source_event_id: bytes
    step_path: str | None
    payload: str | None
    data: str | None
    available_at: datetime
    attempts: int
    last_error: str | None
    processed_at: datetime | None
    outcome: str | None
    created_at: datetime
    revision: int


class PendingRow(msgspec.Struct, kw_only=True):
    """A weave_pending_advances row."""

    namespace_id: bytes
    id: bytes
    instance_id: bytes
    inbox_id: bytes | None
    reason: str
    checkpoint: str | None
    control_revision: int
    state: str
    created_at: datetime
    resolved_at: datetime | None
    revision: int


# ----------------------------------------------------------------------------- instance wire


class StartBody(msgspec.Struct, forbid_unknown_fields=True, kw_only=True):
    """``POST .../workflows/{name}/instances``. ``input`` is kept byte-exact (default null);
    ``version`` defaults to the latest; ``business_key`` makes the start idempotent."""

    input: msgspec.Raw = msgspec.field(default_factory=lambda: msgspec.Raw(b"null"))
    version: Annotated[int, Meta(ge=1, le=4_294_967_295)] | None = None
    business_key: (
        Annotated[str, Meta(min_length=1, max_length=255, extra_json_schema=NO_TRAILING_SPACE)]
        | None
    ) = None


class SignalBody(msgspec.Struct, forbid_unknown_fields=True, kw_only=True):
    """``POST .../instances/{id}/signals/{signal}``. ``payload`` is kept byte-exact."""

    signal_id: Annotated[str, Meta(min_length=1, max_length=128, pattern=r"^[ -~]+$")]
    payload: msgspec.Raw = msgspec.field(default_factory=lambda: msgspec.Raw(b"null"))
    correlation_key: Annotated[str, Meta(min_length=1, max_length=255)] | None = None


class StepOut(msgspec.Struct, frozen=True, kw_only=True):
    """One step of an instance (``GET .../instances/{id}``)."""

    step: str
    type: str
    state: str
    next_step: str | None
    activations: int
    output: msgspec.Raw | None
    error: Any
    seq: int
    started_at: str
    finished_at: str | None


class InstanceOut(msgspec.Struct, frozen=True, kw_only=True):
    """An instance. ``input``/``output`` are the exact JSON texts; ``deduplicated`` only in a
    start response (true: an instance with that business key existed)."""

    id: str
    workflow: str
    workflow_id: str
    version: int
    owner_id: str
    business_key: str | None
    state: str
    paused: bool
    control_revision: int
    revision: int
    input: msgspec.Raw
    output: msgspec.Raw | None
    error: Any
    created_at: str
    updated_at: str
    finished_at: str | None
    steps: list[StepOut] | msgspec.UnsetType = msgspec.UNSET
    deduplicated: bool | msgspec.UnsetType = msgspec.UNSET


class InstancePage(msgspec.Struct, frozen=True):
    items: list[InstanceOut]
    next_cursor: str | None


class SignalOut(msgspec.Struct, frozen=True, kw_only=True):
    """A signal as accepted. Never changes, so a duplicate ``signal_id`` gets the same body."""

    id: str
    instance_id: str
    signal_id: str
    name: str
    correlation_key: str | None
    payload: msgspec.Raw
    received_at: str


class HistoryEntry(msgspec.Struct, frozen=True, kw_only=True, omit_defaults=True):
    """One history entry, ordered by ``seq`` (steps, activations and waits share it).

    ``entry`` is ``step``, ``activation`` or ``wait``; the other fields are those of the kind.
    """

    entry: str
    seq: int
    step: str
    at: str
    state: str
    type: str | None = None
    kind: str | None = None
    id: str | None = None
    next_step: str | None = None
    activation_no: int | None = None
    task_id: str | None = None
    result: msgspec.Raw | None = None
    output: msgspec.Raw | None = None
    error: Any = None
    condition_met: bool | None = None
    signal: str | None = None
    correlation_key: str | None = None
    due_at: str | None = None
    signal_row_id: str | None = None
    finished_at: str | None = None


class TransitionOut(msgspec.Struct, frozen=True, kw_only=True):
    """A step left: ``to`` is the next step, or None at the end of a sequence or instance."""

    step: str
    outcome: str
    to: str | None
    at: str


class HistorySignal(msgspec.Struct, frozen=True, kw_only=True):
    id: str
    signal_id: str
    name: str
    correlation_key: str | None
    payload: msgspec.Raw
    received_at: str
    matched_wait_id: str | None
    matched_at: str | None


class HistoryOut(msgspec.Struct, frozen=True, kw_only=True):
    """``GET .../instances/{id}/history``: ``items`` (paged by ``seq``), and on every page the
    instance's transitions and signals in order."""

    instance_id: str
    state: str
    items: list[HistoryEntry]
    transitions: list[TransitionOut]
    signals: list[HistorySignal]
    next_cursor: str | None
