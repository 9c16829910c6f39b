"""Worker protocol frames (server side): a tagged union per direction, one Decoder each.

Every frame is a JSON object whose ``"type"`` names it (docs/api/workers.md). Frames from the
worker carry a ``msg_id``; the server's replies carry it back as ``ref_msg_id``. New fields
always get defaults (schema evolution); unknown fields are ignored.

Business JSON (``payload``, ``result``) is :class:`msgspec.Raw`: the exact bytes received are
stored and sent, never re-encoded.

The HTTP fallback uses the same reply objects and the same request bodies minus ``type`` and
``msg_id`` (the attempt id is in the path): the ``*Body`` structs below.
"""

from __future__ import annotations

from datetime import datetime
from typing import Annotated, Any, Literal

import msgspec

from orbit.ids import id_hex
from orbit.times import format_opt, format_time
from orbit.types import ID_JSON_SCHEMA, NameText

NULL = msgspec.Raw(b"null")

#: Bounds shared by frames and HTTP bodies.
MsgId = Annotated[str, msgspec.Meta(min_length=1, max_length=128)]
Hex32 = Annotated[str, msgspec.Meta(min_length=1, max_length=64)]
Token = Annotated[str, msgspec.Meta(min_length=1, max_length=256)]
EffectKey = Annotated[str, msgspec.Meta(min_length=1, max_length=255)]
RetryAfterMs = Annotated[int, msgspec.Meta(ge=0, le=30 * 24 * 3600 * 1000)]


class FailError(msgspec.Struct, kw_only=True):
    """The error a worker reports with ``fail``."""

    type: Annotated[str, msgspec.Meta(min_length=1, max_length=255)]
    message: Annotated[str, msgspec.Meta(max_length=65536)] = ""
    details: msgspec.Raw = msgspec.field(default_factory=lambda: NULL)  # any JSON (``null`` = none)


# -- worker → server -------------------------------------------------------------------------


class Start(msgspec.Struct, tag_field="type", tag="start", kw_only=True):
    """Ask to start an offered attempt (two-step dispatch, step 2)."""

    msg_id: MsgId
    attempt_id: Hex32


class Heartbeat(msgspec.Struct, tag_field="type", tag="heartbeat", kw_only=True):
    """Keep the session alive and extend the leases of the listed running attempts;
    ``progress`` reports a JSON object per listed attempt (pulse/progress.py)."""

    msg_id: MsgId
    attempt_ids: list[Hex32] = msgspec.field(default_factory=list)
    progress: dict[Hex32, msgspec.Raw] | None = None


class Complete(msgspec.Struct, tag_field="type", tag="complete", kw_only=True):
    """Report success with the business result (kept byte-for-byte)."""

    msg_id: MsgId
    attempt_id: Hex32
    execution_token: Token
    result: msgspec.Raw = msgspec.field(default_factory=lambda: NULL)


class Fail(msgspec.Struct, tag_field="type", tag="fail", kw_only=True):
    """Report failure; ``retryable`` asks for a retry (with ``retry_after_ms`` at least)."""

    msg_id: MsgId
    attempt_id: Hex32
    execution_token: Token
    error: FailError
    retryable: bool = False
    retry_after_ms: RetryAfterMs | None = None


class Cancelled(msgspec.Struct, tag_field="type", tag="cancelled", kw_only=True):
    """The worker stopped the attempt after a ``cancel``."""

    msg_id: MsgId
    attempt_id: Hex32
    execution_token: Token


class Effect(msgspec.Struct, tag_field="type", tag="effect", kw_only=True):
    """Side-effect ledger: ``begin`` before the effect, ``commit`` with its result after."""

    msg_id: MsgId
    attempt_id: Hex32
    execution_token: Token
    key: EffectKey
    phase: Literal["begin", "commit"]
    result: msgspec.Raw = msgspec.field(
        default_factory=lambda: NULL
    )  # the effect's result at ``commit`` (``null`` = none)


WorkerFrame = Start | Heartbeat | Complete | Fail | Cancelled | Effect

#: Decodes one frame sent by a worker.
WORKER_DECODER: msgspec.json.Decoder[WorkerFrame] = msgspec.json.Decoder(WorkerFrame)


# -- server → worker -------------------------------------------------------------------------


class OfferTask(msgspec.Struct, kw_only=True):
    """The task fields an offer carries."""

    id: str
    queue: str
    kind: str
    payload: msgspec.Raw
    priority: int
    deadline_at: str | None
    generation: int
    concurrency_key: str | None = None


class Offer(msgspec.Struct, tag_field="type", tag="offer", kw_only=True):
    """A leased task offered to the session; ``start`` it before ``lease_expires_at``."""

    attempt_id: str
    task: OfferTask
    lease_expires_at: str


class Started(msgspec.Struct, tag_field="type", tag="started", kw_only=True):
    """Start authorised: run the handler; report with ``execution_token``."""

    ref_msg_id: str | None
    attempt_id: str
    execution_token: str
    generation: int
    concurrency_token: int | None
    lease_expires_at: str


class StartDenied(msgspec.Struct, tag_field="type", tag="start_denied", kw_only=True):
    """Start refused; drop the offer (docs/api/workers.md lists the reasons)."""

    ref_msg_id: str | None
    attempt_id: str
    reason: str


class HeartbeatAttempt(msgspec.Struct, kw_only=True):
    """Per-attempt answer of a heartbeat. ``ok`` false: stop, the attempt is no longer yours."""

    attempt_id: str
    ok: bool
    lease_expires_at: str | None
    cancel_requested: bool


class HeartbeatOk(msgspec.Struct, tag_field="type", tag="heartbeat_ok", kw_only=True):
    ref_msg_id: str | None
    attempts: list[HeartbeatAttempt]
    session_expires_at: str | None = None
    #: On a stream that does not accept keyed tasks, at most every ``keyed_check_ms``: its
    #: queues where keyed tasks wait (pulse/keyed_waiting.py). Absent otherwise. Additive.
    keyed_waiting: list[str] | msgspec.UnsetType = msgspec.UNSET


class Receipt(msgspec.Struct, tag_field="type", tag="receipt", kw_only=True):
    """The applied (or replayed) receipt of a complete/fail/cancelled report."""

    ref_msg_id: str | None
    attempt_id: str
    receipt_id: str
    outcome: Literal["applied", "replayed"]
    task_state: str


class Cancel(msgspec.Struct, tag_field="type", tag="cancel", kw_only=True):
    """Cancel intent: stop the attempt, then answer ``cancelled`` (or ``complete``)."""

    attempt_id: str
    reason: str


class EffectState(msgspec.Struct, tag_field="type", tag="effect_state", kw_only=True):
    """Ledger state of an effect key: ``new`` (go ahead), ``committed`` (use ``result``),
    ``uncertain`` (begun by an earlier attempt, never committed)."""

    ref_msg_id: str | None
    key: str
    state: Literal["new", "committed", "uncertain"]
    result: msgspec.Raw = msgspec.field(
        default_factory=lambda: NULL
    )  # the stored result of a committed effect


class Error(msgspec.Struct, tag_field="type", tag="error", kw_only=True):
    """A refused frame. ``code`` as in HTTP errors (``stale_token``, ``conflict``, …)."""

    code: str
    message: str
    ref_msg_id: str | None
    details: dict[str, object] | None = None


ServerFrame = Offer | Started | StartDenied | HeartbeatOk | Receipt | Cancel | EffectState | Error

#: Decodes one frame sent by the server (tests and tools; the SDK has its own types).
SERVER_DECODER: msgspec.json.Decoder[ServerFrame] = msgspec.json.Decoder(ServerFrame)

_ENCODER = msgspec.json.Encoder()


def is_null(raw: msgspec.Raw | None) -> bool:
    """True for an absent or JSON ``null`` business value."""
    return raw is None or bytes(raw).strip() == b"null"


#: WebSocket subprotocol a worker offers to receive (and send) several frames in one
#: ``batch`` frame: ``{"type": "batch", "frames": [frame, …]}`` (docs/api/workers.md).
BATCH_SUBPROTOCOL = "orbit.batch.v1"
#: The start of a batch frame as the server writes it (the frames follow, comma-separated).
BATCH_HEAD = b'{"type":"batch","frames":['


class BatchFrame(msgspec.Struct, tag="batch", tag_field="type"):
    """Several frames sent together (only on a stream that negotiated
    :data:`BATCH_SUBPROTOCOL`); each is handled as if it had come alone, in order."""

    frames: list[msgspec.Raw]


#: Decodes a batch frame (its frames stay raw until each is handled).
BATCH_DECODER: msgspec.json.Decoder[BatchFrame] = msgspec.json.Decoder(BatchFrame)


def encode(frame: ServerFrame | PollReply | SessionCreated | SessionClosed) -> bytes:
    """JSON bytes of a reply (business JSON copied verbatim)."""
    return _ENCODER.encode(frame)


# -- HTTP bodies (fallback transport and session creation) ------------------------------------


class InstanceInfo(msgspec.Struct, kw_only=True):
    #: 32 lowercase hex, checked by the session service.
    id: Annotated[Hex32, msgspec.Meta(extra_json_schema=ID_JSON_SCHEMA)] | None = None
    host: Annotated[str, msgspec.Meta(min_length=1, max_length=255)]
    pid: Annotated[int, msgspec.Meta(ge=0, le=4294967295)]
    sdk: Annotated[str, msgspec.Meta(min_length=1, max_length=64)]


class SessionCreate(msgspec.Struct, kw_only=True):
    """``POST /v1/namespaces/{ns}/workers/sessions``."""

    instance: InstanceInfo
    #: Each a queue name (checked by the session service, 400 naming ``queues[i]``).
    queues: Annotated[list[NameText], msgspec.Meta(min_length=1, max_length=64)]
    max_concurrency: Annotated[int, msgspec.Meta(ge=1, le=10000)]
    concurrency_keys: bool = False


class SessionCreated(msgspec.Struct, kw_only=True):
    session_id: str
    session_token: str
    instance_id: str
    heartbeat_ms: int
    lease_ms: int
    #: For a session that does not accept keyed tasks: its queues with keyed tasks among
    #: their next due tasks (they wait for a worker that does). Additive.
    keyed_waiting: list[str] = msgspec.field(default_factory=list)


class PollReply(msgspec.Struct, kw_only=True):
    offers: list[Offer]


class SessionClosed(msgspec.Struct, kw_only=True):
    """``DELETE /v1/namespaces/{ns}/workers/sessions/{sid}``: the session's state after the
    call (``CLOSED``, or ``EXPIRED`` when recovery ended it first), what the close did."""

    session_id: str
    state: str
    closed_at: str | None
    released_offers: int
    lost_attempts: int


class EmptyBody(msgspec.Struct, kw_only=True):
    """``start`` and attempt ``heartbeat`` over HTTP (nothing beyond the path)."""


class SessionHeartbeatBody(msgspec.Struct, kw_only=True):
    attempt_ids: list[Hex32] = msgspec.field(default_factory=list)
    #: A JSON object per listed attempt: its progress (pulse/progress.py).
    progress: dict[Hex32, msgspec.Raw] | None = None


class AttemptHeartbeatBody(msgspec.Struct, kw_only=True):
    """``POST …/attempts/{aid}/heartbeat``: optionally the attempt's progress (a JSON
    object)."""

    progress: msgspec.Raw = msgspec.field(default_factory=lambda: NULL)  # ``null`` = none


class CompleteBody(msgspec.Struct, kw_only=True):
    execution_token: Token
    result: msgspec.Raw = msgspec.field(default_factory=lambda: NULL)


class FailBody(msgspec.Struct, kw_only=True):
    execution_token: Token
    error: FailError
    retryable: bool = False
    retry_after_ms: RetryAfterMs | None = None


class CancelledBody(msgspec.Struct, kw_only=True):
    execution_token: Token


class EffectBody(msgspec.Struct, kw_only=True):
    execution_token: Token
    key: EffectKey
    phase: Literal["begin", "commit"]
    result: msgspec.Raw = msgspec.field(
        default_factory=lambda: NULL
    )  # the effect's result at ``commit`` (``null`` = none)


def offer_from_row(
    row: dict[str, Any], attempt_id: bytes, generation: int, lease: datetime
) -> Offer:
    """The ``offer`` frame of a task row (``id``, ``queue_name``, ``kind``, ``payload``,
    ``priority``, ``deadline_at``, ``concurrency_key``) and its OFFERED attempt."""
    payload = row["payload"]
    raw = payload.encode() if isinstance(payload, str) else bytes(payload)
    return Offer(
        attempt_id=id_hex(attempt_id),
        task=OfferTask(
            id=id_hex(row["id"]),
            queue=str(row["queue_name"]),
            kind=str(row["kind"]),
            payload=msgspec.Raw(raw),
            priority=int(row["priority"]),
            deadline_at=format_opt(row["deadline_at"]),
            generation=generation,
            concurrency_key=row.get("concurrency_key"),
        ),
        lease_expires_at=format_time(lease),
    )
