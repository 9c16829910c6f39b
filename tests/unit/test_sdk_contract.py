"""Contract: the SDK's wire types and the server's (``pulse.wire``) read and write the same JSON.

Every worker→server frame the SDK encodes must decode with the server's decoder to the same
JSON, and every server→worker frame the server encodes must decode with the SDK's decoder to
the same JSON. Skipped while the server package is absent.
"""

from __future__ import annotations

import json
from typing import Any

import msgspec
import pytest
from json_corpus import EDGE_DOC
from orbit_sdk import wire as sdk
from test_sdk_wire import SERVER_FRAMES, WORKER_FRAMES

from pulse import wire as server


def _json(obj: Any) -> Any:
    return json.loads(msgspec.json.encode(obj))


def _without_nulls(doc: Any) -> Any:
    """Optional fields: one side may omit what the other writes as null."""
    if isinstance(doc, dict):
        return {k: _without_nulls(v) for k, v in doc.items() if v is not None}
    if isinstance(doc, list):
        return [_without_nulls(v) for v in doc]
    return doc


@pytest.mark.parametrize(
    ("frame", "expected"), WORKER_FRAMES, ids=[type(f).__name__ for f, _ in WORKER_FRAMES]
)
def test_server_decodes_what_the_sdk_sends(frame: Any, expected: dict[str, Any]) -> None:
    data = sdk.encode(frame)
    decoded = server.WORKER_DECODER.decode(data)
    assert type(decoded).__name__ == type(frame).__name__
    assert _without_nulls(_json(decoded)) == _without_nulls(json.loads(data))


@pytest.mark.parametrize(
    ("frame", "expected"), SERVER_FRAMES, ids=[type(f).__name__ for f, _ in SERVER_FRAMES]
)
def test_sdk_decodes_what_the_server_sends(frame: Any, expected: dict[str, Any]) -> None:
    # Build the server's own frame from the agreed JSON, encode it the server's way, read it
    # with the SDK: both must describe the same document.
    server_frame = server.SERVER_DECODER.decode(json.dumps(expected))
    data = server.encode(server_frame)
    decoded = sdk.SERVER_DECODER.decode(data)
    assert type(decoded).__name__.lower() in (type(server_frame).__name__.lower(), "servererror")
    assert _without_nulls(json.loads(sdk.encode(decoded))) == _without_nulls(json.loads(data))


def test_session_bodies_agree() -> None:
    body = sdk.SessionCreate(
        instance=sdk.InstanceInfo(host="h", pid=7, sdk="orbit-sdk-python/0.1.0"),
        queues=["q"],
        max_concurrency=3,
        concurrency_keys=True,
    )
    parsed = msgspec.json.decode(sdk.encode(body), type=server.SessionCreate)
    assert (parsed.queues, parsed.max_concurrency, parsed.concurrency_keys) == (["q"], 3, True)
    assert parsed.instance.id is None
    created = server.SessionCreated(
        session_id="s", session_token="t", instance_id="i", heartbeat_ms=1000, lease_ms=30000
    )
    mine = msgspec.json.decode(server.encode(created), type=sdk.SessionCreated)
    assert (mine.session_id, mine.heartbeat_ms, mine.lease_ms) == ("s", 1000, 30000)


def test_business_json_crosses_both_wires_byte_for_byte() -> None:
    """The corpus of edge numbers (tests/json_corpus.py) in every business-JSON field of a
    frame: what one side writes, the other reads back with the same bytes."""
    raw = msgspec.Raw(EDGE_DOC)
    worker_frames = [
        sdk.Complete(msg_id="m", attempt_id="a", execution_token="t", result=raw),
        sdk.Fail(msg_id="m", attempt_id="a", execution_token="t",
                 error=sdk.ErrorInfo(type="X", message="m", details=raw)),
        sdk.Effect(msg_id="m", attempt_id="a", execution_token="t", key="k", phase="commit",
                   result=raw),
    ]  # fmt: skip
    for frame in worker_frames:
        data = sdk.encode(frame)
        assert EDGE_DOC in data
        assert EDGE_DOC in server.encode(server.WORKER_DECODER.decode(data))
    offer = server.SERVER_DECODER.decode(
        b'{"type": "offer", "attempt_id": "a", "lease_expires_at": "2026-01-01T00:00:00.000000Z",'
        b' "task": {"id": "t", "queue": "q", "kind": "k", "priority": 0, "generation": 1,'
        b' "deadline_at": null,'
        b' "payload": %s}}' % EDGE_DOC
    )
    effect = server.EffectState(ref_msg_id="m", key="k", state="committed", result=raw)
    for frame in (offer, effect):
        mine = sdk.SERVER_DECODER.decode(server.encode(frame))
        assert EDGE_DOC in sdk.encode(mine)
