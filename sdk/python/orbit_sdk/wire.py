"""Wire types of the worker protocol (session creation and the WebSocket stream).

Frames are JSON text frames tagged by ``"type"``. Each direction is one tagged union with
one decoder: :data:`SERVER_DECODER` reads server→worker frames, :data:`WORKER_DECODER`
reads worker→server frames (used by test doubles and contract tests). Business JSON
(``payload``, ``result``) is carried as :class:`msgspec.Raw`, so its bytes are never
re-encoded: a payload arrives in the handler exactly as the producer sent it.

Schema evolution: every field of a server→worker frame except its identifying ids has a
default, and unknown fields are ignored, so the server may add fields freely. Optional
worker→server fields use ``UNSET`` and are omitted from the JSON when not set.

These types belong to the SDK; the server keeps its own models. A contract test proves
both encode and decode the same JSON.
"""

from __future__ import annotations

from datetime import datetime
from typing import Any, Literal

import msgspec
from msgspec import UNSET, Raw, UnsetType

from . import _json

__all__ = [
    "NULL",
    "SERVER_DECODER",
    "WORKER_DECODER",
    "AttemptLease",
    "Cancel",
    "Cancelled",
    "Complete",
    "Effect",
    "EffectState",
    "ErrorInfo",
    "Fail",
    "Heartbeat",
    "HeartbeatOk",
    "InstanceInfo",
    "Offer",
    "OfferedTask",
    "PollResponse",
    "Receipt",
    "ServerError",
    "ServerFrame",
    "SessionClosed",
    "SessionCreate",
    "SessionCreated",
    "Start",
    "StartDenied",
    "Started",
    "WorkerFrame",
    "encode",
]

NULL = Raw(b"null")
"""The JSON ``null`` as a Raw value (a handler that returns None reports this)."""

_REDACTED = "[redacted]"


class _Frame(msgspec.Struct, tag_field="type", kw_only=True):
    """Base of every stream frame; the subclass tag is the ``type`` field."""


# ---------------------------------------------------------------- session (HTTP)


class InstanceInfo(msgspec.Struct, kw_only=True):
    """The worker process: ``id`` is kept across sessions when the worker reconnects."""

    host: str
    pid: int
    sdk: str
    id: str | UnsetType = UNSET


class SessionCreate(msgspec.Struct, kw_only=True):
    """Body of ``POST /v1/namespaces/{ns}/workers/sessions`` (API key, ``workers.connect``)."""

    instance: InstanceInfo
    queues: list[str]
    max_concurrency: int
    concurrency_keys: bool = False


class SessionCreated(msgspec.Struct, kw_only=True):
    """201 answer to :class:`SessionCreate`. ``session_token`` is a secret (never logged)."""

    session_id: str
    session_token: str
    instance_id: str = ""
    heartbeat_ms: int = 10_000
    lease_ms: int = 30_000
    #: Queues with keyed tasks waiting, when this session does not accept keyed tasks.
    keyed_waiting: list[str] = msgspec.field(default_factory=list)

    def __repr__(self) -> str:
        return (
            f"SessionCreated(session_id={self.session_id!r}, session_token={_REDACTED!r}, "
            f"instance_id={self.instance_id!r}, heartbeat_ms={self.heartbeat_ms}, "
            f"lease_ms={self.lease_ms})"
        )


class SessionClosed(msgspec.Struct, kw_only=True):
    """200 answer to ``DELETE …/workers/sessions/{sid}`` (the worker ends its session)."""

    session_id: str
    state: str
    closed_at: str | None = None
    released_offers: int = 0
    lost_attempts: int = 0


# ---------------------------------------------------------------- server → worker


class OfferedTask(msgspec.Struct, kw_only=True):
    """The task inside an offer. ``payload`` is the exact JSON the producer submitted."""

    id: str
    queue: str = ""
    kind: str = ""
    payload: Raw = NULL
    priority: int = 0
    deadline_at: datetime | None = None
    generation: int = 0
    concurrency_key: str | None = None


class Offer(_Frame, tag="offer"):
    """The server leased an attempt to this session; the worker answers with ``start``."""

    attempt_id: str
    task: OfferedTask
    lease_expires_at: datetime | None = None


class Started(_Frame, tag="started"):
    """``start`` was authorised; ``execution_token`` fences every later report (secret)."""

    attempt_id: str
    execution_token: str
    ref_msg_id: str | None = None
    generation: int = 0
    concurrency_token: int | None = None
    lease_expires_at: datetime | None = None

    def __repr__(self) -> str:
        return (
            f"Started(attempt_id={self.attempt_id!r}, execution_token={_REDACTED!r}, "
            f"ref_msg_id={self.ref_msg_id!r}, generation={self.generation}, "
            f"concurrency_token={self.concurrency_token!r}, "
            f"lease_expires_at={self.lease_expires_at!r})"
        )


class StartDenied(_Frame, tag="start_denied"):
    """``start`` was refused (gate closed, deadline passed, lease lost...)."""

    attempt_id: str
    ref_msg_id: str | None = None
    reason: str = ""


class AttemptLease(msgspec.Struct, kw_only=True):
    """Per-attempt answer inside ``heartbeat_ok``; ``ok`` False means the lease is gone."""

    attempt_id: str
    ok: bool = False
    lease_expires_at: datetime | None = None
    cancel_requested: bool = False


class HeartbeatOk(_Frame, tag="heartbeat_ok"):
    """Answer to ``heartbeat``: the session is alive; one entry per listed attempt."""

    ref_msg_id: str | None = None
    attempts: list[AttemptLease] = msgspec.field(default_factory=list)
    session_expires_at: datetime | None = None
    #: For a worker that does not accept keyed tasks, now and then: its queues where keyed
    #: tasks wait (absent in most answers).
    keyed_waiting: list[str] | msgspec.UnsetType = msgspec.UNSET


class Receipt(_Frame, tag="receipt"):
    """A report was recorded. A re-sent identical report gets the same ``receipt_id``
    with ``outcome`` ``"replayed"``."""

    attempt_id: str
    ref_msg_id: str | None = None
    receipt_id: str = ""
    outcome: str = ""
    task_state: str = ""


class Cancel(_Frame, tag="cancel"):
    """The task was cancelled: stop the handler and answer ``cancelled`` (or ``complete``)."""

    attempt_id: str
    reason: str = ""


class EffectState(_Frame, tag="effect_state"):
    """Answer to ``effect``: ``state`` is ``new``, ``committed`` (with ``result``) or
    ``uncertain``. Unknown states must be treated as ``uncertain``."""

    key: str
    ref_msg_id: str | None = None
    state: str = "uncertain"
    result: Raw = NULL


class ServerError(_Frame, tag="error"):
    """A request was rejected; ``code`` is an error code (``stale_token``, ...)."""

    code: str
    message: str = ""
    ref_msg_id: str | None = None
    details: dict[str, Any] | None = None


ServerFrame = (
    Offer | Started | StartDenied | HeartbeatOk | Receipt | Cancel | EffectState | ServerError
)
"""Every frame the server sends to a worker."""


class PollResponse(msgspec.Struct, kw_only=True):
    """Answer of the HTTP fallback's long poll (``POST .../sessions/{sid}/poll``)."""

    offers: list[Offer] = msgspec.field(default_factory=list)


# ---------------------------------------------------------------- worker → server


class ErrorInfo(msgspec.Struct, kw_only=True):
    """The ``error`` object of a ``fail`` report."""

    type: str
    message: str
    details: dict[str, Any] | UnsetType = UNSET


class Start(_Frame, tag="start"):
    """Ask to start an offered attempt."""

    msg_id: str
    attempt_id: str


class Heartbeat(_Frame, tag="heartbeat"):
    """Extend the leases of ``attempt_ids``; also keeps the session alive (may be empty).
    ``progress``: a JSON object per listed attempt whose handler reported progress (left
    out of the frame when there is none)."""

    msg_id: str
    attempt_ids: list[str] = msgspec.field(default_factory=list)
    progress: dict[str, Raw] | msgspec.UnsetType = msgspec.UNSET


class Complete(_Frame, tag="complete"):
    """Report success; ``result`` is the handler's return value as encoded JSON."""

    msg_id: str
    attempt_id: str
    execution_token: str
    result: Raw = NULL

    def __repr__(self) -> str:
        return f"Complete(msg_id={self.msg_id!r}, attempt_id={self.attempt_id!r})"


class Fail(_Frame, tag="fail"):
    """Report failure. ``retryable`` False asks the server not to retry."""

    msg_id: str
    attempt_id: str
    execution_token: str
    error: ErrorInfo
    retryable: bool = True
    retry_after_ms: int | UnsetType = UNSET

    def __repr__(self) -> str:
        return (
            f"Fail(msg_id={self.msg_id!r}, attempt_id={self.attempt_id!r}, "
            f"error={self.error!r}, retryable={self.retryable})"
        )


class Cancelled(_Frame, tag="cancelled"):
    """Confirm that the handler stopped after a ``cancel`` frame."""

    msg_id: str
    attempt_id: str
    execution_token: str

    def __repr__(self) -> str:
        return f"Cancelled(msg_id={self.msg_id!r}, attempt_id={self.attempt_id!r})"


class Effect(_Frame, tag="effect"):
    """Side-effect ledger: ``begin`` before the effect, ``commit`` with its ``result``."""

    msg_id: str
    attempt_id: str
    execution_token: str
    key: str
    phase: Literal["begin", "commit"]
    result: Raw | UnsetType = UNSET

    def __repr__(self) -> str:
        return (
            f"Effect(msg_id={self.msg_id!r}, attempt_id={self.attempt_id!r}, "
            f"key={self.key!r}, phase={self.phase!r})"
        )


WorkerFrame = Start | Heartbeat | Complete | Fail | Cancelled | Effect
"""Every frame a worker sends to the server."""

SERVER_DECODER: msgspec.json.Decoder[ServerFrame] = msgspec.json.Decoder(
    ServerFrame, float_hook=_json.number
)
"""Decodes one server→worker frame (raises ``msgspec.ValidationError`` on unknown types)."""

WORKER_DECODER: msgspec.json.Decoder[WorkerFrame] = msgspec.json.Decoder(
    WorkerFrame, float_hook=_json.number
)
"""Decodes one worker→server frame."""

_ENCODER = _json.ENCODER


def encode(obj: Any) -> bytes:
    """Encode a frame (or any msgspec-encodable value) to compact JSON bytes."""
    return _ENCODER.encode(obj)


#: WebSocket subprotocol the worker offers: the server then sends (and takes) several frames
#: in one ``batch`` frame, ``{"type": "batch", "frames": [frame, …]}``, each handled as if
#: it had come alone, in order.
BATCH_SUBPROTOCOL = "orbit.batch.v1"
#: The start of a batch frame as this SDK writes it (the frames follow, comma-separated).
BATCH_HEAD = b'{"type":"batch","frames":['


class BatchFrame(msgspec.Struct, kw_only=True):
    """A ``batch`` frame's frames, still undecoded."""

    frames: list[Raw]


#: Decodes a batch frame (after its ``type`` was seen to be ``batch``).
BATCH_DECODER: msgspec.json.Decoder[BatchFrame] = msgspec.json.Decoder(BatchFrame)

