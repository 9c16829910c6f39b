"""The side-effect ledger behind ``ctx.effect(key, fn)``: exactly-once effects on
at-least-once execution.

A handler names each outside effect with a key that is stable across retries of the same
task. Before the effect the worker sends ``begin``; after it, ``commit`` with the effect's
result. The ledger row is keyed by (namespace, task, SHA-256 of the key), so every attempt of
the task sees the same row:

=========================================  ==========  ====================================
ledger row                                 ``begin``   ``commit``
=========================================  ==========  ====================================
none                                       ``new``     ``committed`` (stored now)
BEGUN by this attempt                      ``new``     ``committed`` (stored now)
BEGUN by an earlier attempt (crashed)      uncertain   ``committed`` (stored now)
COMMITTED                                  committed   ``committed`` (the stored result)
=========================================  ==========  ====================================

``committed`` always carries the stored result, so a handler never runs ``fn`` twice for a
committed key; ``uncertain`` means the effect may or may not have happened and the handler
(or an operator through NEEDS_REVIEW) decides. Only the current running attempt, proven by its
execution token, may use the ledger (else 409 ``stale_token``, nothing written).

Lock order: task → attempt → ledger row (no usage counters change).
"""

from __future__ import annotations

from datetime import datetime

import msgspec

from orbit.business_json import check_json_text
from orbit.errors import StaleToken
from orbit.ids import digest, digest_matches, id_hex, new_id
from orbit.storage import Database, Tx
from pulse import wire
from pulse.errors import AttemptNotFound
from pulse.store import attempts as attempt_store
from pulse.store import effects as store


def key_digest(key: str) -> bytes:
    """SHA-256 of the key's exact UTF-8 bytes."""
    return digest(key.encode("utf-8"))


async def effect(
    db: Database,
    namespace_id: bytes,
    attempt_id: bytes,
    execution_token: str,
    key: str,
    phase: str,
    result: msgspec.Raw | None = None,
    *,
    now: datetime | None = None,
) -> wire.EffectState:
    """Begin or commit an effect of the current running attempt; return the ledger state.

    Raises :class:`~pulse.errors.AttemptNotFound` and :class:`~orbit.errors.StaleToken`
    (wrong token, or the attempt is not the task's running generation any more).
    """
    kd = key_digest(key)
    result_text = (
        None if wire.is_null(result) else check_json_text(bytes(result), "result")  # type: ignore[arg-type]
    )

    async def run(tx: Tx) -> wire.EffectState | Exception:
        peek = await attempt_store.attempt_get(tx, namespace_id, attempt_id)
        if peek is None:
            return AttemptNotFound()
        task = await attempt_store.task_lock(tx, namespace_id, peek["task_id"])
        attempt = await attempt_store.attempt_lock(tx, namespace_id, attempt_id, now)
        if task is None or attempt is None:
            return AttemptNotFound()
        stored = attempt["execution_token_digest"]
        if stored is None or not digest_matches(execution_token, stored):
            return StaleToken(attempt_id=id_hex(attempt_id))
        t = attempt["db_now"]
        current = (
            attempt["state"] == "RUNNING"
            and task["state"] == "RUNNING"
            and task["current_attempt_id"] == attempt_id
            and attempt["lease_expires_at"] > t
        )
        if not current:
            return StaleToken("the attempt is no longer current", attempt_id=id_hex(attempt_id))
        row = await store.effect_lock(tx, namespace_id, task["id"], kd)
        if phase == "begin":
            if row is None:
                await store.effect_insert(
                    tx,
                    {
                        "namespace_id": namespace_id,
                        "id": new_id(),
                        "task_id": task["id"],
                        "effect_key": key,
                        "key_digest": kd,
                        "state": "BEGUN",
                        "attempt_id": attempt_id,
                        "generation": attempt["generation"],
                        "result": None,
                        "now": t,
                        "committed_at": None,
                    },
                )
                return _state(key, "new")
            if row["state"] == "COMMITTED":
                return _state(key, "committed", row["result"])
            if row["attempt_id"] == attempt_id:
                return _state(key, "new")
            return _state(key, "uncertain")
        # commit
        if row is None:
            await store.effect_insert(
                tx,
                {
                    "namespace_id": namespace_id,
                    "id": new_id(),
                    "task_id": task["id"],
                    "effect_key": key,
                    "key_digest": kd,
                    "state": "COMMITTED",
                    "attempt_id": attempt_id,
                    "generation": attempt["generation"],
                    "result": result_text,
                    "now": t,
                    "committed_at": t,
                },
            )
            return _state(key, "committed", result_text)
        if row["state"] == "COMMITTED":
            return _state(key, "committed", row["result"])
        await store.effect_commit_if_begun(
            tx,
            {
                "namespace_id": namespace_id,
                "id": row["id"],
                "result": result_text,
                "attempt_id": attempt_id,
                "generation": attempt["generation"],
                "now": t,
                "revision": row["revision"],
            },
        )
        return _state(key, "committed", result_text)

    outcome = await db.transaction(run)
    if isinstance(outcome, Exception):
        raise outcome
    return outcome


def _state(key: str, state: str, result: str | None = None) -> wire.EffectState:
    raw = wire.NULL if result is None else msgspec.Raw(result.encode())
    return wire.EffectState(ref_msg_id=None, key=key, state=state, result=raw)  # type: ignore[arg-type]
