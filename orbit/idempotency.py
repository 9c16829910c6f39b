"""Idempotency keys, usable by any package inside its own transaction.

Usage inside a service transaction (the claim must be the FIRST statement, before any other
row is locked, so a waiting duplicate holds nothing another transaction needs)::

    digest = idempotency.request_digest("POST", path, body)

    async def work(tx):
        replay = await idempotency.claim(tx, ns_id, "tasks.submit", scope, key, digest)
        if replay is not None:
            return replay                       # the original (status, body)
        ...effect...
        body = encode(response)
        await idempotency.store_response(tx, ns_id, "tasks.submit", scope, key, 201, body)
        return ...

Semantics (docs/api/admin.md#idempotency): same key + same digest → the stored response;
same key + different digest → :class:`~orbit.errors.IdempotencyMismatch` (422).

**Concurrent requests with the same key: the loser waits and replays.** The first request's
INSERT holds the unique-index record until its transaction ends; a second request's INSERT
blocks on it. When the first commits, the second gets 1062, re-reads the committed row and
replays it (or gets 422 for a different body); when the first rolls back, the second proceeds
as the first. Nobody sees ``idempotency_in_progress`` unless a caller claimed a key and
committed without storing a response (a bug), which answers 409 rather than guess. The wait is
bounded by ``innodb_lock_wait_timeout``; 1205 makes the transaction helper retry the whole
transaction.

Keys expire after the retention window (default 24 h); an expired row is replaced in place on
the next claim, and :func:`cleanup_once` deletes expired rows in bounded batches.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Mapping
from datetime import datetime
from typing import Any, NamedTuple

import msgspec

from orbit import business_json
from orbit.errors import IdempotencyInProgress, IdempotencyMismatch, InvalidRequest
from orbit.ids import digest, new_id
from orbit.storage import Database, DuplicateKey, Tx
from orbit.store import idempotency as store

#: Default retention window of a key, in seconds (docs/api/conventions.md#idempotency: 24 h).
DEFAULT_RETENTION_S = 24 * 3600
#: Name of the unique index that makes a key unique.
KEY_INDEX = "uq_orbit_idempotency_keys_key"
HEADER = "Idempotency-Key"
MAX_KEY_LENGTH = 128



class Replay(NamedTuple):
    """The stored response of an earlier request with the same key and digest."""

    status: int
    body: bytes


def validate_key(key: str) -> str:
    """Return ``key`` when it is 1–128 printable ASCII characters, else raise 400."""
    if not 1 <= len(key) <= MAX_KEY_LENGTH or not all(" " <= c <= "~" for c in key):
        raise InvalidRequest(
            "Idempotency-Key must be 1-128 printable ASCII characters", field=HEADER
        )
    return key


def canonical_json(body: bytes) -> bytes:
    """The canonical form of a JSON body: keys sorted, no whitespace, numbers kept as written
    (never rounded through a float, so different numbers never share a digest).

    An empty body is ``b""``; a body that is not JSON is used as is (it will be rejected
    with 400 anyway, and its digest must still be stable).
    """
    if not body.strip():
        return b""
    # Numbers by exact value: two bodies whose numbers differ only beyond double precision
    # (``0.30000000000000001`` vs ``0.3``) are different requests.
    return business_json.canonical_text(body)


def request_digest(method: str, path: str, body: bytes) -> bytes:
    """SHA-256 of ``METHOD\\npath\\ncanonical JSON body`` (BINARY(32))."""
    return digest(method.upper().encode() + b"\n" + path.encode() + b"\n" + canonical_json(body))


async def claim(
    tx: Tx,
    namespace_id: bytes,
    operation: str,
    scope: str,
    key: str,
    request_digest: bytes,
    *,
    retention_s: int = DEFAULT_RETENTION_S,
    now: datetime | None = None,
) -> Replay | None:
    """Claim ``key`` for this request in the caller's transaction.

    Returns None when the key is new (a pending row is now inserted: the caller performs the
    effect and calls :func:`store_response` in the same transaction), or the stored
    :class:`Replay` of an earlier request with the same digest. Raises IdempotencyMismatch
    (422) for a different digest and IdempotencyInProgress (409) for a committed row without
    a response. ``namespace_id`` is ``orbit.types.ZERO_ID`` for non-namespaced operations;
    ``scope`` separates resources inside a namespace (e.g. an application id), "" for none.
    """
    validate_key(key)
    if retention_s <= 0:
        raise ValueError("retention must be positive")
    for _ in range(3):
        row = await store.idempotency_get(tx, namespace_id, operation, scope, key, now)
        if row is not None:
            if not row["expired"]:
                return _replay(row, request_digest)
            await store.idempotency_delete_if_expired(tx, namespace_id, bytes(row["id"]), now)
        try:
            await store.idempotency_insert(
                tx,
                namespace_id,
                new_id(),
                operation,
                scope,
                key,
                request_digest,
                retention_s * 1_000_000,
                now,
            )
            return None
        except DuplicateKey as exc:
            if exc.key != KEY_INDEX:
                raise
            # The other request committed while we waited: loop to re-read and replay.
    raise IdempotencyInProgress()


def _replay(row: Mapping[str, Any], request_digest: bytes) -> Replay:
    if bytes(row["request_digest"]) != request_digest:
        raise IdempotencyMismatch(
            "this Idempotency-Key was used with a different request", field=HEADER
        )
    if row["response_status"] is None:
        raise IdempotencyInProgress()
    body = row["response_body"]
    assert isinstance(body, str)
    return Replay(int(row["response_status"]), body.encode())


async def store_response(
    tx: Tx,
    namespace_id: bytes,
    operation: str,
    scope: str,
    key: str,
    status: int,
    body: bytes | str,
) -> None:
    """Store the response of a claimed key in the same transaction as the effect.

    Raises RuntimeError when the key was not claimed in this transaction (a bug).
    """
    text = body.decode() if isinstance(body, bytes) else body
    ok = await store.idempotency_store_response_if_pending(
        tx, namespace_id, operation, scope, key, status, text
    )
    if not ok:
        raise RuntimeError(f"idempotency key {operation}/{scope} was not claimed in this tx")


async def cleanup_once(db: Database, limit: int = 1000, *, now: datetime | None = None) -> int:
    """Delete at most ``limit`` expired keys (all namespaces) in one short transaction.

    Returns the number deleted; a loop calls it until it returns less than ``limit``.
    """

    async def run(tx: Tx) -> int:
        return await store.idempotency_delete_expired_batch(tx, limit, now)

    return await db.transaction(run)


class IdemRequest(NamedTuple):
    """An ``Idempotency-Key`` and the digest of the request that carried it."""

    key: str
    digest: bytes


class Reply(NamedTuple):
    """A response produced by a service: status, encoded JSON body, replayed or not."""

    status: int
    body: bytes
    replayed: bool = False


_ENCODER = msgspec.json.Encoder(enc_hook=business_json.enc_hook)


async def perform(
    tx: Tx,
    idem: IdemRequest | None,
    namespace_id: bytes,
    operation: str,
    scope: str,
    effect: Callable[[Tx], Awaitable[tuple[int, Any]]],
    *,
    redact: Callable[[Any], Any] | None = None,
    retention_s: int = DEFAULT_RETENTION_S,
    now: datetime | None = None,
) -> Reply:
    """Run ``effect(tx)`` at most once per idempotency key, inside the caller's transaction.

    Without ``idem`` it simply runs the effect. With it: claim the key first (a replay
    returns the stored reply with ``replayed=True``), run the effect, encode its
    ``(status, body object)`` and store the response, all in ``tx``. ``redact`` maps the
    body object to the version that is stored and replayed (e.g. without a secret).
    Only successful effects are stored: an exception rolls the claim back with the effect.
    """
    if idem is not None:
        replay = await claim(
            tx, namespace_id, operation, scope, idem.key, idem.digest,
            retention_s=retention_s, now=now,
        )  # fmt: skip
        if replay is not None:
            return Reply(replay.status, replay.body, True)
    status, obj = await effect(tx)
    body = _ENCODER.encode(obj)
    if idem is not None:
        stored = body if redact is None else _ENCODER.encode(redact(obj))
        await store_response(tx, namespace_id, operation, scope, idem.key, status, stored)
    return Reply(status, body, False)
