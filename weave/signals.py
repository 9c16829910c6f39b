"""Signals: ``POST /v1/namespaces/{ns}/instances/{id}/signals/{signal}``.

* A signal is recorded with its ``signal_id`` (client-chosen, 1–128 printable ASCII),
  ``name`` (the path's ``{signal}``), optional ``correlation_key`` and ``payload`` (kept byte
  for byte), and its ``signal_arrived`` inbox event, in one transaction. The instance is not
  locked: the advancer matches the signal later, under the instance lock.
* **De-duplication by signal_id** (per instance): the same ``signal_id`` with the same name,
  correlation key and payload (compared in canonical JSON form) answers **200** with the
  body of the first answer (201); with anything different → 409 ``conflict``
  (kind ``signal_id_reused``). Concurrent duplicates settle on the unique index.
* **Matching**: a signal satisfies the oldest open wait of the instance for that name whose
  correlation key it satisfies — a wait with a key only takes signals with the same key, a
  wait without one takes any signal of the name. One signal satisfies one wait. A signal
  that arrives before its wait opens is **kept** and taken by the first wait that opens for
  it (oldest signal first).
* A signal to a SUCCEEDED, FAILED or CANCELLED instance → 409 (a duplicate of a signal
  accepted earlier still answers 200). A paused instance accepts signals; they are applied
  on resume.
* ``Idempotency-Key`` is honoured as well (operation ``workflows.signal``).
"""

from __future__ import annotations

import hashlib
from datetime import datetime

import msgspec

from orbit import audit, events
from orbit.audit import Actor
from orbit.business_json import check_json_text
from orbit.errors import InvalidRequest
from orbit.idempotency import IdemRequest, Reply, perform
from orbit.ids import id_hex, new_id, parse_id
from orbit.storage import Database, DuplicateKey, Tx
from orbit.store.clock import clock_now
from orbit.times import format_time
from orbit.types import check_name
from weave.definition import jsonvalue
from weave.engine_core import SUBJECT
from weave.errors import InstanceNotFound, InstanceStateConflict, SignalIdReused
from weave.inbox import write_event
from weave.store import instances as instance_store
from weave.store import signals as store
from weave.types import InboxKind, InstanceState, SignalBody, SignalOut, SignalRow

SIGNAL = "workflows.signal"
EVENT_SIGNAL = "workflow.signal_received"


def signal_digest(name: str, correlation_key: str | None, payload_text: str) -> bytes:
    """SHA-256 of the canonical signal (name, key, payload with sorted keys): what makes a
    re-sent signal a replay rather than a conflicting reuse of its ``signal_id``."""
    canon = jsonvalue.canonical(
        {"name": name, "correlation_key": correlation_key,
         "payload": jsonvalue.decode(payload_text)}
    )  # fmt: skip
    return hashlib.sha256(canon).digest()


def signal_out(row: SignalRow) -> SignalOut:
    return SignalOut(
        id=id_hex(row.id),
        instance_id=id_hex(row.instance_id),
        signal_id=row.signal_id,
        name=row.name,
        correlation_key=row.correlation_key,
        payload=msgspec.Raw(row.payload.encode()),
        received_at=format_time(row.received_at),
    )


def _replay(row: SignalRow, digest: bytes) -> tuple[int, SignalOut]:
    if row.request_digest != digest:
        raise SignalIdReused(row.signal_id)
    return 200, signal_out(row)


async def send_in_tx(
    tx: Tx,
    actor: Actor | None,
    namespace_id: bytes,
    instance_id: bytes,
    name: str,
    body: SignalBody,
    payload_text: str,
    *,
    request_id: str | None = None,
    now: datetime | None = None,
) -> tuple[int, SignalOut]:
    """Record a signal and its inbox event in ``tx``: (201 | 200 replay, signal)."""
    digest = signal_digest(name, body.correlation_key, payload_text)
    existing = await store.signal_get_by_signal_id(tx, namespace_id, instance_id, body.signal_id)
    if existing is not None:
        return _replay(existing, digest)
    inst = await instance_store.instance_get(tx, namespace_id, instance_id)
    if inst is None:
        raise InstanceNotFound()
    if inst.state != InstanceState.RUNNING:
        raise InstanceStateConflict(f"a {inst.state} instance takes no signals", inst.state)
    t = now or await clock_now(tx)
    row = SignalRow(
        namespace_id=namespace_id,
        id=new_id(),
        instance_id=instance_id,
        signal_id=body.signal_id,
        name=name,
        correlation_key=body.correlation_key,
        payload=payload_text,
        request_digest=digest,
        matched_wait_id=None,
        matched_at=None,
        sent_by=actor.credential_id if actor is not None else None,
        received_at=t,
        revision=1,
    )
    try:
        await store.signal_insert(tx, row)
    except DuplicateKey as exc:
        if exc.key != store.SIGNAL_ID_INDEX:
            raise
        twin = await store.signal_get_by_signal_id(tx, namespace_id, instance_id, body.signal_id)
        assert twin is not None, "a duplicate signal_id is committed when we see 1062"
        return _replay(twin, digest)
    await write_event(
        tx, namespace_id, instance_id, InboxKind.SIGNAL_ARRIVED, row.id,
        payload=payload_text,
        data={"name": name, "signal_id": body.signal_id, "correlation_key": body.correlation_key},
        now=t,
    )  # fmt: skip
    await events.append_event(
        tx, namespace_id, EVENT_SIGNAL, SUBJECT, instance_id,
        {"signal": name, "signal_id": body.signal_id, "signal_row_id": id_hex(row.id)},
        request_id, now=t,
    )  # fmt: skip
    if actor is not None:
        await audit.record(
            tx, actor=actor, action=SIGNAL, resource_kind="workflow_instance",
            resource_id=instance_id, status_code=201, namespace_id=namespace_id,
            request_id=request_id, details={"signal": name, "signal_id": body.signal_id}, now=t,
        )  # fmt: skip
    return 201, signal_out(row)


async def send_signal(
    db: Database,
    namespace_id: bytes,
    instance_id: str,
    name: str,
    body: SignalBody,
    *,
    actor: Actor | None = None,
    request_id: str | None = None,
    idem: IdemRequest | None = None,
    now: datetime | None = None,
) -> Reply:
    """Send a signal (see the module docstring). 404 for an unknown instance."""
    check_name(name, "signal")
    iid = parse_id(instance_id)
    if iid is None:
        raise InstanceNotFound()
    payload_text = check_json_text(bytes(body.payload), "payload")
    for field in ("signal_id", "correlation_key"):
        value = getattr(body, field)
        if value is not None and value.endswith(" "):
            # utf8mb4_bin pads with spaces: "s " would replay "s", "k " would match a "k" wait.
            raise InvalidRequest(f"{field} must not end with a space", field=field)

    async def effect(tx: Tx) -> tuple[int, SignalOut]:
        return await send_in_tx(
            tx, actor, namespace_id, iid, name, body, payload_text, request_id=request_id, now=now
        )

    async def run(tx: Tx) -> Reply:
        return await perform(tx, idem, namespace_id, SIGNAL, instance_id, effect)

    return await db.transaction(run)
