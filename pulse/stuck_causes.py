"""Why a task is stuck: the cause the watchdog names in its stuck reason.

For each task it surfaces (pulse/watchdog.py), the watchdog looks, without taking a lock,
at what the dispatcher and the worker side look at, and names the first cause that holds:

========================== =================================================================
state                      causes, in the order they are judged (``code``)
========================== =================================================================
WAITING                    its deadline passed (``deadline_passed``); not due yet — a
                           retry's backoff or a delay (``not_due``); the namespace or the
                           queue is paused (``namespace_paused``, ``queue_paused``); no live
                           worker session takes work from the queue (``no_session``); it is
                           keyed and no session of the queue accepts keyed tasks
                           (``no_keyed_session``); its key is held by another attempt
                           (``key_held``); the queue's ``max_concurrency`` is taken
                           (``queue_concurrency``); its application's ``max_active_attempts``
                           or ``max_reservations`` is taken (``application_active_attempts``,
                           ``application_reservations``); the start-rate window of the queue
                           or the application is used up (``queue_start_rate``,
                           ``application_start_rate``); every session of the queue holds its
                           ``max_concurrency`` (``sessions_full``); else none it can see
                           (``dispatch``: older tasks and other owners go first)
LEASED                     offered, not started by the worker (``offered``); its session is
                           gone, recovery releases it (``session_gone``)
RUNNING                    a cancel was requested and the worker has not stopped
                           (``cancel_requested``); running on a session that is gone
                           (``session_gone``); running (``running``: which attempt, session,
                           host and pid, until when)
NEEDS_REVIEW               waiting for an operator's resolution (``review``)
========================== =================================================================

Each cause is a short text (appended to the reason, which is at most 255 characters) and a
stable code with details (in the ``task.stuck`` event's data).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import Any

from orbit.ids import id_hex
from orbit.store import resources as resources_store
from orbit.times import format_time
from pulse import transitions
from pulse.store import queues as queue_store
from pulse.store import watchdog as store

Row = dict[str, Any]
_WINDOW = timedelta(seconds=1)


@dataclass(frozen=True, slots=True)
class Cause:
    """One cause: a stable ``code``, the ``text`` of the stuck reason, event ``details``."""

    code: str
    text: str
    details: dict[str, Any] = field(default_factory=dict)


def _window_full(start: datetime | None, used: int, limit: int | None, now: datetime) -> bool:
    return limit is not None and start is not None and now < start + _WINDOW and used >= limit


@dataclass
class _QueueFacts:
    """What a queue's waiting tasks depend on, read once per queue per round."""

    name: str
    namespace_paused: bool
    queue_paused: bool
    sessions: list[Row]
    config: Row | None
    usage: Row | None
    owners: dict[bytes, Any]
    keys: dict[bytes, list[Row]]


async def _queue_facts(
    tx: Any, namespace_id: bytes, queue_id: bytes, name: str, waiting: Sequence[Row], now: datetime
) -> _QueueFacts:
    gates = await queue_store.gate_get_many(
        tx, namespace_id, [queue_store.NAMESPACE_GATE, queue_id]
    )
    owners: dict[bytes, Any] = {}
    for owner in sorted({r["owner_id"] for r in waiting}):
        owners[owner] = await resources_store.resources_get(tx, owner)
    keys: dict[bytes, list[Row]] = {}
    digests = sorted({r["concurrency_key_digest"] for r in waiting if r["concurrency_key_digest"]})
    for row in await store.key_holders(tx, namespace_id, digests):
        keys.setdefault(row["key_digest"], []).append(row)
    return _QueueFacts(
        name=name,
        namespace_paused=bool((gates.get(queue_store.NAMESPACE_GATE) or {}).get("paused")),
        queue_paused=bool((gates.get(queue_id) or {}).get("paused")),
        sessions=await store.sessions_of_queue(tx, namespace_id, name, now),
        config=await queue_store.queue_get(tx, namespace_id, queue_id),
        usage=await queue_store.usage_get(tx, namespace_id, queue_id),
        owners=owners,
        keys=keys,
    )


def _waiting_cause(task: Row, f: _QueueFacts, now: datetime) -> Cause:
    q = f.name
    if task["deadline_at"] is not None and task["deadline_at"] <= now:
        at = format_time(task["deadline_at"])
        return Cause("deadline_passed", f"its deadline {at} passed: the deadline sweep fails it")
    if task["available_at"] is not None and task["available_at"] > now:
        at = format_time(task["available_at"])
        return Cause("not_due", f"not due before {at} (a retry's backoff or a delay)",
                     {"available_at": at})  # fmt: skip
    if f.namespace_paused:
        return Cause("namespace_paused", "the namespace is paused")
    if f.queue_paused:
        return Cause("queue_paused", f"queue {q} is paused")
    if not f.sessions:
        return Cause("no_session", f"no live worker session takes work from queue {q}")
    digest = task["concurrency_key_digest"]
    if digest is not None:
        keyed = [s for s in f.sessions if s["concurrency_keys"]]
        if not keyed:
            return Cause(
                "no_keyed_session",
                f"it has a concurrency key and none of the {len(f.sessions)} worker sessions "
                f"on queue {q} accepts keyed tasks (concurrency_keys false)",
                {"sessions": len(f.sessions)},
            )
        holders = [h for h in f.keys.get(digest, []) if h["attempt_id"] is not None]
        limit_rows = f.keys.get(digest, [])
        if limit_rows and int(limit_rows[0]["held"]) >= int(limit_rows[0]["max_permits"]):
            if holders:
                h = holders[0]
                return Cause(
                    "key_held",
                    f"its concurrency key is held by attempt {id_hex(h['attempt_id'])} "
                    f"(task {id_hex(h['task_id']) if h['task_id'] else '?'})",
                    {"attempt_id": id_hex(h["attempt_id"]),
                     "task_id": id_hex(h["task_id"]) if h["task_id"] else None},
                )  # fmt: skip
            return Cause("key_held", "its concurrency key is held to its limit")
    cfg, usage = f.config or {}, f.usage or {}
    limit = cfg.get("max_concurrency")
    running, offered = int(usage.get("active_attempts") or 0), int(usage.get("reservations") or 0)
    if limit is not None and running + offered >= int(limit):
        return Cause(
            "queue_concurrency",
            f"queue {q}'s max_concurrency {int(limit)} is taken ({running} running, "
            f"{offered} offered)",
            {"max_concurrency": int(limit), "running": running, "offered": offered},
        )
    app = f.owners.get(task["owner_id"])
    if app is not None:
        if app.max_active_attempts is not None and (
            app.active_attempts + app.reservations >= app.max_active_attempts
        ):
            return Cause(
                "application_active_attempts",
                f"its application's max_active_attempts {app.max_active_attempts} is taken",
                {"max_active_attempts": app.max_active_attempts},
            )
        if app.max_reservations is not None and app.reservations >= app.max_reservations:
            return Cause(
                "application_reservations",
                f"its application's max_reservations {app.max_reservations} is taken",
                {"max_reservations": app.max_reservations},
            )
    rate = cfg.get("max_starts_per_second")
    if _window_full(usage.get("window_start"), int(usage.get("window_starts") or 0), rate, now):
        return Cause("queue_start_rate",
                     f"queue {q}'s start rate ({rate}/s) is used up in this second")  # fmt: skip
    if app is not None and _window_full(
        app.window_start, app.window_starts, app.max_starts_per_second, now
    ):
        return Cause(
            "application_start_rate",
            f"its application's start rate ({app.max_starts_per_second}/s) is used up in "
            "this second",
        )
    if all(int(s["held"]) >= int(s["max_concurrency"]) for s in f.sessions):
        return Cause(
            "sessions_full",
            f"every worker session on queue {q} ({len(f.sessions)}) holds its max_concurrency",
            {"sessions": len(f.sessions)},
        )
    return Cause(
        "dispatch",
        f"nothing Orbit can see blocks it ({len(f.sessions)} live sessions on queue {q}): "
        "older tasks and other owners' tasks go first",
    )


def _holder_text(a: Row) -> str:
    who = f"session {id_hex(a['session_id'])}"
    if a.get("host"):
        who += f" ({a['host']} pid {a['pid']})"
    return who


def _attempt_cause(task: Row, a: Row | None, now: datetime) -> Cause:
    state = task["state"]
    if a is None:
        return Cause("session_gone", "its current attempt is gone: recovery decides")
    aid = id_hex(a["id"])
    alive = a["session_state"] == "ACTIVE" and (
        a["session_expires_at"] is not None and a["session_expires_at"] > now
    )
    details = {"attempt_id": aid, "session_id": id_hex(a["session_id"])}
    if not alive:
        return Cause(
            "session_gone",
            f"attempt {aid}'s {_holder_text(a)} is no longer active: recovery takes it back",
            details,
        )
    lease = format_time(a["lease_expires_at"]) if a["lease_expires_at"] else "?"
    if state == "LEASED":
        return Cause(
            "offered",
            f"offered to {_holder_text(a)} as attempt {aid} (offer lease until {lease}): the "
            "worker has not started it",
            details,
        )
    if task["cancel_requested"]:
        return Cause(
            "cancel_requested",
            f"a cancel was requested and attempt {aid} on {_holder_text(a)} has not stopped",
            details,
        )
    return Cause("running", f"attempt {aid} runs on {_holder_text(a)}, lease until {lease}",
                 details)  # fmt: skip


def _review_cause(task: Row) -> Cause:
    error = transitions.json_value(task["error"]) or {}
    what = error.get("message") if isinstance(error, dict) else None
    text = "waiting for an operator to resolve it (POST …/tasks/{id}/resolve)"
    if what:
        text = f"{what}; waiting for an operator to resolve it"
    return Cause("review", text)


async def diagnose(
    tx: Any,
    namespace_id: bytes,
    queue_id: bytes,
    queue_name: str,
    tasks: Sequence[Row],
    now: datetime,
) -> dict[bytes, Cause]:
    """The cause of each of ``tasks`` (rows of one queue, as the watchdog claimed them), by
    task id. Reads only: no lock is taken, so it never waits on dispatch or workers."""
    out: dict[bytes, Cause] = {}
    waiting = [t for t in tasks if t["state"] == "WAITING"]
    if waiting:
        facts = await _queue_facts(tx, namespace_id, queue_id, queue_name, waiting, now)
        for t in waiting:
            out[t["id"]] = _waiting_cause(t, facts, now)
    held = [t for t in tasks if t["state"] in ("LEASED", "RUNNING")]
    ids = [t["current_attempt_id"] for t in held if t["current_attempt_id"] is not None]
    attempts = await store.current_attempts(tx, namespace_id, ids)
    for t in held:
        out[t["id"]] = _attempt_cause(t, attempts.get(t["current_attempt_id"]), now)
    for t in tasks:
        if t["state"] == "NEEDS_REVIEW":
            out[t["id"]] = _review_cause(t)
    return out


__all__ = ["Cause", "diagnose"]
