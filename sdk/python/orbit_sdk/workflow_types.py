"""Workflow definitions, instances, their history and signals, as the HTTP API returns them.

Business JSON (``input``, ``output``, step outputs, activation results, signal payloads,
a version's ``definition``) stays :class:`msgspec.Raw`: the server's exact bytes, numbers
with the digits they were sent with. The ``decode_*`` helpers turn it into Python values,
optionally into a given type. Unknown fields are ignored; every field except an id has a
default.
"""

from __future__ import annotations

import builtins
import enum
from datetime import datetime
from typing import Any, TypeVar, overload

import msgspec
from msgspec import Raw

from . import _json
from .wire import NULL

__all__ = [
    "History",
    "HistoryEntry",
    "HistorySignal",
    "Instance",
    "InstanceState",
    "Signal",
    "Step",
    "Transition",
    "WorkflowInfo",
    "WorkflowSummary",
    "WorkflowVersion",
]

T = TypeVar("T")


def _decode(raw: Raw, type: Any) -> Any:
    return _json.decode(raw, type)


class InstanceState(enum.StrEnum):
    """Instance states (``Instance.state`` compares equal to these); ``paused`` is separate."""

    RUNNING = "RUNNING"  # started, not finished (possibly paused)
    SUCCEEDED = "SUCCEEDED"  # terminal: reached succeed (or the end); ``output`` is set
    FAILED = "FAILED"  # terminal: a fail step, an uncaught failure, timeout; ``error`` is set
    CANCELLED = "CANCELLED"  # terminal: cancelled by a client; its tasks were cancelled

    @property
    def is_terminal(self) -> bool:
        """True for SUCCEEDED, FAILED and CANCELLED."""
        return self is not InstanceState.RUNNING


class WorkflowVersion(msgspec.Struct, kw_only=True):
    """One immutable version of a workflow definition.

    ``definition`` (the exact published JSON) is only filled by ``workflows.version()``.
    In a publish answer, ``created`` is True for a new version (HTTP 201) and ``unchanged``
    True when the definition equalled the latest version (HTTP 200, nothing created).
    """

    name: str = ""
    workflow_id: str = ""
    version: int = 0
    digest: str = ""
    step_count: int = 0
    language_version: int = 0
    created_at: datetime | None = None
    definition: Raw = NULL
    unchanged: bool = False
    created: bool = False

    @overload
    def decode_definition(self) -> Any: ...
    @overload
    def decode_definition(self, type: builtins.type[T]) -> T: ...
    def decode_definition(self, type: Any = Any) -> Any:
        """The definition as Python values (None unless read with ``workflows.version()``)."""
        return _decode(self.definition, type)


class WorkflowSummary(msgspec.Struct, kw_only=True):
    """A workflow in the namespace's list."""

    id: str = ""
    name: str = ""
    owner_id: str = ""
    latest_version: int = 0
    created_at: datetime | None = None
    updated_at: datetime | None = None


class WorkflowInfo(WorkflowSummary, kw_only=True):
    """A workflow and one page of its versions, newest first (``next_cursor`` pages on)."""

    versions: list[WorkflowVersion] = msgspec.field(default_factory=list)
    next_cursor: str | None = None


class Step(msgspec.Struct, kw_only=True):
    """A step an instance entered: its state, the transition taken and its output."""

    step: str = ""
    type: str = ""
    state: str = ""
    next_step: str | None = None
    activations: int = 0
    output: Raw = NULL
    error: Any = None
    seq: int = 0
    started_at: datetime | None = None
    finished_at: datetime | None = None

    @overload
    def decode_output(self) -> Any: ...
    @overload
    def decode_output(self, type: builtins.type[T]) -> T: ...
    def decode_output(self, type: Any = Any) -> Any:
        """The step's output as Python values (or as ``type``)."""
        return _decode(self.output, type)


class Instance(msgspec.Struct, kw_only=True):
    """A workflow instance (a run). ``steps`` is filled by ``get`` and by control calls.

    ``deduplicated`` is True when ``start`` found an instance with the same business key;
    ``created`` when ``start`` made a new one (HTTP 201). ``etag`` (``"<control_revision>"``)
    comes from the ``ETag`` header of reads and control calls; pass it as ``if_match``.
    """

    id: str
    workflow: str = ""
    workflow_id: str = ""
    version: int = 0
    owner_id: str = ""
    business_key: str | None = None
    state: str = ""
    paused: bool = False
    control_revision: int = 0
    revision: int = 0
    input: Raw = NULL
    output: Raw = NULL
    error: Any = None
    created_at: datetime | None = None
    updated_at: datetime | None = None
    finished_at: datetime | None = None
    steps: list[Step] = msgspec.field(default_factory=list)
    deduplicated: bool = False
    etag: str | None = None
    created: bool = False

    @property
    def is_terminal(self) -> bool:
        """True once the instance is SUCCEEDED, FAILED or CANCELLED."""
        return self.state in ("SUCCEEDED", "FAILED", "CANCELLED")

    @overload
    def decode_input(self) -> Any: ...
    @overload
    def decode_input(self, type: builtins.type[T]) -> T: ...
    def decode_input(self, type: Any = Any) -> Any:
        """The input as Python values (or as ``type``)."""
        return _decode(self.input, type)

    @overload
    def decode_output(self) -> Any: ...
    @overload
    def decode_output(self, type: builtins.type[T]) -> T: ...
    def decode_output(self, type: Any = Any) -> Any:
        """The output as Python values (or as ``type``); None until SUCCEEDED."""
        return _decode(self.output, type)


class Signal(msgspec.Struct, kw_only=True):
    """A signal as the server accepted it. ``duplicate`` is True when the same ``signal_id``
    had been accepted before (HTTP 200): the answer is the first one, unchanged."""

    id: str = ""
    instance_id: str = ""
    signal_id: str = ""
    name: str = ""
    correlation_key: str | None = None
    payload: Raw = NULL
    received_at: datetime | None = None
    duplicate: bool = False

    @overload
    def decode_payload(self) -> Any: ...
    @overload
    def decode_payload(self, type: builtins.type[T]) -> T: ...
    def decode_payload(self, type: Any = Any) -> Any:
        """The payload as Python values (or as ``type``)."""
        return _decode(self.payload, type)


class HistoryEntry(msgspec.Struct, kw_only=True):
    """One history entry, ordered by ``seq``: ``entry`` is ``step``, ``activation`` or
    ``wait``; the fields that do not apply to the kind stay at their defaults."""

    entry: str = ""
    seq: int = 0
    step: str = ""
    at: datetime | None = None
    state: str = ""
    type: str | None = None
    kind: str | None = None
    id: str | None = None
    next_step: str | None = None
    activation_no: int | None = None
    task_id: str | None = None
    result: Raw = NULL
    output: Raw = NULL
    error: Any = None
    condition_met: bool | None = None
    signal: str | None = None
    correlation_key: str | None = None
    due_at: datetime | None = None
    signal_row_id: str | None = None
    finished_at: datetime | None = None

    @overload
    def decode_result(self) -> Any: ...
    @overload
    def decode_result(self, type: builtins.type[T]) -> T: ...
    def decode_result(self, type: Any = Any) -> Any:
        """An activation's task result as Python values (or as ``type``)."""
        return _decode(self.result, type)

    @overload
    def decode_output(self) -> Any: ...
    @overload
    def decode_output(self, type: builtins.type[T]) -> T: ...
    def decode_output(self, type: Any = Any) -> Any:
        """A step's output as Python values (or as ``type``)."""
        return _decode(self.output, type)


class Transition(msgspec.Struct, kw_only=True):
    """A step finished with ``outcome``; ``to`` is the next step (None: end of a sequence)."""

    step: str = ""
    outcome: str = ""
    to: str | None = None
    at: datetime | None = None


class HistorySignal(msgspec.Struct, kw_only=True):
    """A signal sent to the instance and, once matched, the wait that took it."""

    id: str = ""
    signal_id: str = ""
    name: str = ""
    correlation_key: str | None = None
    payload: Raw = NULL
    received_at: datetime | None = None
    matched_wait_id: str | None = None
    matched_at: datetime | None = None

    @overload
    def decode_payload(self) -> Any: ...
    @overload
    def decode_payload(self, type: builtins.type[T]) -> T: ...
    def decode_payload(self, type: Any = Any) -> Any:
        """The payload as Python values (or as ``type``)."""
        return _decode(self.payload, type)


class History(msgspec.Struct, kw_only=True):
    """One page of an instance's history: ``items`` (paged by ``seq``) and, on every page,
    the instance's ``transitions`` and ``signals`` in order."""

    instance_id: str = ""
    state: str = ""
    items: list[HistoryEntry] = msgspec.field(default_factory=list)
    transitions: list[Transition] = msgspec.field(default_factory=list)
    signals: list[HistorySignal] = msgspec.field(default_factory=list)
    next_cursor: str | None = None
