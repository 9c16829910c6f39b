"""The submit requests: one task (``POST …/tasks``, alone or in a node round), a batch
(``POST …/tasks:batch``), each in its transaction with its idempotency record and audit
row — over :func:`pulse.submit.submit_in_tx`, which judges and writes the items.
"""

from __future__ import annotations

import contextlib
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any

import msgspec

from orbit import audit, idempotency
from orbit.audit import Actor
from orbit.business_json import enc_hook
from orbit.errors import InvalidRequest, OrbitError
from orbit.idempotency import IdemRequest, Reply
from orbit.ids import id_hex
from orbit.storage import Database, Tx
from pulse.errors import QueueQuotaExceeded
from pulse.store import queues as queue_store
from pulse.submit import submit_in_tx
from pulse.submit_items import MAX_BATCH, ItemResult, Submitted, decode_item, prepare, task_body
from pulse.submit_offer import IdleOffer, Offered
from pulse.submit_rows import _FreshViews
from pulse.types import TaskSubmit

OPERATION = "tasks.submit"


async def _perform(
    db: Database,
    namespace_id: bytes,
    owner_id: bytes,
    idem: IdemRequest | None,
    effect: Callable[[Tx, set[bytes], list[int]], Awaitable[tuple[int, Any]]],
    retention_s: int,
) -> Submitted:
    async def run(tx: Tx) -> Submitted:
        new_work: set[bytes] = set()
        refused: list[int] = []

        async def bound(tx: Tx) -> tuple[int, Any]:
            return await effect(tx, new_work, refused)

        reply = await idempotency.perform(
            tx, idem, namespace_id, OPERATION, id_hex(owner_id), bound, retention_s=retention_s
        )
        return Submitted(reply, frozenset(new_work), sum(refused))

    return await db.transaction(run)


async def submit_one(
    db: Database,
    namespace_id: bytes,
    owner_id: bytes,
    body: TaskSubmit,
    *,
    idem: IdemRequest | None = None,
    actor: Actor | None = None,
    request_id: str | None = None,
    retention_s: int = idempotency.DEFAULT_RETENTION_S,
    now: datetime | None = None,
) -> Submitted:
    """Submit one task: 201 with the task, 200 with the existing task (``deduplicated``).

    Raises 400 (invalid), 404 (unknown queue), 429 (quota; nothing is written except the
    queue's denial counter, in its own transaction). With ``idem`` the response is stored
    with the effect and replayed for the same key (``Submitted.replayed``).
    """
    prepare(0, body)  # 400 before any transaction

    async def effect(tx: Tx, new_work: set[bytes], _refused: list[int]) -> tuple[int, Any]:
        [res] = await submit_in_tx(
            tx, namespace_id, owner_id, [body], request_id=request_id, now=now
        )
        if res.error is not None:
            raise res.error  # rolls back everything, the idempotency claim included
        assert res.row is not None
        if res.status == 201:
            new_work.add(res.row["queue_id"])
            await _audit(tx, actor, namespace_id, res.row["id"], 201, {}, request_id)
        return res.status, task_body(res.row, deduplicated=res.deduplicated)

    try:
        return await _perform(db, namespace_id, owner_id, idem, effect, retention_s)
    except QueueQuotaExceeded as err:
        if err.scope == "queue":
            await _count_denial(db, namespace_id, body.queue)
        raise


@dataclass(frozen=True)
class SingleSubmit:
    """One ``POST …/tasks`` without an ``Idempotency-Key``, for :func:`submit_singles`."""

    body: TaskSubmit
    actor: Actor | None = None
    request_id: str | None = None


async def submit_singles(
    db: Database,
    namespace_id: bytes,
    owner_id: bytes,
    items: Sequence[SingleSubmit],
    *,
    now: datetime | None = None,
) -> list[Submitted | OrbitError]:
    """Single submits of one owner that arrived together, in ONE transaction; per item, in
    order, what :func:`submit_one` would return (its :class:`Submitted`) or raise (the
    error: 400, 404, 429). The one-group form of :func:`submit_round`."""
    return await submit_round(db, [(namespace_id, owner_id, item) for item in items], now=now)


#: One single submit of a round: (namespace id, owner id, the request).
SubmitItem = tuple[bytes, bytes, "SingleSubmit"]


async def submit_round(
    db: Database,
    items: Sequence[SubmitItem],
    *,
    now: datetime | None = None,
    offer: IdleOffer | None = None,
) -> list[Submitted | OrbitError]:
    """The single submits that reached this node while the previous round ran, of every
    namespace and owner, in ONE transaction (group commit, pulse/batcher.py); per item, in
    order, what :func:`submit_one` would return (its :class:`Submitted`) or raise (the
    error: 400, 404, 429).

    Only requests without an ``Idempotency-Key`` are grouped (a keyed request's stored
    response belongs to its own transaction). Each item is judged as it would be alone —
    quotas in arrival order, a second identical identity gets the first one's task (200) —
    and a refused item writes nothing of its own (its quota denial is counted), while the
    others commit. Each item keeps its own audit record and its events their request id.

    The round's (namespace, owner) groups run as :func:`submit_in_tx` together in one
    pipeline (:meth:`~orbit.storage.Tx.pipeline`), in (owner, namespace) order: each step of
    every group goes out in one round trip — the queue reads, then the usage locks of every
    group (application rows in id order, each followed by its namespace's queue rows: an
    application's row always comes before its namespaces' queue rows, as in every other
    transaction), then the identities, the inserts and the counters.

    With ``offer`` (this node's hub), a new task that a session waiting on this node can
    take is offered in the same transaction (pulse/submit_offer.py) and pushed after COMMIT;
    its answer is the task as leased.
    """
    out: list[Submitted | OrbitError | None] = [None] * len(items)
    groups: dict[tuple[bytes, bytes], list[int]] = {}
    for i, (ns, owner, item) in enumerate(items):
        try:
            prepare(0, item.body)
        except OrbitError as err:
            out[i] = err
        else:
            groups.setdefault((owner, ns), []).append(i)
    order = sorted(groups)

    async def group(tx: Tx, owner: bytes, ns: bytes, idxs: list[int]) -> list[ItemResult]:
        return await submit_in_tx(
            tx,
            ns,
            owner,
            [items[i][2].body for i in idxs],
            request_ids=[items[i][2].request_id for i in idxs],
            now=now,
        )

    async def run(tx: Tx) -> tuple[list[tuple[int, Submitted | OrbitError]], Offered]:
        per_group = await tx.pipeline(*(group(tx, o, n, groups[(o, n)]) for o, n in order))
        offered = Offered()
        if offer is not None:
            for (owner, ns), results in zip(order, per_group, strict=True):
                fresh = [r.row for r in results if r.status == 201 and r.row is not None]
                if fresh:
                    got = await offer.offer_in_tx(tx, ns, owner, fresh, now)
                    offered.pushes.extend(got.pushes)
                    offered.rows.update(got.rows)
        answers: list[tuple[int, Submitted | OrbitError]] = []
        audits: list[dict[str, Any]] = []
        for key, results in zip(order, per_group, strict=True):
            ns = key[1]
            for i, res in zip(groups[key], results, strict=True):
                item = items[i][2]
                if res.error is not None:
                    answers.append((i, res.error))
                    continue
                assert res.row is not None
                work: frozenset[bytes] = frozenset()
                row = res.row
                if res.status == 201:
                    leased = offered.rows.get(row["id"])
                    if leased is None:  # left WAITING: the dispatcher is woken for it
                        work = frozenset({row["queue_id"]})
                    else:
                        row = leased
                    audits.append(_audit_entry(item.actor, ns, row["id"], 201, {},
                                               item.request_id))  # fmt: skip
                body = _REPLY_ENCODER.encode(task_body(row, deduplicated=res.deduplicated))
                answers.append((i, Submitted(Reply(res.status, body, False), work)))
        await audit.record_many(tx, audits)  # every item's audit record: ONE INSERT
        return answers, offered

    if groups:
        answers, offered = await db.transaction(run)
        for i, answer in answers:
            out[i] = answer
        if offer is not None and offered.pushes:
            await offer.push(offered.pushes)
    return out  # type: ignore[return-value]


_REPLY_ENCODER = msgspec.json.Encoder(enc_hook=enc_hook)


async def _audit(
    tx: Tx,
    actor: Actor | None,
    namespace_id: bytes,
    task_id: bytes | None,
    status: int,
    details: dict[str, Any],
    request_id: str | None,
) -> None:
    if actor is None:
        return
    await audit.record(tx, **_audit_entry(actor, namespace_id, task_id, status, details,
                                          request_id))  # fmt: skip


def _audit_entry(
    actor: Actor | None,
    namespace_id: bytes,
    task_id: bytes | None,
    status: int,
    details: dict[str, Any],
    request_id: str | None,
) -> dict[str, Any]:
    """The keyword arguments of one submit's :func:`orbit.audit.record`."""
    return {
        "actor": actor,
        "action": OPERATION,
        "resource_kind": "task",
        "resource_id": task_id,
        "outcome": audit.outcome_for_status(status),
        "status_code": status,
        "namespace_id": namespace_id,
        "request_id": request_id,
        "details": details or None,
    }


async def _count_denial(db: Database, namespace_id: bytes, queue_name: str) -> None:
    async def run(tx: Tx) -> None:
        q = await queue_store.queue_get_by_name(tx, namespace_id, queue_name)
        if q is not None:
            await queue_store.queue_usage_add_quota_denials(tx, namespace_id, q["id"], 1)

    with contextlib.suppress(Exception):  # a counter must never replace the client's 429
        await db.transaction(run, retries=2)


async def submit_batch(
    db: Database,
    namespace_id: bytes,
    owner_id: bytes,
    items: Sequence[bytes | msgspec.Raw],
    *,
    allowed_queues: frozenset[str] | None = None,
    idem: IdemRequest | None = None,
    actor: Actor | None = None,
    request_id: str | None = None,
    retention_s: int = idempotency.DEFAULT_RETENTION_S,
    now: datetime | None = None,
) -> Submitted:
    """Submit up to :data:`MAX_BATCH` raw task bodies in one transaction.

    Answers 200 with ``{"items": [{"status", "task"?, "error"?}, ...]}`` in request order;
    valid items commit together, invalid ones (400/404/429) are reported and skipped.
    """
    if len(items) > MAX_BATCH:
        raise InvalidRequest(f"at most {MAX_BATCH} tasks per batch", field="tasks")
    decoded: list[TaskSubmit | OrbitError] = []
    for raw in items:
        try:
            decoded.append(decode_item(raw))
        except OrbitError as err:
            decoded.append(err)

    async def effect(tx: Tx, new_work: set[bytes], refused: list[int]) -> tuple[int, Any]:
        results = await submit_in_tx(
            tx,
            namespace_id,
            owner_id,
            decoded,
            allowed_queues=allowed_queues,
            request_id=request_id,
            now=now,
        )
        new_work.update(r.row["queue_id"] for r in results if r.status == 201 and r.row)
        denied = [i for i, r in enumerate(results) if r.status == 429]
        refused.append(len(denied))
        created = sum(1 for r in results if r.status == 201)
        if created:
            details: dict[str, Any] = {"items": len(results), "created": created}
            await _audit(tx, actor, namespace_id, None, 200, details, request_id)
        if denied:  # the per-item 429s: one conflict event for the call, naming the items
            details = {"code": "quota_exceeded", "kind": "quota_exceeded",
                       "items": len(results), "refused": denied}  # fmt: skip
            await _audit(tx, actor, namespace_id, None, 429, details, request_id)
        fresh = _FreshViews()
        return 200, {"items": [fresh.wire(r) for r in results]}

    return await _perform(db, namespace_id, owner_id, idem, effect, retention_s)


__all__ = [
    "OPERATION",
    "SingleSubmit",
    "submit_batch",
    "submit_one",
    "submit_round",
    "submit_singles",
]
