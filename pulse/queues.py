"""Queues and execution gates: create/update with revisions, reads with live counts and usage,
pause/resume of the queue gate and the namespace gate.

* A queue's configuration has a ``revision`` (the ETag). ``PUT`` replaces the whole
  configuration (absent fields take their defaults); an identical PUT is a no-op that keeps
  the revision. Usage counters live in ``pulse_queue_usage``, created with the queue in the
  same transaction and never reset by a config change.
* Gates are rows of ``pulse_execution_gates`` created on first use (absent = open). Pausing
  a paused gate (or resuming an open one) changes nothing; a real change bumps the gate's own
  ``control_revision``. A closed gate stops new starts only (checked at start authorisation
  with :func:`gate_closed`); running attempts continue.
"""

from __future__ import annotations

import base64
from dataclasses import dataclass
from datetime import datetime
from decimal import Decimal
from typing import Any

import msgspec

from orbit import audit
from orbit.audit import Actor
from orbit.errors import InvalidRequest
from orbit.http.etag import Preconditions
from orbit.ids import id_hex, new_id
from orbit.storage import Database, DuplicateKey, Tx
from orbit.store.clock import clock_now
from orbit.times import format_opt
from pulse import retry_bounds, transitions
from pulse.errors import CursorMismatch, QueueNotFound
from pulse.store import queues as store
from pulse.store import watchdog as watchdog_store
from pulse.types import QueuePut, RetryPolicy, TaskState

QUEUE_NAME_INDEX = "uq_pulse_queues_name"
NAMESPACE_GATE = store.NAMESPACE_GATE

_CONFIG_FIELDS = (
    "max_unfinished_tasks",
    "max_concurrency",
    "max_starts_per_second",
    "lease_ms",
    "retry_max_attempts",
    "retry_backoff_initial_ms",
    "retry_backoff_max_ms",
    "retry_backoff_multiplier",
    "retry_bound_min_ms",
    "retry_bound_max_ms",
    "retry_bound_multiplier_max",
    "stuck_after_ms",
)


@dataclass(frozen=True)
class PutResult:
    """Outcome of :func:`put_queue`: the queue view and whether it was created (201)."""

    queue: dict[str, Any]
    created: bool

    @property
    def revision(self) -> int:
        return int(self.queue["revision"])


def _config(body: QueuePut) -> dict[str, Any]:
    retry = body.retry or RetryPolicy()
    if retry.backoff_max_ms < retry.backoff_initial_ms:
        raise InvalidRequest(
            "backoff_max_ms must be at least backoff_initial_ms", field="retry.backoff_max_ms"
        )
    return {
        "max_unfinished_tasks": body.max_unfinished_tasks,
        "max_concurrency": body.max_concurrency,
        "max_starts_per_second": body.max_starts_per_second,
        "lease_ms": body.lease_ms,
        "retry_max_attempts": retry.max_attempts,
        "retry_backoff_initial_ms": retry.backoff_initial_ms,
        "retry_backoff_max_ms": retry.backoff_max_ms,
        "retry_backoff_multiplier": float(retry.backoff_multiplier),
        **retry_bounds.bounds_config(body),
        "stuck_after_ms": body.stuck_after_ms,
    }


def _same_config(row: dict[str, Any], config: dict[str, Any]) -> bool:
    for name in _CONFIG_FIELDS:
        a, b = row[name], config[name]
        if name in ("retry_backoff_multiplier", "retry_bound_multiplier_max"):
            if (None if a is None else float(a)) != (None if b is None else float(b)):
                return False
        elif (None if a is None else int(a)) != b:
            return False
    return True


def queue_view(
    row: dict[str, Any],
    *,
    usage: dict[str, Any] | None = None,
    gates: dict[bytes, dict[str, Any]] | None = None,
    counts: dict[str, int] | None = None,
    stuck_tasks: int | None = None,
) -> dict[str, Any]:
    """The API queue object (config, gate, and when given usage and counts by state;
    ``stuck_tasks`` goes into ``usage``)."""
    gates = gates or {}
    gate = gates.get(row["id"])
    ns_gate = gates.get(NAMESPACE_GATE)
    out: dict[str, Any] = {
        "id": id_hex(row["id"]),
        "name": row["name"],
        "max_unfinished_tasks": row["max_unfinished_tasks"],
        "max_concurrency": row["max_concurrency"],
        "max_starts_per_second": row["max_starts_per_second"],
        "lease_ms": int(row["lease_ms"]),
        "retry": {
            "max_attempts": int(row["retry_max_attempts"]),
            "backoff_initial_ms": int(row["retry_backoff_initial_ms"]),
            "backoff_max_ms": int(row["retry_backoff_max_ms"]),
            "backoff_multiplier": float(row["retry_backoff_multiplier"]),
        },
        "retry_bounds": retry_bounds.bounds_view(row),
        "stuck_after_ms": row["stuck_after_ms"],
        "revision": int(row["revision"]),
        "created_at": format_opt(row["created_at"]),
        "updated_at": format_opt(row["updated_at"]),
        "paused": bool(gate and gate["paused"]),
        "gate": _gate_view(gate),
        "namespace_paused": bool(ns_gate and ns_gate["paused"]),
    }
    if counts is not None:
        out["counts"] = {s.value: counts.get(s.value, 0) for s in TaskState}
    if usage is not None:
        out["usage"] = usage_view(usage, stuck_tasks=stuck_tasks)
        # Dispatch backpressure made visible: the dispatcher offers a queue's tasks only
        # while it has free permits (docs/dispatch.md "Capacity from permits"); withheld
        # capacity is counted per node in pulse_dispatch_denials_total{kind="queue_permits"}.
        limit = row["max_concurrency"]
        held = out["usage"]["active_attempts"] + out["usage"]["reservations"]
        out["usage"]["free_permits"] = None if limit is None else max(0, int(limit) - held)
    return out


#: Columns of ``pulse_queue_usage`` that are keys, not counters.
_USAGE_KEYS = frozenset({"namespace_id", "queue_id"})
#: Prefix of the denial counters: column ``denials_<kind>`` is shown as ``denials.<kind>``.
_DENIALS = "denials_"
#: Denial kinds always shown (0 when the row lacks the column).
_DENIAL_KINDS = ("quota", "permits", "rate", "key", "application")


def usage_view(usage: dict[str, Any], *, stuck_tasks: int | None = None) -> dict[str, Any]:
    """Live counters of a queue (not part of its revision).

    Every column the usage row was read with is shown, so a counter added by a later
    migration appears once its store query selects it: each ``denials_<kind>`` column under
    ``denials.<kind>`` (quota, permits, rate, key, application, and any other kind), any other
    column under its own name (datetimes in RFC 3339). ``stuck_tasks`` (tasks currently
    surfaced by the stuck-work watchdog, ``pulse.watchdog``) is added when given.
    """
    out: dict[str, Any] = {
        "unfinished_tasks": int(usage["unfinished_tasks"]),
        "reservations": int(usage["reservations"]),
        "active_attempts": int(usage["active_attempts"]),
        "window_start": format_opt(usage["window_start"]),
        "window_starts": int(usage["window_starts"]),
    }
    denials = dict.fromkeys(_DENIAL_KINDS, 0)
    for name, value in usage.items():
        if name in _USAGE_KEYS or name in out:
            continue
        if name.startswith(_DENIALS):
            denials[name[len(_DENIALS) :]] = int(value or 0)
        else:
            out[name] = _usage_value(value)
    out["denials"] = denials
    if stuck_tasks is not None:
        out["stuck_tasks"] = stuck_tasks
    return out


def _usage_value(value: Any) -> Any:
    if isinstance(value, datetime):
        return format_opt(value)
    if isinstance(value, Decimal):
        return int(value) if value == value.to_integral_value() else float(value)
    if isinstance(value, bytes | bytearray):
        return bytes(value).hex()
    return value


def _gate_view(gate: dict[str, Any] | None) -> dict[str, Any]:
    if gate is None:
        return {"paused": False, "control_revision": 0, "updated_at": None}
    return {
        "paused": bool(gate["paused"]),
        "control_revision": int(gate["control_revision"]),
        "updated_at": format_opt(gate["updated_at"]),
    }


async def _full_view(tx: Tx, namespace_id: bytes, row: dict[str, Any]) -> dict[str, Any]:
    usage = await store.usage_get(tx, namespace_id, row["id"])
    gates = await store.gate_get_many(tx, namespace_id, [row["id"], NAMESPACE_GATE])
    counts = await store.queue_count_by_state(tx, namespace_id, row["id"])
    stuck = await watchdog_store.count_stuck_in_queue(tx, namespace_id, row["id"])
    return queue_view(row, usage=usage, gates=gates, counts=counts, stuck_tasks=stuck)


async def put_queue(
    db: Database,
    namespace_id: bytes,
    name: str,
    body: QueuePut,
    *,
    pre: Preconditions | None = None,
    actor: Actor | None = None,
    request_id: str | None = None,
    now: datetime | None = None,
) -> PutResult:
    """Create (``created``) or replace the configuration of queue ``name``.

    ``pre`` holds the request's ``If-Match`` / ``If-None-Match`` (see
    :class:`orbit.http.etag.Preconditions`), checked in the transaction against the locked
    row: ``If-Match: "<rev>"`` must name the current revision (412 otherwise, also when the
    queue is absent), ``If-Match: *`` needs the queue to exist, ``If-None-Match: *`` means
    create-only (412 when it exists). A concurrent create of the same name becomes an update
    of the winner's queue (or 412 with ``If-None-Match: *``).
    """
    pre = pre or Preconditions()
    config = _config(body)

    async def run(tx: Tx) -> PutResult:
        stamp = await clock_now(tx, now)
        row = await store.queue_get_by_name(tx, namespace_id, name, for_update=True)
        if row is None:
            pre.check(None)
            queue_id = new_id()
            try:
                await store.queue_insert(
                    tx,
                    {
                        "namespace_id": namespace_id,
                        "id": queue_id,
                        "name": name,
                        "now": stamp,
                        **config,
                    },
                )
            except DuplicateKey as exc:
                if exc.key != QUEUE_NAME_INDEX:
                    raise
                row = await store.queue_get_by_name(tx, namespace_id, name, for_update=True)
                if row is None:  # pragma: no cover - the winner committed before we re-read
                    raise
            else:
                await store.usage_insert(tx, namespace_id, queue_id)
                await audit.record(
                    tx, actor=actor, action="queues.put", resource_kind="queue",
                    resource_id=name, status_code=201, namespace_id=namespace_id,
                    request_id=request_id, details={"created": True}, now=stamp,
                )  # fmt: skip
                await transitions.record_queue_event(
                    tx,
                    namespace_id,
                    queue_id,
                    "queue.created",
                    {"name": name, "revision": 1},
                    request_id=request_id,
                    now=stamp,
                )
                created = await store.queue_get(tx, namespace_id, queue_id)
                assert created is not None
                return PutResult(await _full_view(tx, namespace_id, created), True)
        pre.check(int(row["revision"]))
        if not _same_config(row, config):
            ok = await store.queue_update_if_revision(
                tx,
                {
                    "namespace_id": namespace_id,
                    "id": row["id"],
                    "revision": row["revision"],
                    "now": stamp,
                    **config,
                },
            )
            assert ok, "queue row is locked FOR UPDATE"
            await audit.record(
                tx, actor=actor, action="queues.put", resource_kind="queue", resource_id=name,
                status_code=200, namespace_id=namespace_id, request_id=request_id,
                details={"revision": int(row["revision"]) + 1}, now=stamp,
            )  # fmt: skip
            await transitions.record_queue_event(
                tx,
                namespace_id,
                row["id"],
                "queue.updated",
                {"name": name, "revision": int(row["revision"]) + 1},
                request_id=request_id,
                now=stamp,
            )
            row = await store.queue_get(tx, namespace_id, row["id"])
            assert row is not None
        return PutResult(await _full_view(tx, namespace_id, row), False)

    return await db.transaction(run)


async def get_queue(db: Database, namespace_id: bytes, name: str) -> dict[str, Any]:
    """Config, gate, live counts by state and usage counters; 404 when absent."""

    async def run(tx: Tx) -> dict[str, Any]:
        row = await store.queue_get_by_name(tx, namespace_id, name)
        if row is None:
            raise QueueNotFound()
        return await _full_view(tx, namespace_id, row)

    return await db.read(run)


def _encode_cursor(after_name: str) -> str:
    raw = msgspec.json.encode({"k": "queues", "n": after_name})
    return base64.urlsafe_b64encode(raw).decode().rstrip("=")


def _decode_cursor(cursor: str) -> str:
    try:
        raw = base64.urlsafe_b64decode(cursor + "=" * (-len(cursor) % 4))
        data = msgspec.json.decode(raw, type=dict[str, str])
    except (ValueError, msgspec.DecodeError) as exc:
        raise CursorMismatch("malformed cursor") from exc
    if data.get("k") != "queues" or "n" not in data:
        raise CursorMismatch()
    return data["n"]


async def list_queues(
    db: Database, namespace_id: bytes, *, limit: int = 50, cursor: str | None = None
) -> dict[str, Any]:
    """Queues by name with gate and usage: ``{"items", "next_cursor"}``."""
    after = _decode_cursor(cursor) if cursor else ""

    async def run(tx: Tx) -> dict[str, Any]:
        rows = await store.queue_list_after(tx, namespace_id, after, limit + 1)
        more = len(rows) > limit
        rows = rows[:limit]
        ids = [r["id"] for r in rows]
        usage = await store.usage_get_many(tx, namespace_id, ids)
        gates = await store.gate_get_many(tx, namespace_id, [*ids, NAMESPACE_GATE])
        items = [queue_view(r, usage=usage.get(r["id"]), gates=gates) for r in rows]
        return {
            "items": items,
            "next_cursor": _encode_cursor(rows[-1]["name"]) if more and rows else None,
        }

    return await db.read(run)


async def set_queue_paused(
    db: Database,
    namespace_id: bytes,
    name: str,
    paused: bool,
    *,
    actor: Actor | None = None,
    request_id: str | None = None,
    now: datetime | None = None,
) -> dict[str, Any]:
    """Pause (close) or resume (open) the queue's gate; idempotent. Returns the queue view."""

    async def run(tx: Tx) -> dict[str, Any]:
        row = await store.queue_get_by_name(tx, namespace_id, name)
        if row is None:
            raise QueueNotFound()
        await _set_gate(tx, namespace_id, row["id"], paused, request_id, now, actor, name)
        return await _full_view(tx, namespace_id, row)

    return await db.transaction(run)


async def set_namespace_paused(
    db: Database,
    namespace_id: bytes,
    paused: bool,
    *,
    actor: Actor | None = None,
    request_id: str | None = None,
    now: datetime | None = None,
) -> dict[str, Any]:
    """Pause or resume the namespace gate (every queue of the namespace); idempotent."""

    async def run(tx: Tx) -> dict[str, Any]:
        await _set_gate(tx, namespace_id, NAMESPACE_GATE, paused, request_id, now, actor, None)
        gates = await store.gate_get_many(tx, namespace_id, [NAMESPACE_GATE])
        return {"scope": "namespace", **_gate_view(gates.get(NAMESPACE_GATE))}

    return await db.transaction(run)


async def get_namespace_gate(db: Database, namespace_id: bytes) -> dict[str, Any]:
    """The namespace gate (open with control_revision 0 when never set)."""

    async def run(tx: Tx) -> dict[str, Any]:
        gates = await store.gate_get_many(tx, namespace_id, [NAMESPACE_GATE])
        return {"scope": "namespace", **_gate_view(gates.get(NAMESPACE_GATE))}

    return await db.read(run)


async def _set_gate(
    tx: Tx,
    namespace_id: bytes,
    queue_id: bytes,
    paused: bool,
    request_id: str | None,
    now: datetime | None,
    actor: Actor | None = None,
    queue_name: str | None = None,
) -> None:
    stamp = await clock_now(tx, now)
    # Decide under the gate's row lock: two concurrent pauses must make ONE change (one
    # event, one audit row), the second one being the idempotent no-op.
    before = await store.gate_lock(tx, namespace_id, queue_id)
    if before is None:
        if not paused:
            return  # never set: open already
        try:
            await store.gate_insert(tx, namespace_id, new_id(), queue_id, paused, stamp)
        except DuplicateKey as exc:
            if exc.key != store.GATE_SCOPE_INDEX:
                raise
            before = await store.gate_lock(tx, namespace_id, queue_id)  # the winner's row
            assert before is not None, "a duplicate gate is committed when we see 1062"
    if before is not None:
        if bool(before["paused"]) == paused:
            return  # idempotent: nothing changes, the control revision stays
        await store.gate_set(tx, namespace_id, new_id(), queue_id, paused, stamp)
    after = (await store.gate_get_many(tx, namespace_id, [queue_id]))[queue_id]
    if actor is not None:
        await audit.record(
            tx,
            actor=actor,
            action="queues.pause" if paused else "queues.resume",
            resource_kind="queue" if queue_name is not None else "namespace",
            resource_id=queue_name if queue_name is not None else namespace_id,
            status_code=200,
            namespace_id=namespace_id,
            request_id=request_id,
            details={"control_revision": int(after["control_revision"])},
            now=stamp,
        )
    await transitions.record_queue_event(
        tx,
        namespace_id,
        None if queue_id == NAMESPACE_GATE else queue_id,
        "gate.paused" if paused else "gate.resumed",
        {"control_revision": int(after["control_revision"])},
        request_id=request_id,
        now=stamp,
    )


async def gate_closed(tx: Tx, namespace_id: bytes, queue_id: bytes) -> bool:
    """True when the namespace gate or the queue's gate is paused (for start authorisation,
    inside the caller's transaction)."""
    return await store.gate_closed(tx, namespace_id, queue_id)


async def resolve_queue(tx: Tx, namespace_id: bytes, name: str) -> dict[str, Any]:
    """The queue row named ``name`` in the caller's transaction; 404 when absent."""
    row = await store.queue_get_by_name(tx, namespace_id, name)
    if row is None:
        raise QueueNotFound()
    return row
