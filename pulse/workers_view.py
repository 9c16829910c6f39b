"""The operator's view of worker sessions, and closing a session on an operator's request.

:func:`list_workers` pages through a namespace's sessions (ACTIVE by default) by id. Each
one carries its instance (host, pid, SDK and version), the queues it takes work from, its
capacity (``max_concurrency``), the attempts it holds (``in_flight`` = offered + running,
exact; a sample of them, at most :data:`ATTEMPTS_SHOWN`), when it last heartbeated and how
long ago (``heartbeat_age_ms``, by the database clock), when it expires, and the node that
holds its stream (``node``; null while no stream or long-poll is attached).

:func:`close_worker` ends a session as its worker would (:func:`pulse.sessions.close_session`):
its offers are released, its running attempts are lost exactly as when a session expires —
retried when ``retry_safe``, FAILED on the last attempt, else NEEDS_REVIEW with
``effect_uncertain`` — with reason ``closed_by_operator``, audited ``workers.close``. A
worker process whose session is closed opens a new one (closing is not stopping a worker:
pause its queues or stop the process for that).
"""

from __future__ import annotations

from datetime import datetime, timedelta
from typing import Any

import msgspec

from orbit.audit import Actor
from orbit.errors import InvalidRequest, NotFound
from orbit.ids import id_hex, parse_id
from orbit.pagination import decode_cursor, encode_cursor
from orbit.storage import Database, Tx
from orbit.store.clock import clock_now
from orbit.times import format_opt, format_time
from pulse import sessions, wire
from pulse.store import sessions as session_store
from pulse.store import workers_view as store

#: Attempts listed per session at most (``in_flight`` counts them all).
ATTEMPTS_SHOWN = 20
#: Session states a list may filter on; ``any`` lists every state.
STATES = ("ACTIVE", "CLOSED", "EXPIRED")


class SessionNotFound(NotFound):
    """No such worker session in this namespace."""

    def __init__(self) -> None:
        super().__init__("worker session")


def _queues(value: Any) -> list[str]:
    names = msgspec.json.decode(value) if isinstance(value, str | bytes) else value
    return [str(n) for n in names]


def session_view(
    row: dict[str, Any], counts: dict[str, int], attempts: list[dict[str, Any]], now: datetime
) -> dict[str, Any]:
    """One session as the workers view shows it."""
    lease = timedelta(milliseconds=int(row["lease_ms"]))
    last_heartbeat = row["expires_at"] - lease
    offered, running = counts.get("OFFERED", 0), counts.get("RUNNING", 0)
    capacity = int(row["max_concurrency"])
    live = row["state"] == "ACTIVE" and row["expires_at"] > now
    return {
        "id": id_hex(row["id"]),
        "state": row["state"],
        "live": live,
        "instance": {
            "id": id_hex(row["instance_id"]),
            "host": row["host"],
            "pid": None if row["pid"] is None else int(row["pid"]),
            "sdk": row["sdk"],
            "created_at": format_opt(row["instance_created_at"]),
            "last_seen_at": format_opt(row["last_seen_at"]),
        },
        "sdk": row["sdk"],
        "application_id": id_hex(row["application_id"]),
        "credential_id": id_hex(row["credential_id"]),
        "queues": _queues(row["queues"]),
        "capacity": capacity,
        "concurrency_keys": bool(row["concurrency_keys"]),
        "in_flight": offered + running,
        "offered": offered,
        "running": running,
        "free": max(0, capacity - offered - running) if live else 0,
        "attempts": [
            {
                "id": id_hex(a["id"]),
                "task_id": id_hex(a["task_id"]),
                "generation": int(a["generation"]),
                "state": a["state"],
                "offered_at": format_opt(a["offered_at"]),
                "started_at": format_opt(a["started_at"]),
                "lease_expires_at": format_opt(a["lease_expires_at"]),
            }
            for a in attempts
        ],
        "node": row["node_id"],
        "connected": row["node_id"] is not None,
        "heartbeat_ms": int(row["heartbeat_ms"]),
        "lease_ms": int(row["lease_ms"]),
        "last_heartbeat_at": format_time(last_heartbeat),
        "heartbeat_age_ms": max(0, int((now - last_heartbeat) / timedelta(milliseconds=1))),
        "expires_at": format_time(row["expires_at"]),
        "created_at": format_time(row["created_at"]),
        "closed_at": format_opt(row["closed_at"]),
    }


async def list_workers(
    db: Database,
    namespace_id: bytes,
    *,
    state: str | None = "ACTIVE",
    queue: str | None = None,
    limit: int = 50,
    cursor: str | None = None,
    now: datetime | None = None,
) -> dict[str, Any]:
    """``{"sessions": [...], "next_cursor"}``, by session id. ``state``: one of
    :data:`STATES`, or None for every state; ``queue``: only sessions that take work from
    it. A cursor is bound to its filters (400 otherwise)."""
    if state is not None and state not in STATES:
        raise InvalidRequest("state must be ACTIVE, CLOSED, EXPIRED or any", field="state")
    filters = {"list": "workers", "state": state, "queue": queue}
    position = decode_cursor(cursor, filters)
    after = b""
    if position is not None:
        parsed = parse_id(str(position.get("after", "")))
        if parsed is None:
            raise InvalidRequest("cursor is not valid", field="cursor")
        after = parsed

    async def run(tx: Tx) -> dict[str, Any]:
        stamp = await clock_now(tx, now)
        rows = await store.session_page(tx, namespace_id, state, queue, after, limit + 1)
        more = len(rows) > limit
        rows = rows[:limit]
        ids = [r["id"] for r in rows]
        counts: dict[bytes, dict[str, int]] = {}
        sample: list[dict[str, Any]] = []
        if ids:
            counts, sample = await tx.pipeline(
                store.session_held_counts(tx, namespace_id, ids),
                store.session_held_sample(tx, namespace_id, ids, ATTEMPTS_SHOWN),
            )
        by_session: dict[bytes, list[dict[str, Any]]] = {}
        for a in sample:
            by_session.setdefault(a["session_id"], []).append(a)
        items = [
            session_view(r, counts.get(r["id"], {}), by_session.get(r["id"], []), stamp)
            for r in rows
        ]
        nxt = encode_cursor({"after": id_hex(rows[-1]["id"])}, filters) if more else None
        return {"sessions": items, "next_cursor": nxt}

    return await db.read(run)


async def close_worker(
    db: Database,
    namespace_id: bytes,
    session_id: str,
    *,
    actor: Actor | None = None,
    request_id: str | None = None,
) -> tuple[wire.SessionClosed, list[bytes]]:
    """Close session ``session_id`` for an operator (module docstring): the answer and the
    ids of the attempts it ended. 404 for an unknown session; a session that has already
    ended answers its state and changes nothing."""
    sid = parse_id(session_id)
    if sid is None:
        raise SessionNotFound()

    async def exists(tx: Tx) -> bool:
        return await session_store.session_get(tx, namespace_id, sid) is not None

    if not await db.read(exists):
        raise SessionNotFound()
    return await sessions.close_session(
        db, namespace_id, sid, reason=sessions.REASON_CLOSED_BY_OPERATOR, actor=actor,
        request_id=request_id,
    )  # fmt: skip


__all__ = ["ATTEMPTS_SHOWN", "STATES", "SessionNotFound", "close_worker", "list_workers"]
