"""The heartbeat round: every worker heartbeat (session keep-alive plus the leases of the
attempts it lists) that reached this node while the previous round ran, for every
namespace, in ONE transaction.

A heartbeat is judged as a new request of its session would be: the session ACTIVE and
unexpired, its credential neither revoked nor expired, its application active (else
:class:`~pulse.attempts.SessionGone`; the stream ends). Lock order: the session rows first
(sorted by namespace and id; the clock is read once they are held), then — through the guarded UPDATEs — the tasks, then the attempts. Per heartbeat
the answer is exactly the one a heartbeat alone gets (:func:`pulse.attempts.heartbeat`
documents it). The writes are one UPDATE per table for the whole round: sessions extended,
instances touched, the running attempts' leases and their tasks' mirrors extended — with the
progress documents the heartbeats report (pulse/progress.py) in those same two UPDATEs. The
attempt views are read without locks, so the guarded UPDATEs decide: when their matched
count is below the rows (a report or recovery moved one of them meanwhile), the round is
rolled back and run again with one guarded UPDATE per row, whose counts say which held.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from datetime import datetime
from typing import Any

from orbit.errors import Conflict
from orbit.ids import id_hex, parse_id
from orbit.storage import Database, Tx
from orbit.storage.keys import KeySet
from orbit.times import format_time
from pulse import wire
from pulse.attempts import HeartbeatResult, SessionGone, ms
from pulse.store import rounds as store

#: One heartbeat of a round: (namespace id, session id, the attempt ids it lists), and
#: optionally the progress documents it reports, by attempt id (checked JSON object texts,
#: pulse/progress.py): written with the lease of an attempt the round extends.
HeartbeatItem = (
    tuple[bytes, bytes, Sequence[str]] | tuple[bytes, bytes, Sequence[str], Mapping[str, str]]
)


class _Diverged(Exception):
    """A multi-row lease UPDATE matched fewer rows than the round expected."""


async def heartbeat_round(
    db: Database, items: Sequence[HeartbeatItem], *, now: datetime | None = None
) -> list[HeartbeatResult | SessionGone]:
    """Apply ``items`` (of any namespaces) in one transaction; per item, in order, its
    result or :class:`SessionGone`."""
    if not items:
        return []
    try:
        return await db.transaction(lambda tx: _round(tx, items, now, per_row=False))
    except _Diverged:
        return await db.transaction(lambda tx: _round(tx, items, now, per_row=True))


async def _round(
    tx: Tx, items: Sequence[HeartbeatItem], now: datetime | None, *, per_row: bool
) -> list[HeartbeatResult | SessionGone]:
    sessions = await store.session_lock_keys(tx, KeySet((it[0], it[1]) for it in items), now)
    if not sessions:
        return [SessionGone() for _ in items]
    t: datetime = now if now is not None else next(iter(sessions.values()))["db_now"]
    live: dict[tuple[bytes, bytes], datetime] = {}  # session → its new expiry
    refused: set[tuple[bytes, bytes]] = set()  # its credential or application refuses it
    for (ns, sid), s in sessions.items():
        if not (s["credential_ok"] and s["application_ok"]):
            refused.add((ns, sid))
        elif s["state"] == "ACTIVE" and s["expires_at"] > t:
            live[(ns, sid)] = t + ms(int(s["lease_ms"]))
    wanted = KeySet()
    progress: dict[tuple[bytes, bytes], str] = {}  # (namespace, attempt id) → document
    for item in items:
        ns, sid, attempt_ids = item[0], item[1], item[2]
        if (ns, sid) in live:
            for text in attempt_ids:
                raw = parse_id(text)
                if raw is not None:
                    wanted.add(ns, raw)
            for text, doc in (item[3].items() if len(item) > 3 else ()):
                raw = parse_id(text)
                if raw is not None:
                    progress[(ns, raw)] = doc
    statements: list[tuple[str, Any]] = []
    if live:
        statements.append(store.sessions_extend_statement(live, t))
        statements.append(store.instances_touch_statement(
            KeySet((ns, sessions[(ns, sid)]["instance_id"]) for ns, sid in live), t
        ))  # fmt: skip
    views = await store.attempt_heartbeat_view_keys(tx, wanted)
    # The running attempts to extend: (namespace, attempt id) → their new lease.
    extend: dict[tuple[bytes, bytes], dict[str, Any]] = {}
    for (ns, raw), found in views.items():
        if (
            (ns, found["session_id"]) in live
            and found["state"] == "RUNNING"
            and found["lease_expires_at"] > t
            and found["task_state"] == "RUNNING"
            and found["current_attempt_id"] == raw
        ):
            extend[(ns, raw)] = {
                "task_id": found["task_id"], "session_id": found["session_id"],
                "lease_expires_at": t + ms(int(found["lease_ms"])),
                "progress": progress.get((ns, raw)),
            }  # fmt: skip
    if per_row:  # the same two guarded UPDATEs, one row each: their counts say which held
        for key, r in sorted(extend.items()):
            statements += store.heartbeat_statements({key: r}, t)
    elif extend:
        statements += store.heartbeat_statements(extend, t)
    counts = await tx.execute_batch(statements)
    if live and counts[0] != len(live):  # pragma: no cover - the session rows are locked
        raise Conflict("a session changed while locked", kind="heartbeat")
    held: set[tuple[bytes, bytes]] = set()
    lease_counts = counts[2:] if live else counts
    if per_row:
        for k, key in enumerate(sorted(extend)):
            task_ok, attempt_ok = lease_counts[2 * k] == 1, lease_counts[2 * k + 1] == 1
            if task_ok != attempt_ok:  # pragma: no cover - every writer changes both at once
                raise Conflict("task and attempt leases diverged", kind="heartbeat")
            if task_ok:
                held.add(key)
    elif extend:
        if lease_counts != [len(extend), len(extend)]:
            raise _Diverged()
        held = set(extend)
    out: list[HeartbeatResult | SessionGone] = []
    for item in items:
        ns, sid, attempt_ids = item[0], item[1], item[2]
        expires = live.get((ns, sid))
        if expires is None:
            out.append(SessionGone(credential=(ns, sid) in refused))
            continue
        answers: list[wire.HeartbeatAttempt] = []
        cancels: list[str] = []
        for text in attempt_ids:
            raw = parse_id(text)
            v = views.get((ns, raw)) if raw is not None else None
            if raw is None or v is None or v["session_id"] != sid:
                answers.append(wire.HeartbeatAttempt(
                    attempt_id=text if raw is None else id_hex(raw), ok=False,
                    lease_expires_at=None, cancel_requested=False,
                ))  # fmt: skip
                continue
            cancel = bool(v["cancel_requested"]) and v["current_attempt_id"] == raw
            if (ns, raw) in extend:
                ok = (ns, raw) in held
                lease = extend[(ns, raw)]["lease_expires_at"] if ok else v["lease_expires_at"]
                answers.append(wire.HeartbeatAttempt(
                    attempt_id=id_hex(raw), ok=ok, lease_expires_at=format_time(lease),
                    cancel_requested=cancel,
                ))  # fmt: skip
                if ok and cancel:
                    cancels.append(id_hex(raw))
            elif v["state"] == "OFFERED" and v["lease_expires_at"] > t:
                answers.append(wire.HeartbeatAttempt(
                    attempt_id=id_hex(raw), ok=True,
                    lease_expires_at=format_time(v["lease_expires_at"]), cancel_requested=False,
                ))  # fmt: skip
            else:
                answers.append(wire.HeartbeatAttempt(
                    attempt_id=id_hex(raw), ok=False,
                    lease_expires_at=format_time(v["lease_expires_at"]), cancel_requested=cancel,
                ))  # fmt: skip
        reply = wire.HeartbeatOk(
            ref_msg_id=None, attempts=answers, session_expires_at=format_time(expires)
        )
        out.append(HeartbeatResult(reply=reply, cancel_requested=cancels))
    return out
