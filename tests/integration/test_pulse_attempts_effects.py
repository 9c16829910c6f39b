"""The side-effect ledger: new / committed (with the stored result) / uncertain, keyed by
(namespace, task, key) and stable across the task's attempts; only the current running
attempt, proven by its token, may use it."""

from __future__ import annotations

from datetime import timedelta

import msgspec
import pytest
from pulse_worker_support import check_invariants, connect, open_session

from orbit.errors import StaleToken
from orbit.ids import parse_id
from orbit.storage import Tx
from pulse import attempts, effects, wire
from pulse.dispatch import Dispatcher
from pulse.errors import AttemptNotFound
from pulse.hub import Hub
from pulse.recovery import recover_attempt


@pytest.fixture
def hub() -> Hub:
    return Hub("node-effects")


async def _start(db, hub, t, conn, now=None):
    assert await Dispatcher(db, hub).dispatch_to(conn, now=now) == 1
    (offer,) = conn.take_offers()
    aid = parse_id(offer.attempt_id)
    started = await attempts.start(db, t.namespace_id, conn.info.session_id, aid, now=now)
    assert isinstance(started, wire.Started)
    return aid, started.execution_token


async def test_effect_ledger_across_attempts(db, tenant, hub) -> None:
    t = await tenant(lease_ms=1000, retry={"max_attempts": 3, "backoff_initial_ms": 1000})
    task = await t.submit(retry_safe=True)
    info, _ = await open_session(db, t)
    conn = await connect(db, hub, info)
    ns = t.namespace_id
    aid1, tok1 = await _start(db, hub, t, conn)

    # First attempt: two effects begun; "charge" committed with its result, "email" not.
    assert (await effects.effect(db, ns, aid1, tok1, "charge", "begin")).state == "new"
    assert (await effects.effect(db, ns, aid1, tok1, "charge", "begin")).state == "new"
    result = msgspec.Raw(b'{"charge_id": "ch_1", "amount": 12.50}')
    st = await effects.effect(db, ns, aid1, tok1, "charge", "commit", result)
    assert st.state == "committed" and bytes(st.result) == bytes(result)
    st = await effects.effect(db, ns, aid1, tok1, "charge", "begin")
    assert st.state == "committed" and bytes(st.result) == bytes(result)
    assert (await effects.effect(db, ns, aid1, tok1, "email", "begin")).state == "new"
    # A wrong token changes nothing.
    with pytest.raises(StaleToken):
        await effects.effect(db, ns, aid1, "ext_wrong", "other", "begin")
    with pytest.raises(AttemptNotFound):
        await effects.effect(db, ns, b"\x05" * 16, tok1, "other", "begin")

    # The worker dies: the attempt is lost, the (retry-safe) task runs again.
    late = (await db.now()) + timedelta(seconds=2)
    assert await recover_attempt(db, ns, aid1, reason="lease_expired", now=late) == "lost"
    with pytest.raises(StaleToken):  # the lost attempt may not use the ledger any more
        await effects.effect(db, ns, aid1, tok1, "sms", "begin", now=late)
    later = late + timedelta(seconds=2)
    aid2, tok2 = await _start(db, hub, t, conn, now=later)

    st = await effects.effect(db, ns, aid2, tok2, "charge", "begin", now=later)
    assert st.state == "committed" and bytes(st.result) == bytes(result)  # never charged twice
    st = await effects.effect(db, ns, aid2, tok2, "email", "begin", now=later)
    assert (
        st.state == "uncertain" and bytes(st.result) == b"null"
    )  # begun by attempt 1, never committed
    assert (await effects.effect(db, ns, aid2, tok2, "sms", "begin", now=later)).state == "new"
    # The handler decides to send anyway and commits: committed from now on.
    st = await effects.effect(db, ns, aid2, tok2, "email", "commit", None, now=later)
    assert st.state == "committed" and bytes(st.result) == b"null"
    # A commit without begin is recorded as committed too; committing again keeps the first.
    st = await effects.effect(db, ns, aid2, tok2, "log", "commit", msgspec.Raw(b"1"), now=later)
    assert st.state == "committed" and bytes(st.result) == b"1"
    st = await effects.effect(db, ns, aid2, tok2, "log", "commit", msgspec.Raw(b"2"), now=later)
    assert bytes(st.result) == b"1"

    async def rows(tx: Tx) -> list[dict]:
        return await tx.fetchall(
            "SELECT effect_key, state, generation FROM pulse_effects"
            " WHERE namespace_id = %s AND task_id = %s ORDER BY effect_key",
            (ns, bytes.fromhex(task["id"])),
        )

    got = {(r["effect_key"], r["state"], r["generation"]) for r in await db.read(rows)}
    assert got == {
        ("charge", "COMMITTED", 1),
        ("email", "COMMITTED", 2),
        ("log", "COMMITTED", 2),
        ("sms", "BEGUN", 2),
    }
    await check_invariants(db, ns)


async def test_effect_keys_are_per_task_and_exact_bytes(db, tenant, hub) -> None:
    t = await tenant()
    await t.submit()
    await t.submit()
    info, _ = await open_session(db, t, max_concurrency=2)
    conn = await connect(db, hub, info)
    assert await Dispatcher(db, hub).dispatch_to(conn) == 2
    tokens = []
    for offer in conn.take_offers():
        aid = parse_id(offer.attempt_id)
        started = await attempts.start(db, t.namespace_id, info.session_id, aid)
        tokens.append((aid, started.execution_token))
    (a1, k1), (a2, k2) = tokens
    ns = t.namespace_id
    await effects.effect(db, ns, a1, k1, "K", "commit", msgspec.Raw(b'"one"'))
    # The same key of another task is another ledger row.
    assert (await effects.effect(db, ns, a2, k2, "K", "begin")).state == "new"
    # Keys match on exact bytes: "k" and "K", "é" composed and decomposed differ.
    assert (await effects.effect(db, ns, a1, k1, "k", "begin")).state == "new"
    assert (await effects.effect(db, ns, a1, k1, "\u00e9", "begin")).state == "new"
    assert (await effects.effect(db, ns, a1, k1, "e\u0301", "begin")).state == "new"
