"""Contract: the server's frame types (pulse.wire) and the SDK's (orbit_sdk.wire) encode and
decode the same JSON, in both directions (no database)."""

from __future__ import annotations

from datetime import UTC, datetime

import msgspec
import pytest
from orbit_sdk import wire as sdk_wire

from pulse import wire

AID = "a" * 32
WHEN = "2026-11-29T21:30:00.123456Z"


def test_server_frames_decode_in_the_sdk() -> None:
    frames = [
        wire.Offer(
            attempt_id=AID,
            task=wire.OfferTask(
                id="b" * 32,
                queue="q",
                kind="k",
                payload=msgspec.Raw(b'{"x": 1.50}'),
                priority=9,
                deadline_at=WHEN,
                generation=2,
                concurrency_key="key",
            ),
            lease_expires_at=WHEN,
        ),
        wire.Started(
            ref_msg_id="m1",
            attempt_id=AID,
            execution_token="ext_t",
            generation=2,
            concurrency_token=None,
            lease_expires_at=WHEN,
        ),
        wire.StartDenied(ref_msg_id="m2", attempt_id=AID, reason="paused"),
        wire.HeartbeatOk(
            ref_msg_id="m3",
            attempts=[
                wire.HeartbeatAttempt(
                    attempt_id=AID, ok=True, lease_expires_at=WHEN, cancel_requested=True
                )
            ],
            session_expires_at=WHEN,
        ),
        wire.Receipt(
            ref_msg_id="m4",
            attempt_id=AID,
            receipt_id="c" * 32,
            outcome="replayed",
            task_state="SUCCEEDED",
        ),
        wire.Cancel(attempt_id=AID, reason="cancel_requested"),
        wire.EffectState(
            ref_msg_id="m5", key="k", state="committed", result=msgspec.Raw(b'{"id": 7}')
        ),
        wire.Error(code="stale_token", message="no", ref_msg_id="m6", details={"evidence": True}),
    ]
    expected = [
        sdk_wire.Offer, sdk_wire.Started, sdk_wire.StartDenied, sdk_wire.HeartbeatOk,
        sdk_wire.Receipt, sdk_wire.Cancel, sdk_wire.EffectState, sdk_wire.ServerError,
    ]  # fmt: skip
    for frame, sdk_type in zip(frames, expected, strict=True):
        got = sdk_wire.SERVER_DECODER.decode(wire.encode(frame))
        assert type(got) is sdk_type
        if hasattr(frame, "ref_msg_id"):
            assert got.ref_msg_id == frame.ref_msg_id
    offer = sdk_wire.SERVER_DECODER.decode(wire.encode(frames[0]))
    assert bytes(offer.task.payload) == b'{"x": 1.50}' and offer.task.generation == 2
    assert offer.lease_expires_at == datetime(2026, 11, 29, 21, 30, 0, 123456, tzinfo=UTC)
    hb = sdk_wire.SERVER_DECODER.decode(wire.encode(frames[3]))
    assert hb.attempts[0].cancel_requested is True
    eff = sdk_wire.SERVER_DECODER.decode(wire.encode(frames[6]))
    assert bytes(eff.result) == b'{"id": 7}'
    assert sdk_wire.SERVER_DECODER.decode(wire.encode(frames[7])).code == "stale_token"


def test_sdk_frames_decode_on_the_server() -> None:
    enc = msgspec.json.Encoder()
    start = wire.WORKER_DECODER.decode(enc.encode(sdk_wire.Start(msg_id="1", attempt_id=AID)))
    assert isinstance(start, wire.Start) and start.attempt_id == AID
    hb = wire.WORKER_DECODER.decode(enc.encode(sdk_wire.Heartbeat(msg_id="2", attempt_ids=[AID])))
    assert isinstance(hb, wire.Heartbeat) and hb.attempt_ids == [AID]
    done = wire.WORKER_DECODER.decode(
        enc.encode(
            sdk_wire.Complete(
                msg_id="3", attempt_id=AID, execution_token="t", result=msgspec.Raw(b"[1, 2.50]")
            )
        )
    )
    assert isinstance(done, wire.Complete) and bytes(done.result) == b"[1, 2.50]"
    fail = wire.WORKER_DECODER.decode(
        enc.encode(
            sdk_wire.Fail(
                msg_id="4",
                attempt_id=AID,
                execution_token="t",
                error=sdk_wire.ErrorInfo(type="E", message="m", details={"a": 1}),
                retryable=False,
                retry_after_ms=250,
            )
        )
    )
    assert isinstance(fail, wire.Fail) and fail.retryable is False
    assert fail.retry_after_ms == 250 and msgspec.json.decode(bytes(fail.error.details)) == {"a": 1}
    minimal = wire.WORKER_DECODER.decode(
        enc.encode(
            sdk_wire.Fail(
                msg_id="5",
                attempt_id=AID,
                execution_token="t",
                error=sdk_wire.ErrorInfo(type="E", message="m"),
            )
        )
    )
    assert isinstance(minimal, wire.Fail) and wire.is_null(minimal.error.details)
    cancelled = wire.WORKER_DECODER.decode(
        enc.encode(sdk_wire.Cancelled(msg_id="6", attempt_id=AID, execution_token="t"))
    )
    assert isinstance(cancelled, wire.Cancelled)
    for result in (msgspec.UNSET, msgspec.Raw(b'{"r": 1}')):
        eff = wire.WORKER_DECODER.decode(
            enc.encode(
                sdk_wire.Effect(
                    msg_id="7",
                    attempt_id=AID,
                    execution_token="t",
                    key="k",
                    phase="commit",
                    result=result,
                )
            )
        )
        assert isinstance(eff, wire.Effect) and eff.phase == "commit"
    body = msgspec.json.decode(
        enc.encode(sdk_wire.SessionCreate(
            instance=sdk_wire.InstanceInfo(host="h", pid=1, sdk="s"), queues=["q"],
            max_concurrency=3,
        )),
        type=wire.SessionCreate,
    )  # fmt: skip
    assert body.instance.id is None and body.max_concurrency == 3
    created = msgspec.json.decode(
        wire.encode(
            wire.SessionCreated(
                session_id="s",
                session_token="pws_x",
                instance_id="i",
                heartbeat_ms=333,
                lease_ms=30_000,
            )
        ),
        type=sdk_wire.SessionCreated,
    )
    assert created.heartbeat_ms == 333


def test_unknown_frame_types_and_fields() -> None:
    with pytest.raises(msgspec.ValidationError):
        wire.WORKER_DECODER.decode(b'{"type": "explode", "msg_id": "1"}')
    with pytest.raises(msgspec.ValidationError):
        wire.WORKER_DECODER.decode(b'{"type": "start", "msg_id": "1"}')  # attempt_id missing
    frame = wire.WORKER_DECODER.decode(
        b'{"type": "start", "msg_id": "1", "attempt_id": "x", "future_field": 1}'
    )
    assert isinstance(frame, wire.Start)  # additive fields are ignored
