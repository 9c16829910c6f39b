"""Retention purge of finished tasks (a part of :class:`orbit.retention_purge.RetentionPurge`).

A SUCCEEDED, FAILED or CANCELLED task goes, with its attempts (their receipts are columns of
the attempt), its evidence, its effect records and its identity row (a task with a dedup
key), once its state changed longer ago than both the namespace's ``finished_tasks_days``
and its idempotency window (a replayed submit never answers a task that is gone). Kept
whatever its age: a task with an attempt still offered or running, a task with evidence
younger than the window (a late report after the finish), and a task another package still
refers to (``keep``: Weave keeps the tasks of a workflow instance that is still running).

One batch is one transaction: lock up to ``batch`` candidates of one state with
``FOR UPDATE SKIP LOCKED`` on ``ix_pulse_tasks_state_age`` (a re-run holding a row is
passed over), then delete by primary-key prefixes. The pass keeps a cursor per state, so
tasks kept back are not read again in the same pass.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Sequence
from datetime import datetime, timedelta
from functools import partial

from orbit.retention_purge import PartResult, PurgePass
from orbit.storage import Tx
from orbit.store import retention as retention_store
from pulse.store import attempts as attempt_store
from pulse.store import effects as effect_store
from pulse.store import tasks as task_store

FINISHED = ("SUCCEEDED", "FAILED", "CANCELLED")
#: (tx, namespace_id, workflow task ids) -> the ids that must be kept.
Keep = Callable[[Tx, bytes, Sequence[bytes]], Awaitable[set[bytes]]]
_START = datetime(1970, 1, 1)


class TaskPurge:
    """The finished-tasks part; ``keep`` answers which workflow tasks are still needed."""

    def __init__(self, keep: Keep | None = None) -> None:
        self.keep = keep

    async def __call__(self, p: PurgePass) -> PartResult:
        out = PartResult()
        days = p.settings.finished_tasks_days
        if days is None:
            return out
        window = max(timedelta(days=days), timedelta(seconds=p.idempotency_s))
        cutoff = p.now - window
        evidence_cutoff = p.now - timedelta(days=days)
        for state in FINISHED:
            behind = await self._state(p, state, cutoff, evidence_cutoff, out)
            out.lag_s = max(out.lag_s, behind)
        return out

    async def _state(
        self, p: PurgePass, state: str, cutoff: datetime, evidence_cutoff: datetime,
        out: PartResult,
    ) -> float:  # fmt: skip
        """Batches of one state; returns the lag left (0 when caught up)."""
        after_t, after_id = _START, b""
        for _ in range(p.max_batches):
            batch = partial(self._batch, p=p, state=state, cutoff=cutoff,
                            evidence_cutoff=evidence_cutoff, after=(after_t, after_id))  # fmt: skip
            counts, last_t, last_id, seen = await p.run(batch)
            for table, n in counts.items():
                out.add(table, n)
            if last_t is None or seen < p.batch:
                return 0.0
            after_t, after_id = last_t, last_id
        return max(0.0, (cutoff - after_t).total_seconds())

    async def _batch(
        self, tx: Tx, *, p: PurgePass, state: str, cutoff: datetime, evidence_cutoff: datetime,
        after: tuple[datetime, bytes],
    ) -> tuple[dict[str, int], datetime | None, bytes, int]:  # fmt: skip
        """One batch: (rows deleted by table, position of the last candidate, candidates)."""
        ns = p.namespace_id
        rows = await task_store.task_purge_candidates(
            tx, ns, state, cutoff, after[0], after[1], p.batch
        )
        if not rows:
            return {}, None, b"", 0
        ids = [bytes(r["id"]) for r in rows]
        held = await attempt_store.attempt_tasks_in_flight(tx, ns, ids)
        held |= await attempt_store.evidence_tasks_since(tx, ns, ids, evidence_cutoff)
        flows = [bytes(r["id"]) for r in rows if r["source_kind"] == "workflow"]
        if flows and self.keep is not None:
            held |= await self.keep(tx, ns, flows)
        gone = [i for i in ids if i not in held]
        counts = {
            "pulse_attempts": await attempt_store.attempt_purge_for_tasks(tx, ns, gone),
            "pulse_attempt_evidence": await attempt_store.evidence_purge_for_tasks(tx, ns, gone),
            "pulse_effects": await effect_store.effect_purge_for_tasks(tx, ns, gone),
            "pulse_task_identities": await task_store.identity_purge_for_tasks(tx, ns, gone),
            "pulse_tasks": await task_store.task_purge_many(tx, ns, gone),
        }
        if any(counts.values()):
            await retention_store.retention_add_progress(tx, ns, sum(counts.values()))
        last = rows[-1]
        return counts, last["state_changed_at"], bytes(last["id"]), len(rows)


async def oldest_unfinished_task(tx: Tx, namespace_id: bytes) -> datetime | None:
    """Holder: the creation time of the namespace's oldest unfinished task (raw and result
    events younger than it are kept)."""
    return await task_store.task_oldest_unfinished(tx, namespace_id)


__all__ = ["FINISHED", "Keep", "TaskPurge", "oldest_unfinished_task"]
