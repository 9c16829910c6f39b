"""Wire types of the worker protocol: exact field names, round trips, byte-exact Raw."""

from __future__ import annotations

import json
from datetime import UTC, datetime
from typing import Any

import msgspec
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from orbit_sdk import wire
from orbit_sdk.wire import (
    SERVER_DECODER,
    WORKER_DECODER,
    AttemptLease,
    Cancel,
    Cancelled,
    Complete,
    Effect,
    EffectState,
    ErrorInfo,
    Fail,
    Heartbeat,
    HeartbeatOk,
    InstanceInfo,
    Offer,
    OfferedTask,
    PollResponse,
    Receipt,
    ServerError,
    SessionCreate,
    SessionCreated,
    Start,
    StartDenied,
    Started,
    encode,
)

AT = datetime(2026, 11, 29, 21, 30, 0, 123456, tzinfo=UTC)
AT_TEXT = "2026-11-29T21:30:00.123456Z"
HEX = "0123456789abcdef0123456789abcdef"

# One example of every frame, with the exact JSON the protocol agreement prescribes.
WORKER_FRAMES: list[tuple[Any, dict[str, Any]]] = [
    (Start(msg_id="m1", attempt_id=HEX), {"type": "start", "msg_id": "m1", "attempt_id": HEX}),
    (
        Heartbeat(msg_id="m2", attempt_ids=[HEX]),
        {"type": "heartbeat", "msg_id": "m2", "attempt_ids": [HEX]},
    ),
    (Heartbeat(msg_id="m3"), {"type": "heartbeat", "msg_id": "m3", "attempt_ids": []}),
    (
        Heartbeat(msg_id="m3p", attempt_ids=[HEX], progress={HEX: msgspec.Raw(b'{"done":1}')}),
        {"type": "heartbeat", "msg_id": "m3p", "attempt_ids": [HEX], "progress": {HEX: {"done": 1}}},
    ),
    (
        Complete(
            msg_id="m4", attempt_id=HEX, execution_token="tok", result=msgspec.Raw(b'{"a":1}')
        ),
        {
            "type": "complete",
            "msg_id": "m4",
            "attempt_id": HEX,
            "execution_token": "tok",
            "result": {"a": 1},
        },
    ),
    (
        Fail(
            msg_id="m5",
            attempt_id=HEX,
            execution_token="tok",
            error=ErrorInfo(type="Boom", message="bad", details={"k": 1}),
            retryable=False,
            retry_after_ms=250,
        ),
        {
            "type": "fail",
            "msg_id": "m5",
            "attempt_id": HEX,
            "execution_token": "tok",
            "error": {"type": "Boom", "message": "bad", "details": {"k": 1}},
            "retryable": False,
            "retry_after_ms": 250,
        },
    ),
    (
        Fail(
            msg_id="m6",
            attempt_id=HEX,
            execution_token="tok",
            error=ErrorInfo(type="T", message="m"),
        ),
        {
            "type": "fail",
            "msg_id": "m6",
            "attempt_id": HEX,
            "execution_token": "tok",
            "error": {"type": "T", "message": "m"},
            "retryable": True,
        },
    ),
    (
        Cancelled(msg_id="m7", attempt_id=HEX, execution_token="tok"),
        {"type": "cancelled", "msg_id": "m7", "attempt_id": HEX, "execution_token": "tok"},
    ),
    (
        Effect(msg_id="m8", attempt_id=HEX, execution_token="tok", key="charge", phase="begin"),
        {
            "type": "effect",
            "msg_id": "m8",
            "attempt_id": HEX,
            "execution_token": "tok",
            "key": "charge",
            "phase": "begin",
        },
    ),
    (
        Effect(
            msg_id="m9",
            attempt_id=HEX,
            execution_token="tok",
            key="charge",
            phase="commit",
            result=msgspec.Raw(b"[1,2]"),
        ),
        {
            "type": "effect",
            "msg_id": "m9",
            "attempt_id": HEX,
            "execution_token": "tok",
            "key": "charge",
            "phase": "commit",
            "result": [1, 2],
        },
    ),
]

SERVER_FRAMES: list[tuple[Any, dict[str, Any]]] = [
    (
        Offer(
            attempt_id=HEX,
            task=OfferedTask(
                id=HEX,
                queue="q",
                kind="k",
                payload=msgspec.Raw(b'{"x":1}'),
                priority=5,
                deadline_at=AT,
                generation=2,
                concurrency_key="user-1",
            ),
            lease_expires_at=AT,
        ),
        {
            "type": "offer",
            "attempt_id": HEX,
            "task": {
                "id": HEX,
                "queue": "q",
                "kind": "k",
                "payload": {"x": 1},
                "priority": 5,
                "deadline_at": AT_TEXT,
                "generation": 2,
                "concurrency_key": "user-1",
            },
            "lease_expires_at": AT_TEXT,
        },
    ),
    (
        Started(
            ref_msg_id="m1",
            attempt_id=HEX,
            execution_token="tok",
            generation=2,
            concurrency_token=7,
            lease_expires_at=AT,
        ),
        {
            "type": "started",
            "ref_msg_id": "m1",
            "attempt_id": HEX,
            "execution_token": "tok",
            "generation": 2,
            "concurrency_token": 7,
            "lease_expires_at": AT_TEXT,
        },
    ),
    (
        StartDenied(ref_msg_id="m1", attempt_id=HEX, reason="gate_closed"),
        {"type": "start_denied", "ref_msg_id": "m1", "attempt_id": HEX, "reason": "gate_closed"},
    ),
    (
        HeartbeatOk(
            ref_msg_id="m2",
            attempts=[
                AttemptLease(attempt_id=HEX, ok=True, lease_expires_at=AT, cancel_requested=True)
            ],
            session_expires_at=AT,
        ),
        {
            "type": "heartbeat_ok",
            "ref_msg_id": "m2",
            "attempts": [
                {
                    "attempt_id": HEX,
                    "ok": True,
                    "lease_expires_at": AT_TEXT,
                    "cancel_requested": True,
                }
            ],
            "session_expires_at": AT_TEXT,
        },
    ),
    (
        Receipt(
            ref_msg_id="m4",
            attempt_id=HEX,
            receipt_id=HEX,
            outcome="replayed",
            task_state="SUCCEEDED",
        ),
        {
            "type": "receipt",
            "ref_msg_id": "m4",
            "attempt_id": HEX,
            "receipt_id": HEX,
            "outcome": "replayed",
            "task_state": "SUCCEEDED",
        },
    ),
    (
        Cancel(attempt_id=HEX, reason="user"),
        {"type": "cancel", "attempt_id": HEX, "reason": "user"},
    ),
    (
        EffectState(
            ref_msg_id="m8", key="charge", state="committed", result=msgspec.Raw(b'"ch_1"')
        ),
        {
            "type": "effect_state",
            "ref_msg_id": "m8",
            "key": "charge",
            "state": "committed",
            "result": "ch_1",
        },
    ),
    (
        ServerError(code="stale_token", message="stale", ref_msg_id="m4"),
        {
            "type": "error",
            "code": "stale_token",
            "message": "stale",
            "ref_msg_id": "m4",
            "details": {},
        },
    ),
]


def _ids(frames: list[tuple[Any, dict[str, Any]]]) -> list[str]:
    return [f"{type(f).__name__}-{i}" for i, (f, _) in enumerate(frames)]


@pytest.mark.parametrize(("frame", "expected"), WORKER_FRAMES, ids=_ids(WORKER_FRAMES))
def test_worker_frames_encode_to_the_agreed_json_and_round_trip(
    frame: Any, expected: dict[str, Any]
) -> None:
    data = encode(frame)
    assert json.loads(data) == expected
    assert WORKER_DECODER.decode(data) == frame
    assert json.loads(encode(WORKER_DECODER.decode(json.dumps(expected)))) == expected


@pytest.mark.parametrize(("frame", "expected"), SERVER_FRAMES, ids=_ids(SERVER_FRAMES))
def test_server_frames_decode_from_the_agreed_json_and_round_trip(
    frame: Any, expected: dict[str, Any]
) -> None:
    decoded = SERVER_DECODER.decode(json.dumps(expected))
    assert type(decoded) is type(frame)
    assert json.loads(encode(decoded)) == expected
    assert SERVER_DECODER.decode(encode(frame)) == frame


def test_every_frame_type_is_covered() -> None:
    worker_types = {type(f) for f, _ in WORKER_FRAMES}
    server_types = {type(f) for f, _ in SERVER_FRAMES}
    assert worker_types == set(wire.WorkerFrame.__args__)  # type: ignore[attr-defined]
    assert server_types == set(wire.ServerFrame.__args__)  # type: ignore[attr-defined]


def test_server_frames_tolerate_new_fields_and_missing_optional_ones() -> None:
    offer = SERVER_DECODER.decode(
        b'{"type":"offer","attempt_id":"a","task":{"id":"t","payload":[1],"new_field":{"x":1}},'
        b'"future":true}'
    )
    assert isinstance(offer, Offer)
    assert (
        bytes(offer.task.payload) == b"[1]"
        and offer.task.priority == 0
        and offer.lease_expires_at is None
    )
    receipt = SERVER_DECODER.decode(b'{"type":"receipt","attempt_id":"a"}')
    assert isinstance(receipt, Receipt) and receipt.ref_msg_id is None
    state = SERVER_DECODER.decode(b'{"type":"effect_state","key":"k","state":"new"}')
    assert isinstance(state, EffectState) and bytes(state.result) == b"null"
    started = SERVER_DECODER.decode(
        b'{"type":"started","attempt_id":"a","execution_token":"t","concurrency_token":null}'
    )
    assert isinstance(started, Started) and started.concurrency_token is None
    error = SERVER_DECODER.decode(
        b'{"type":"error","code":"conflict","message":"m","ref_msg_id":null,"details":null}'
    )
    assert isinstance(error, ServerError) and error.details is None
    lease = SERVER_DECODER.decode(
        b'{"type":"heartbeat_ok","ref_msg_id":"r","attempts":[{"attempt_id":"a","ok":false,'
        b'"lease_expires_at":null,"cancel_requested":false}]}'
    )
    assert isinstance(lease, HeartbeatOk) and lease.attempts[0].lease_expires_at is None


def test_unknown_frame_types_are_rejected_by_the_decoders() -> None:
    with pytest.raises(msgspec.ValidationError):
        SERVER_DECODER.decode(b'{"type":"teleport","attempt_id":"a"}')
    with pytest.raises(msgspec.ValidationError):
        WORKER_DECODER.decode(b'{"type":"offer","attempt_id":"a","task":{"id":"t"}}')


def test_session_bodies() -> None:
    body = SessionCreate(
        instance=InstanceInfo(host="h", pid=1, sdk="orbit-sdk-python/0.1.0"),
        queues=["a", "b"],
        max_concurrency=4,
        concurrency_keys=True,
    )
    assert json.loads(encode(body)) == {
        "instance": {"host": "h", "pid": 1, "sdk": "orbit-sdk-python/0.1.0"},
        "queues": ["a", "b"],
        "max_concurrency": 4,
        "concurrency_keys": True,
    }
    body.instance.id = HEX
    assert json.loads(encode(body))["instance"]["id"] == HEX
    created = msgspec.json.decode(
        b'{"session_id":"s","session_token":"SECRET","instance_id":"i","heartbeat_ms":5000,"lease_ms":20000}',
        type=SessionCreated,
    )
    assert created.heartbeat_ms == 5000 and created.lease_ms == 20000
    assert "SECRET" not in repr(created)
    poll = msgspec.json.decode(
        b'{"offers":[{"type":"offer","attempt_id":"a","task":{"id":"t"}}]}', type=PollResponse
    )
    assert poll.offers[0].attempt_id == "a"


def test_tokens_are_hidden_from_repr() -> None:
    for frame in (
        Started(attempt_id="a", execution_token="SECRET"),
        Complete(msg_id="m", attempt_id="a", execution_token="SECRET"),
        Fail(
            msg_id="m",
            attempt_id="a",
            execution_token="SECRET",
            error=ErrorInfo(type="t", message="m"),
        ),
        Cancelled(msg_id="m", attempt_id="a", execution_token="SECRET"),
        Effect(msg_id="m", attempt_id="a", execution_token="SECRET", key="k", phase="begin"),
    ):
        assert "SECRET" not in repr(frame)


# ---------------------------------------------------------------- hypothesis

json_values = st.recursive(
    st.none()
    | st.booleans()
    | st.integers(min_value=-(2**200), max_value=2**200)
    | st.floats(allow_nan=False, allow_infinity=False)
    | st.text(max_size=12),
    lambda children: (
        st.lists(children, max_size=4) | st.dictionaries(st.text(max_size=8), children, max_size=4)
    ),
    max_leaves=12,
)


@st.composite
def json_texts(draw: st.DrawFn) -> bytes:
    """Valid JSON in arbitrary (non-canonical) layouts: whitespace, escapes, key order."""
    value = draw(json_values)
    indent = draw(st.sampled_from([None, 0, 1, 3]))
    separators = draw(st.sampled_from([(",", ":"), (", ", ": "), (" ,", " :  ")]))
    ensure_ascii = draw(st.booleans())
    text = json.dumps(value, indent=indent, separators=separators, ensure_ascii=ensure_ascii)
    return text.encode()


@settings(max_examples=100, deadline=None)
@given(payload=json_texts())
def test_offer_payload_is_byte_exact(payload: bytes) -> None:
    data = (
        b'{"type":"offer","attempt_id":"a","task":{"id":"t","kind":"k","payload":'
        + payload
        + b',"priority":1},"lease_expires_at":null}'
    )
    offer = SERVER_DECODER.decode(data)
    assert isinstance(offer, Offer)
    assert bytes(offer.task.payload) == payload
    assert msgspec.json.decode(offer.task.payload) == json.loads(payload)


@settings(max_examples=100, deadline=None)
@given(result=json_texts(), msg_id=st.text(min_size=1, max_size=20), token=st.text(max_size=40))
def test_reported_results_are_byte_exact_and_round_trip(
    result: bytes, msg_id: str, token: str
) -> None:
    frames = [
        Complete(msg_id=msg_id, attempt_id=HEX, execution_token=token, result=msgspec.Raw(result)),
        Effect(
            msg_id=msg_id,
            attempt_id=HEX,
            execution_token=token,
            key="k",
            phase="commit",
            result=msgspec.Raw(result),
        ),
    ]
    for frame in frames:
        data = encode(frame)
        assert result in data
        decoded = WORKER_DECODER.decode(data)
        assert decoded == frame and bytes(decoded.result) == result


@settings(max_examples=50, deadline=None)
@given(
    attempt_ids=st.lists(st.text(max_size=32), max_size=5),
    ok=st.booleans(),
    cancel=st.booleans(),
    when=st.datetimes(timezones=st.just(UTC)),
    concurrency_token=st.none() | st.integers(min_value=0, max_value=2**63 - 1),
    details=st.dictionaries(st.text(max_size=8), json_values, max_size=3),
)
def test_arbitrary_frames_round_trip(
    attempt_ids: list[str],
    ok: bool,
    cancel: bool,
    when: datetime,
    concurrency_token: int | None,
    details: dict[str, Any],
) -> None:
    server_frames = [
        HeartbeatOk(
            ref_msg_id="r",
            attempts=[
                AttemptLease(attempt_id=a, ok=ok, lease_expires_at=when, cancel_requested=cancel)
                for a in attempt_ids
            ],
        ),
        Started(
            ref_msg_id="r",
            attempt_id="a",
            execution_token="t",
            generation=3,
            concurrency_token=concurrency_token,
            lease_expires_at=when,
        ),
        ServerError(code="conflict", message="m", ref_msg_id=None, details=details),
    ]
    for frame in server_frames:
        assert SERVER_DECODER.decode(encode(frame)) == frame
    worker_frames = [
        Heartbeat(msg_id="m", attempt_ids=attempt_ids),
        Fail(
            msg_id="m",
            attempt_id="a",
            execution_token="t",
            error=ErrorInfo(type="E", message="x", details=details),
            retryable=ok,
        ),
    ]
    for frame in worker_frames:
        assert WORKER_DECODER.decode(encode(frame)) == frame
