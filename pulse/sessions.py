"""Worker instances and sessions: registration, session tokens, authentication, node binding.

A worker process registers an *instance* (host, pid, SDK) and opens a *session* per
connection: the queues it takes work from, how many attempts it may hold at once
(``max_concurrency``, offered + running), whether it handles keyed tasks. The session token is
shown once; only its SHA-256 digest is stored. Its format is
``pws_<namespace id>_<session id>_<secret>`` (ids in 32 hex) so any request carrying it finds
the session row by primary key without a scan.

A session lives ``lease_ms`` past its last heartbeat (database clock). When it expires,
recovery marks it EXPIRED and recovers its attempts (pulse/recovery.py). A worker whose
stream drops reconnects with the *same* session while it is alive: only heartbeats of the
session that holds an attempt extend it.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any

import msgspec

from orbit import audit
from orbit import events as orbit_events
from orbit.errors import Conflict, Forbidden, InvalidRequest, Unauthenticated
from orbit.ids import digest, digest_matches, id_hex, new_id, new_secret, parse_id
from orbit.storage import Database, DuplicateKey, Tx
from orbit.store.clock import clock_now
from orbit.times import format_opt, format_time
from orbit.types import NAME_RE
from pulse import transitions, wire
from pulse.attempts import Change, lose_running, release_offer
from pulse.errors import QueueNotFound
from pulse.keyed_waiting import keyed_waiting_queues
from pulse.rounds import settings_from_env
from pulse.store import attempts as attempt_store
from pulse.store import queues as queue_store
from pulse.store import sessions as store

TOKEN_PREFIX = "pws"
_TOKEN_RE = re.compile(r"pws_([0-9a-f]{32})_([0-9a-f]{32})_([A-Za-z0-9_\-]{16,128})")
EVENT_SESSION_OPENED = "worker.session_opened"
EVENT_SESSION_EXPIRED = "worker.session_expired"
EVENT_SESSION_CLOSED = "worker.session_closed"
#: Reason recorded on the attempts of a session its worker closed.
REASON_SESSION_CLOSED = "session_closed"
#: Reason recorded on the attempts of a session an operator closed.
REASON_CLOSED_BY_OPERATOR = "closed_by_operator"


@dataclass(frozen=True, slots=True)
class WorkerSettings:
    """Tunables of the worker side; ``ORBIT_PULSE_<NAME>`` environment overrides."""

    #: Heartbeat interval told to workers (lowered to a third of the shortest queue lease).
    heartbeat_ms: int = 5_000
    #: A session expires this long after its last heartbeat (at least 3 heartbeats).
    session_lease_ms: int = 30_000
    #: Lease of an offer: the worker must ``start`` it within this time.
    offer_lease_ms: int = 10_000
    #: Longest long-poll wait (``?wait_ms=`` is capped to it).
    poll_max_wait_ms: int = 30_000
    #: Accepted and ignored (kept so existing ``ORBIT_PULSE_DISPATCH_BATCH`` settings still
    #: parse): the node's dispatch round offers each session up to its free slots, at most
    #: 256 a pool per round (pulse/dispatch_round.py ``POOL_MAX_OFFERS``).
    dispatch_batch: int = 32
    #: Most offered attempts a session holds not started yet, in percent of its
    #: max_concurrency (rounded up; 0: no limit but max_concurrency), while one of its queues
    #: is shared by several fairness subjects (seen by a look in the last 10 s): a shallower
    #: offer pipeline, so a task of a subject new in play waits behind fewer tasks already
    #: offered. A start by a session the limit cut wakes the dispatcher.
    offer_depth_percent: int = 0
    #: Dispatcher polling interval across nodes (within a node, new work wakes it at once).
    dispatch_poll_ms: int = 250
    #: Longest polling interval of a dispatcher whose looks keep finding nothing due: after
    #: each empty round the interval doubles from ``dispatch_poll_ms`` up to this; any work,
    #: wake-up or due time brings it back. Work submitted on another node is found within it.
    dispatch_idle_poll_ms: int = 1_000
    #: Recovery loop interval and batch size.
    recovery_interval_ms: int = 1_000
    recovery_batch: int = 200
    #: How often a stream that does not accept keyed tasks is told which of its queues have
    #: keyed tasks waiting (``keyed_waiting`` on a heartbeat answer; pulse/keyed_waiting.py).
    keyed_check_ms: int = 60_000

    @classmethod
    def from_env(cls, env: dict[str, str] | None = None, **overrides: int) -> WorkerSettings:
        return settings_from_env(cls, env, overrides)


@dataclass(frozen=True, slots=True)
class QueueRef:
    """A queue a session declared, resolved to its id."""

    id: bytes
    name: str
    lease_ms: int


@dataclass(frozen=True, slots=True)
class SessionInfo:
    """An authenticated session (the row, as judged at authentication time)."""

    namespace_id: bytes
    namespace_name: str
    session_id: bytes
    instance_id: bytes
    application_id: bytes
    credential_id: bytes
    queues: tuple[str, ...]
    max_concurrency: int
    concurrency_keys: bool
    heartbeat_ms: int
    lease_ms: int
    expires_at: datetime

    @property
    def key(self) -> tuple[bytes, bytes]:
        return (self.namespace_id, self.session_id)


def format_token(namespace_id: bytes, session_id: bytes, secret: str) -> str:
    return f"{TOKEN_PREFIX}_{id_hex(namespace_id)}_{id_hex(session_id)}_{secret}"


def parse_token(token: str | None) -> tuple[bytes, bytes] | None:
    """(namespace id, session id) of a well-formed session token, else None."""
    if not token:
        return None
    m = _TOKEN_RE.fullmatch(token)
    if m is None:
        return None
    ns, sid = parse_id(m.group(1)), parse_id(m.group(2))
    return None if ns is None or sid is None else (ns, sid)


def _queue_names(names: list[str]) -> list[str]:
    out: list[str] = []
    for i, name in enumerate(names):
        if not NAME_RE.fullmatch(name):
            raise InvalidRequest("not a valid queue name", field=f"queues[{i}]")
        if name not in out:
            out.append(name)
    return out


async def create_session(
    db: Database,
    *,
    namespace_id: bytes,
    application_id: bytes,
    credential_id: bytes,
    allowed_queues: frozenset[str] | None,
    body: wire.SessionCreate,
    settings: WorkerSettings,
    actor: audit.Actor | None = None,
    request_id: str | None = None,
    now: datetime | None = None,
) -> wire.SessionCreated:
    """Register (or refresh) the instance and open a session; return the token (once).

    404 when a queue does not exist in the namespace; 403 when the credential may not use
    it; 409 when the given instance id belongs to another application.
    """
    queues = _queue_names(body.queues)
    for i, name in enumerate(queues):
        if allowed_queues is not None and name not in allowed_queues:
            raise Forbidden(f"the key may not use queue {name!r}", field=f"queues[{i}]")
    instance_id: bytes
    if body.instance.id is None:
        instance_id = new_id()
    else:
        parsed = parse_id(body.instance.id)
        if parsed is None:
            raise InvalidRequest("instance.id must be 32 lowercase hex", field="instance.id")
        instance_id = parsed
    session_id = new_id()
    secret = new_secret(32)
    token = format_token(namespace_id, session_id, secret)

    async def run(tx: Tx) -> wire.SessionCreated:
        t = await clock_now(tx, now)
        leases: list[int] = []
        queue_ids: list[tuple[str, bytes]] = []
        for name in queues:
            # Shared lock: a queue delete waits for this session (and then sees it).
            q = await queue_store.queue_get_by_name(tx, namespace_id, name, shared=True)
            if q is None:
                raise QueueNotFound()
            leases.append(int(q["lease_ms"]))
            queue_ids.append((name, q["id"]))
        heartbeat_ms = max(100, min(settings.heartbeat_ms, min(leases) // 3))
        lease_ms = max(settings.session_lease_ms, 3 * heartbeat_ms)
        await _upsert_instance(tx, namespace_id, instance_id, application_id, body.instance, t)
        await store.session_insert(
            tx,
            {
                "namespace_id": namespace_id,
                "id": session_id,
                "instance_id": instance_id,
                "application_id": application_id,
                "credential_id": credential_id,
                "token_digest": digest(token),
                "queues": msgspec.json.encode(queues).decode(),
                "max_concurrency": body.max_concurrency,
                "concurrency_keys": int(body.concurrency_keys),
                "heartbeat_ms": heartbeat_ms,
                "lease_ms": lease_ms,
                "expires_at": t + timedelta(milliseconds=lease_ms),
                "now": t,
            },
        )
        await orbit_events.append_event(
            tx,
            namespace_id,
            EVENT_SESSION_OPENED,
            "worker_session",
            session_id,
            {
                "instance_id": id_hex(instance_id),
                "queues": queues,
                "max_concurrency": body.max_concurrency,
                "host": body.instance.host,
                "pid": body.instance.pid,
                "sdk": body.instance.sdk,
            },
            now=t,
        )
        if actor is not None:
            await audit.record(
                tx,
                actor=actor,
                action="workers.connect",
                resource_kind="worker_session",
                resource_id=session_id,
                status_code=201,
                namespace_id=namespace_id,
                request_id=request_id,
                details={"instance_id": id_hex(instance_id), "queues": queues},
                now=t,
            )
        keyed_waiting: list[str] = []
        if not body.concurrency_keys:  # tell the worker what waits for another worker
            keyed_waiting = await keyed_waiting_queues(tx, namespace_id, queue_ids)
        return wire.SessionCreated(
            session_id=id_hex(session_id),
            session_token=token,
            instance_id=id_hex(instance_id),
            heartbeat_ms=heartbeat_ms,
            lease_ms=lease_ms,
            keyed_waiting=keyed_waiting,
        )

    return await db.transaction(run)


async def _upsert_instance(
    tx: Tx,
    namespace_id: bytes,
    instance_id: bytes,
    application_id: bytes,
    info: wire.InstanceInfo,
    now: datetime,
) -> None:
    row = {
        "namespace_id": namespace_id,
        "id": instance_id,
        "application_id": application_id,
        "host": info.host,
        "pid": info.pid,
        "sdk": info.sdk,
        "now": now,
    }
    existing = await store.instance_lock(tx, namespace_id, instance_id)
    if existing is None:
        try:
            await store.instance_insert(tx, row)
            return
        except DuplicateKey:  # registered concurrently: refresh it instead
            existing = await store.instance_lock(tx, namespace_id, instance_id)
            assert existing is not None
    if existing["application_id"] != application_id:
        raise Conflict("this instance id is registered by another application", kind="instance")
    # The row is locked: its revision cannot move before this update.
    ok = await store.instance_update_if_revision(tx, {**row, "revision": existing["revision"]})
    assert ok, "the instance row is locked"


async def authenticate(
    db: Database,
    namespace_name: str,
    token: str | None,
    session_id_hex: str | None = None,
    *,
    now: datetime | None = None,
    allow_ended: bool = False,
) -> SessionInfo:
    """Verify a session token, for ``/namespaces/{ns}/workers/sessions/{sid}/…`` (pass the
    path's ``sid``) or ``/namespaces/{ns}/attempts/{aid}/…`` (the token names the session).

    401 (same message whatever the cause): malformed or wrong token, unknown session, a
    session of another namespace or another ``sid``, expired or closed, its credential
    revoked or expired, or its application disabled. ``allow_ended`` accepts a session
    that is no longer ACTIVE (closing it again is a no-op, not a 401).
    """
    parsed = parse_token(token)
    if parsed is None or token is None:
        raise Unauthenticated("missing or invalid session token")
    namespace_id, session_id = parsed
    if session_id_hex is not None and parse_id(session_id_hex) != session_id:
        raise Unauthenticated("missing or invalid session token")

    async def run(tx: Tx) -> dict[str, Any] | None:
        return await store.session_get_for_auth(tx, namespace_id, session_id, now)

    row = await db.read(run)
    return _judge(row, token, namespace_name, allow_ended=allow_ended)


def _judge(
    row: dict[str, Any] | None, token: str, namespace_name: str, *, allow_ended: bool = False
) -> SessionInfo:
    if (
        row is None
        or not digest_matches(token, row["token_digest"])
        or row["namespace_name"] != namespace_name
        or (not allow_ended and row["state"] != "ACTIVE")
        or (not allow_ended and row["expires_at"] <= row["db_now"])
        or row["credential_revoked_at"] is not None
        or (
            row["credential_expires_at"] is not None
            and row["credential_expires_at"] <= row["db_now"]
        )
        or row["application_status"] != "active"
    ):
        raise Unauthenticated("missing or invalid session token")
    queues = row["queues"]
    names = msgspec.json.decode(queues) if isinstance(queues, str | bytes) else queues
    return SessionInfo(
        namespace_id=row["namespace_id"],
        namespace_name=row["namespace_name"],
        session_id=row["id"],
        instance_id=row["instance_id"],
        application_id=row["application_id"],
        credential_id=row["credential_id"],
        queues=tuple(names),
        max_concurrency=int(row["max_concurrency"]),
        concurrency_keys=bool(row["concurrency_keys"]),
        heartbeat_ms=int(row["heartbeat_ms"]),
        lease_ms=int(row["lease_ms"]),
        expires_at=row["expires_at"],
    )


async def resolve_queues(
    db: Database, namespace_id: bytes, names: tuple[str, ...]
) -> list[QueueRef]:
    """The declared queues that exist (a queue deleted since is skipped)."""

    async def run(tx: Tx) -> list[QueueRef]:
        out: list[QueueRef] = []
        for name in names:
            q = await queue_store.queue_get_by_name(tx, namespace_id, name)
            if q is not None:
                out.append(QueueRef(q["id"], q["name"], int(q["lease_ms"])))
        return out

    return await db.read(run)


async def attach_node(db: Database, namespace_id: bytes, session_id: bytes, node_id: str) -> bool:
    """Record that this node holds the session's stream. False: the session is not ACTIVE."""

    async def run(tx: Tx) -> bool:
        return await store.session_attach_node(tx, namespace_id, session_id, node_id)

    return await db.transaction(run)


async def detach_node(db: Database, namespace_id: bytes, session_id: bytes, node_id: str) -> bool:
    """Clear the stream holder if it is still this node."""

    async def run(tx: Tx) -> bool:
        return await store.session_detach_node_if_node(tx, namespace_id, session_id, node_id)

    return await db.transaction(run)


async def outstanding_offers(
    db: Database, namespace_id: bytes, session_id: bytes, *, now: datetime | None = None
) -> list[wire.Offer]:
    """The session's unexpired offers (re-sent when its stream reconnects)."""

    async def run(tx: Tx) -> list[wire.Offer]:
        t = await clock_now(tx, now)
        rows = await store.session_list_offered(tx, namespace_id, session_id, t)
        return [
            wire.offer_from_row(
                r, r["attempt_id"], int(r["generation"]), r["attempt_lease_expires_at"]
            )
            for r in rows
        ]

    return await db.read(run)


async def held_attempts(db: Database, namespace_id: bytes, session_id: bytes) -> list[bytes]:
    """Ids of the OFFERED and RUNNING attempts bound to the session."""

    async def run(tx: Tx) -> list[bytes]:
        rows = await store.session_list_held(tx, namespace_id, session_id, 100_000)
        return [r["id"] for r in rows]

    return await db.read(run)


async def close_session(
    db: Database,
    namespace_id: bytes,
    session_id: bytes,
    *,
    reason: str = REASON_SESSION_CLOSED,
    actor: audit.Actor | None = None,
    request_id: str | None = None,
    now: datetime | None = None,
) -> tuple[wire.SessionClosed, list[bytes]]:
    """The worker ends its session (graceful drain), in ONE transaction: ACTIVE → CLOSED,
    its OFFERED attempts released (tasks back to WAITING, nothing ran), its RUNNING attempts
    lost exactly as when a session expires (reason ``session_closed``: retried when
    ``retry_safe``, FAILED ``attempts_exhausted`` on the last attempt, else NEEDS_REVIEW with
    ``effect_uncertain``), the raw events (``worker.session_closed`` and every task's) and
    result events written. A session that is no longer ACTIVE is left as it is (no-op: its
    attempts are recovery's). Returns the answer and the ids of the attempts it ended.
    ``reason`` is recorded on the attempts and the event (an operator's close:
    :data:`REASON_CLOSED_BY_OPERATOR`); with ``actor`` the close is audited
    (``workers.close``) in the same transaction.

    Lock order: the session row, then every held attempt's application and queue usage rows
    (sorted), their tasks, their attempts (id order), then the result stream.
    """

    async def run(tx: Tx) -> tuple[wire.SessionClosed, list[bytes]]:
        session = await store.session_lock(tx, namespace_id, session_id)
        if session is None:  # pragma: no cover - the caller authenticated the token
            raise Unauthenticated("missing or invalid session token")
        if session["state"] != "ACTIVE":
            return (
                wire.SessionClosed(
                    session_id=id_hex(session_id),
                    state=str(session["state"]),
                    closed_at=format_opt(session["closed_at"]),
                    released_offers=0,
                    lost_attempts=0,
                ),
                [],
            )
        rows = await store.session_list_held(tx, namespace_id, session_id, 100_000)
        peeks = await attempt_store.attempt_peek_many(tx, namespace_id, [r["id"] for r in rows])
        await transitions.lock_usage(
            tx,
            namespace_id,
            {p["queue_id"] for p in peeks.values()},
            {p["owner_id"] for p in peeks.values()},
        )
        task_ids = [p["task_id"] for p in peeks.values()]
        tasks = await attempt_store.task_lock_many(tx, namespace_id, task_ids)
        locked = await attempt_store.attempt_lock_many(tx, namespace_id, list(peeks), now)
        t = next(iter(locked.values()))["db_now"] if locked else await clock_now(tx, now)
        if not await store.session_close_if_active(tx, namespace_id, session_id, t):
            raise Conflict("session changed while locked", kind="session")  # pragma: no cover
        changes: list[Change] = []
        released = lost = 0
        ended: list[bytes] = []
        for attempt_id in sorted(locked):
            attempt = locked[attempt_id]
            task = tasks.get(attempt["task_id"])
            if task is None or attempt["session_id"] != session_id:  # pragma: no cover
                continue
            if attempt["state"] == "OFFERED":
                changes += await release_offer(tx, namespace_id, task, attempt, t, reason)
                released += 1
            elif attempt["state"] == "RUNNING":
                changes += await lose_running(tx, namespace_id, task, attempt, t, reason)
                lost += 1
            else:
                continue
            ended.append(attempt_id)  # a task has at most one live attempt: no re-read
        await orbit_events.append_event(
            tx,
            namespace_id,
            EVENT_SESSION_CLOSED,
            "worker_session",
            session_id,
            {"released_offers": released, "lost_attempts": lost}
            | ({} if reason == REASON_SESSION_CLOSED else {"reason": reason}),
            request_id,
            now=t,
        )
        if actor is not None:
            await audit.record(
                tx, actor=actor, action="workers.close", resource_kind="worker_session",
                resource_id=session_id, status_code=200, namespace_id=namespace_id,
                request_id=request_id,
                details={"released_offers": released, "lost_attempts": lost, "reason": reason},
                now=t,
            )  # fmt: skip
        await transitions.record_many(tx, namespace_id, changes, request_id=request_id, now=t)
        answer = wire.SessionClosed(
            session_id=id_hex(session_id),
            state="CLOSED",
            closed_at=format_time(t),
            released_offers=released,
            lost_attempts=lost,
        )
        return answer, ended

    return await db.transaction(run)
