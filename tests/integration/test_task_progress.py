"""Progress in heartbeats against the real database: a heartbeat round carries each
attempt's progress document into the same two guarded UPDATEs that extend the leases (no
statement of its own, any number of namespaces), the task and attempt views show it, a new
attempt does not show the previous one's, an attempt whose lease is not extended keeps
nothing, the per-row fallback writes the same; the HTTP fallback takes progress on both
heartbeat routes, and bad progress is a 400 that changes nothing (not even the lease)."""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator, Iterator
from typing import Any

import httpx
import msgspec
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from platform_fixtures import asgi_client, make_app, pulse_routes
from pulse_fixtures import Tenant
from pulse_worker_support import connect, open_session, task_row

from orbit.errors import InvalidRequest
from orbit.ids import id_hex, parse_id
from orbit.storage import Database
from orbit.storage import db as storage_db
from pulse import attempts, heartbeat_round, tasks, wire
from pulse.attempts import Report
from pulse.dispatch import Dispatcher
from pulse.hub import Hub
from pulse.progress import MAX_PROGRESS_BYTES, check_progress


@pytest.fixture(scope="module")
async def client(db: Database) -> AsyncIterator[httpx.AsyncClient]:
    async with asgi_client(make_app(db, pulse_routes)) as c:
        yield c


async def running(db: Database, t: Tenant, **fields: Any) -> tuple[Any, str, wire.Started, str]:
    """A task started by a real session: (session info, session token, started, task id)."""
    hub = Hub("node-progress")
    task = await t.submit(**fields)
    info, token = await open_session(db, t)
    conn = await connect(db, hub, info)
    assert await Dispatcher(db, hub).dispatch_to(conn) == 1
    (offer,) = conn.take_offers()
    started = await attempts.start(db, t.namespace_id, info.session_id, parse_id(offer.attempt_id))
    assert isinstance(started, wire.Started)
    return info, token, started, str(task["id"])


@contextlib.contextmanager
def recorded() -> Iterator[list[str]]:
    previous = storage_db.STATEMENT_LOG
    log: list[str] = []
    storage_db.STATEMENT_LOG = log
    try:
        yield log
    finally:
        storage_db.STATEMENT_LOG = previous
        if previous is not None:
            previous.extend(log)


def _updates(log: list[str], table: str) -> int:
    return sum(s.count(f"UPDATE {table} ") for s in log)


async def test_a_round_writes_progress_with_the_leases(tenant: Any, db: Database) -> None:
    a, b = await tenant(), await tenant()
    ia, _, sa, task_a = await running(db, a)
    ib, _, sb, task_b = await running(db, b)
    items = [
        (
            a.namespace_id,
            ia.session_id,
            [sa.attempt_id],
            {sa.attempt_id: '{"done": 40, "total": 100}'},
        ),
        (b.namespace_id, ib.session_id, [sb.attempt_id]),  # no progress: keeps none
    ]
    with recorded() as log:
        results = await heartbeat_round.heartbeat_round(db, items)
    assert all(r.reply.attempts[0].ok for r in results)  # type: ignore[union-attr]
    assert _updates(log, "pulse_tasks") == 1 and _updates(log, "pulse_attempts") == 1
    view = await tasks.get_task(db, a.namespace_id, task_a)
    assert msgspec.json.decode(msgspec.json.encode(view))["progress"] == {"done": 40, "total": 100}
    assert view["progress_at"] is not None
    assert bytes(view["progress"]) == b'{"done": 40, "total": 100}'  # exact text
    assert (await tasks.get_task(db, b.namespace_id, task_b))["progress"] is None
    listed = await tasks.list_attempts(db, a.namespace_id, task_a)
    assert bytes(listed["items"][0]["progress"]) == b'{"done": 40, "total": 100}'
    # a later document replaces it; a heartbeat without one keeps it
    await heartbeat_round.heartbeat_round(
        db, [(a.namespace_id, ia.session_id, [sa.attempt_id], {sa.attempt_id: '{"done": 90}'})]
    )
    await heartbeat_round.heartbeat_round(db, [(a.namespace_id, ia.session_id, [sa.attempt_id])])
    assert bytes((await tasks.get_task(db, a.namespace_id, task_a))["progress"]) == b'{"done": 90}'


async def test_the_per_row_fallback_writes_progress_too(tenant: Any, db: Database) -> None:
    t = await tenant()
    info, _, started, task_id = await running(db, t)
    item = (
        t.namespace_id,
        info.session_id,
        [started.attempt_id],
        {started.attempt_id: '{"step": "b"}'},
    )
    (result,) = await db.transaction(
        lambda tx: heartbeat_round._round(tx, [item], None, per_row=True)
    )
    assert result.reply.attempts[0].ok
    assert (
        bytes((await tasks.get_task(db, t.namespace_id, task_id))["progress"]) == b'{"step": "b"}'
    )


async def test_only_an_extended_lease_keeps_progress(tenant: Any, db: Database) -> None:
    """An attempt that is no longer running (it completed) gets ``ok: false`` and its
    progress is not written; a new attempt of a task does not show the previous one's."""
    t = await tenant()
    info, _, started, task_id = await running(
        db, t, max_attempts=3, retry={"backoff_initial_ms": 0, "backoff_max_ms": 0}
    )
    aid = parse_id(started.attempt_id)
    await heartbeat_round.heartbeat_round(
        db,
        [(t.namespace_id, info.session_id, [started.attempt_id], {started.attempt_id: '{"n": 1}'})],
    )
    err = wire.FailError(type="Flaky", message="again")
    rep = Report("fail", aid, started.execution_token, error=err, retryable=True, retry_after_ms=0)
    await attempts.report(db, t.namespace_id, rep)
    (late,) = await heartbeat_round.heartbeat_round(
        db,
        [(t.namespace_id, info.session_id, [started.attempt_id], {started.attempt_id: '{"n": 2}'})],
    )
    assert not late.reply.attempts[0].ok  # type: ignore[union-attr]
    row = await task_row(db, t, task_id)
    assert row["progress"] == '{"n": 1}' and row["state"] == "WAITING"
    # the failed attempt's progress still shows while it is the latest attempt
    assert bytes((await tasks.get_task(db, t.namespace_id, task_id))["progress"]) == b'{"n": 1}'
    hub = Hub("node-progress-2")
    conn = await connect(db, hub, info)
    assert await Dispatcher(db, hub).dispatch_to(conn) == 1
    (offer,) = conn.take_offers()
    again = await attempts.start(db, t.namespace_id, info.session_id, parse_id(offer.attempt_id))
    assert isinstance(again, wire.Started) and again.generation == 2
    view = await tasks.get_task(db, t.namespace_id, task_id)
    assert view["progress"] is None and view["progress_at"] is None
    listed = await tasks.list_attempts(db, t.namespace_id, task_id)
    assert [None if a["progress"] is None else bytes(a["progress"]) for a in listed["items"]] == [
        b'{"n": 1}',
        None,
    ]


def test_check_progress_rules() -> None:
    aid = "a" * 32
    assert check_progress(None, [aid]) == {}
    assert check_progress({aid: msgspec.Raw(b' {"x": [1, 2]} ')}, [aid]) == {aid: '{"x": [1, 2]}'}
    for bad, why in (
        (msgspec.Raw(b"[1]"), "JSON object"),
        (msgspec.Raw(b'"text"'), "JSON object"),
        (msgspec.Raw(b"null"), "JSON object"),
        (msgspec.Raw(b'{"s": "' + b"x" * MAX_PROGRESS_BYTES + b'"}'), "at most 4096"),
    ):
        with pytest.raises(InvalidRequest, match=why) as caught:
            check_progress({aid: bad}, [aid])
        assert caught.value.details["field"] == f"progress.{aid}"
    with pytest.raises(InvalidRequest, match="lists") as caught:
        check_progress({"b" * 32: msgspec.Raw(b"{}")}, [aid])
    assert caught.value.details["field"] == "progress." + "b" * 32


_json = st.recursive(
    st.none() | st.booleans() | st.integers() | st.text(max_size=20),
    lambda inner: (
        st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=8), inner, max_size=4)
    ),
    max_leaves=20,
)


@settings(max_examples=200, deadline=None)
@given(doc=_json)
def test_any_small_object_is_kept_verbatim_anything_else_refused(doc: Any) -> None:
    text = msgspec.json.encode(doc)
    aid = "c" * 32
    if isinstance(doc, dict) and len(text) <= MAX_PROGRESS_BYTES:
        assert check_progress({aid: msgspec.Raw(text)}, [aid]) == {aid: text.decode()}
    else:
        with pytest.raises(InvalidRequest):
            check_progress({aid: msgspec.Raw(text)}, [aid])


async def test_http_heartbeats_with_progress(
    client: httpx.AsyncClient, tenant: Any, db: Database
) -> None:
    t = await tenant()
    info, token, started, task_id = await running(db, t)
    base = f"/v1/namespaces/{t.namespace}"
    auth = {"Authorization": f"Bearer {token}"}
    sid = id_hex(info.session_id)
    r = await client.post(
        f"{base}/workers/sessions/{sid}/heartbeat",
        json={"attempt_ids": [started.attempt_id], "progress": {started.attempt_id: {"pct": 10}}},
        headers=auth,
    )
    assert r.status_code == 200 and r.json()["attempts"][0]["ok"], r.text
    task = (await client.get(f"{base}/tasks/{task_id}", headers=t.auth)).json()
    assert task["progress"] == {"pct": 10} and task["progress_at"].endswith("Z")
    r = await client.post(
        f"{base}/attempts/{started.attempt_id}/heartbeat",
        json={"progress": {"pct": 20}},
        headers=auth,
    )
    assert r.status_code == 200, r.text
    assert (await client.get(f"{base}/tasks/{task_id}", headers=t.auth)).json()["progress"] == {
        "pct": 20
    }
    attempts_view = (await client.get(f"{base}/tasks/{task_id}/attempts", headers=t.auth)).json()
    assert attempts_view["items"][0]["progress"] == {"pct": 20}
    # bad progress: 400 naming the field, and nothing changes (not even the lease)
    before = await task_row(db, t, task_id)
    for body, field in (
        ({"attempt_ids": [started.attempt_id], "progress": {started.attempt_id: [1]}},
         f"progress.{started.attempt_id}"),
        ({"attempt_ids": [], "progress": {started.attempt_id: {"pct": 30}}},
         f"progress.{started.attempt_id}"),
        ({"attempt_ids": [started.attempt_id],
          "progress": {started.attempt_id: {"s": "x" * MAX_PROGRESS_BYTES}}},
         f"progress.{started.attempt_id}"),
    ):  # fmt: skip
        r = await client.post(f"{base}/workers/sessions/{sid}/heartbeat", json=body, headers=auth)
        assert r.status_code == 400, r.text
        assert r.json()["error"]["details"]["field"] == field
    r = await client.post(
        f"{base}/attempts/{started.attempt_id}/heartbeat", json={"progress": "half"}, headers=auth
    )
    assert r.status_code == 400 and r.json()["error"]["details"]["field"].startswith("progress")
    after = await task_row(db, t, task_id)
    assert after["lease_expires_at"] == before["lease_expires_at"]
    assert after["progress"] == before["progress"] == '{"pct":20}'
