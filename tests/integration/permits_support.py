"""Helpers for the start-time permit tests (pulse.permits): recount every permit counter
from the rows it counts, and small drivers (offer, start, report) over the real services."""

from __future__ import annotations

from typing import Any

import msgspec
from pulse_fixtures import Tenant
from pulse_worker_support import FakeConn

from orbit.audit import CLI_ACTOR
from orbit.ids import id_hex, parse_id
from orbit.resources import put_resources
from orbit.storage import Database, Tx
from orbit.types import ResourcesPut
from pulse import attempts, wire
from pulse.attempts import Report
from pulse.dispatch import Dispatcher
from pulse.hub import Hub


async def set_app_limits(db: Database, t: Tenant, **limits: Any) -> None:
    """PUT the application's quotas (``max_active_attempts``, ``max_starts_per_second``...)."""
    await put_resources(db, CLI_ACTOR, t.application_id, ResourcesPut(**limits))


async def offers(db: Database, hub: Hub, conn: FakeConn) -> list[wire.Offer]:
    """Dispatch to the session until nothing more is offered; the offers taken."""
    while await Dispatcher(db, hub).dispatch_to(conn):
        pass
    return conn.take_offers()


async def start_all(
    db: Database, t: Tenant, conn: FakeConn, offered: list[wire.Offer], **kw: Any
) -> list[wire.Started | wire.StartDenied]:
    """Start the offers in ONE batch (one transaction), in order."""
    items = [(conn.info.session_id, parse_id(o.attempt_id)) for o in offered]
    return await attempts.start_many(db, t.namespace_id, items, **kw)  # type: ignore[arg-type]


async def complete(db: Database, t: Tenant, s: wire.Started, **kw: Any) -> wire.Receipt:
    rep = Report("complete", parse_id(s.attempt_id), s.execution_token, result=msgspec.Raw(b"1"))  # type: ignore[arg-type]
    return await attempts.report(db, t.namespace_id, rep, **kw)


async def fail(db: Database, t: Tenant, s: wire.Started, retryable: bool = True) -> wire.Receipt:
    rep = Report(
        "fail",
        parse_id(s.attempt_id),  # type: ignore[arg-type]
        s.execution_token,
        error=wire.FailError(type="boom", message="x"),
        retryable=retryable,
    )
    return await attempts.report(db, t.namespace_id, rep)


async def rows(db: Database, sql: str, *args: Any) -> list[dict[str, Any]]:
    async def run(tx: Tx) -> list[dict[str, Any]]:
        return await tx.fetchall(sql, args)

    return await db.read(run)


async def key_limit(db: Database, t: Tenant, key: str) -> dict[str, Any] | None:
    import hashlib

    found = await rows(
        db,
        "SELECT * FROM pulse_concurrency_limits WHERE namespace_id = %s AND key_digest = %s",
        t.namespace_id,
        hashlib.sha256(key.encode("utf-8")).digest(),
    )
    return found[0] if found else None


async def denials(db: Database, t: Tenant, queue_id: bytes | None = None) -> dict[str, int]:
    (row,) = await rows(
        db,
        "SELECT denials_permits AS permits, denials_rate AS rate, denials_key AS `key`,"
        " denials_application AS application FROM pulse_queue_usage"
        " WHERE namespace_id = %s AND queue_id = %s",
        t.namespace_id,
        queue_id or t.queue_id,
    )
    return {k: int(v) for k, v in row.items()}


async def check_permit_counters(
    db: Database, namespace_ids: list[bytes], application_id: bytes | None = None
) -> dict[str, Any]:
    """Every permit counter equals a recount of its rows (raises AssertionError); returns
    the recounts (``running`` per queue id, ``held`` per key digest).

    * ``pulse_queue_usage.active_attempts`` = RUNNING tasks of the queue (the queue permit);
    * ``orbit_application_resources.active_attempts`` = RUNNING tasks of the owner;
    * ``pulse_concurrency_limits.held`` = key permit rows pointing at it ≤ ``max_permits``;
    * key permit rows = RUNNING attempts of keyed tasks, each with its attempt's token;
    * tokens per key are unique among its started attempts.
    """

    async def run(tx: Tx) -> dict[str, Any]:
        out: dict[str, Any] = {"running": {}, "held": {}}
        for ns in namespace_ids:
            for u in await tx.fetchall(
                "SELECT u.queue_id, u.active_attempts,"
                " (SELECT COUNT(*) FROM pulse_tasks t WHERE t.namespace_id = u.namespace_id"
                "  AND t.queue_id = u.queue_id AND t.state = 'RUNNING') AS running"
                " FROM pulse_queue_usage u WHERE u.namespace_id = %s",
                (ns,),
            ):
                assert int(u["active_attempts"]) == int(u["running"]), u
                out["running"][u["queue_id"]] = int(u["running"])
            for k in await tx.fetchall(
                "SELECT l.id, l.key_digest, l.held, l.max_permits, l.grant_revision,"
                " (SELECT COUNT(*) FROM pulse_permits p WHERE p.namespace_id = l.namespace_id"
                "  AND p.kind = 'key' AND p.holder_ref = l.id) AS rows_held,"
                " (SELECT COUNT(*) FROM pulse_attempts a JOIN pulse_tasks t"
                "  ON t.namespace_id = a.namespace_id AND t.id = a.task_id"
                "  WHERE a.namespace_id = l.namespace_id AND a.state = 'RUNNING'"
                "  AND t.concurrency_key_digest = l.key_digest) AS running"
                " FROM pulse_concurrency_limits l WHERE l.namespace_id = %s",
                (ns,),
            ):
                assert int(k["held"]) == int(k["rows_held"]) == int(k["running"]), k
                assert int(k["held"]) <= int(k["max_permits"]), k
                out["held"][bytes(k["key_digest"])] = int(k["held"])
            bad = await tx.fetchall(
                "SELECT a.id FROM pulse_attempts a JOIN pulse_tasks t"
                " ON t.namespace_id = a.namespace_id AND t.id = a.task_id"
                " LEFT JOIN pulse_permits p ON p.namespace_id = a.namespace_id"
                "  AND p.attempt_id = a.id AND p.kind = 'key'"
                " WHERE a.namespace_id = %s AND ("
                "  (a.state = 'RUNNING' AND t.concurrency_key_digest IS NOT NULL"
                "   AND (p.id IS NULL OR p.token <> a.concurrency_token))"
                "  OR (a.state <> 'RUNNING' AND p.id IS NOT NULL))",
                (ns,),
            )
            assert not bad, f"attempts whose key permit does not match their state: {bad}"
            dup = await tx.fetchall(
                "SELECT t.concurrency_key_digest, a.concurrency_token, COUNT(*) AS n"
                " FROM pulse_attempts a JOIN pulse_tasks t"
                " ON t.namespace_id = a.namespace_id AND t.id = a.task_id"
                " WHERE a.namespace_id = %s AND a.concurrency_token IS NOT NULL"
                " GROUP BY t.concurrency_key_digest, a.concurrency_token HAVING n > 1",
                (ns,),
            )
            assert not dup, f"a concurrency token was handed out twice: {dup}"
        if application_id is not None:
            app = await tx.fetchone(
                "SELECT active_attempts FROM orbit_application_resources WHERE application_id = %s",
                (application_id,),
            )
            running = await tx.fetchval(
                "SELECT COUNT(*) FROM pulse_tasks WHERE owner_id = %s AND state = 'RUNNING'"
                " AND namespace_id IN %s",
                (application_id, tuple(namespace_ids)),
            )
            assert app is not None and int(app["active_attempts"]) == int(running)
            out["app_running"] = int(running)
        return out

    return await db.read(run)


def started(replies: list[Any]) -> list[wire.Started]:
    return [r for r in replies if isinstance(r, wire.Started)]


def denied(replies: list[Any]) -> list[str]:
    return [r.reason for r in replies if isinstance(r, wire.StartDenied)]


__all__ = ["id_hex"]
