"""orbit.idempotency on MariaDB: replay, mismatch, expiry, cleanup, a property over random
bodies and key reuse, and concurrent same-key requests on several real connections."""

from __future__ import annotations

import asyncio
import json
from datetime import datetime, timedelta
from typing import Any

import msgspec
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from orbit import events, idempotency
from orbit.errors import IdempotencyInProgress, IdempotencyMismatch, InvalidRequest
from orbit.idempotency import IdemRequest, Reply
from orbit.ids import new_id
from orbit.storage import Database, Tx

OLD = datetime(2001, 1, 1)


async def claim_and_store(
    db: Database,
    ns: bytes,
    key: str,
    digest: bytes,
    body: bytes = b'{"ok":1}',
    *,
    op: str = "op",
    scope: str = "",
) -> Reply:
    async def effect(tx: Tx) -> tuple[int, Any]:
        return 201, msgspec.Raw(body)

    async def run(tx: Tx) -> Reply:
        return await idempotency.perform(tx, IdemRequest(key, digest), ns, op, scope, effect)

    return await db.transaction(run)


def test_canonical_digest_ignores_order_and_whitespace() -> None:
    a = idempotency.request_digest("POST", "/v1/x", b'{"b": [1, {"y": 2, "x": 1}], "a": "\\u00e9"}')
    b = idempotency.request_digest("post", "/v1/x", '{"a":"é","b":[1,{"x":1,"y":2}]}'.encode())
    assert a == b
    assert a != idempotency.request_digest(
        "POST", "/v1/y", b'{"a":"\\u00e9","b":[1,{"x":1,"y":2}]}'
    )
    assert a != idempotency.request_digest("POST", "/v1/x", b'{"a":"e","b":[1,{"x":1,"y":2}]}')
    assert idempotency.request_digest("POST", "/p", b"not json") == idempotency.request_digest(
        "POST", "/p", b"not json"
    )


@pytest.mark.parametrize("key", ["", "x" * 129, "tab\there", "é"])
def test_key_format(key: str) -> None:
    with pytest.raises(InvalidRequest) as info:
        idempotency.validate_key(key)
    assert info.value.details["field"] == "Idempotency-Key"


async def test_replay_and_mismatch(db: Database) -> None:
    ns = new_id()
    d1, d2 = b"1" * 32, b"2" * 32
    first = await claim_and_store(db, ns, "k", d1, b'{"n":1}')
    assert first == Reply(201, b'{"n":1}', False)
    again = await claim_and_store(db, ns, "k", d1, b'{"n":2}')
    assert again == Reply(201, b'{"n":1}', True)
    with pytest.raises(IdempotencyMismatch):
        await claim_and_store(db, ns, "k", d2)
    # Same key in another namespace, operation or scope is another key.
    assert not (await claim_and_store(db, new_id(), "k", d2)).replayed
    assert not (await claim_and_store(db, ns, "k", d2, op="other")).replayed
    assert not (await claim_and_store(db, ns, "k", d2, scope="s")).replayed


async def test_failed_effect_stores_nothing(db: Database) -> None:
    ns = new_id()

    async def boom(tx: Tx) -> tuple[int, Any]:
        raise RuntimeError("effect failed")

    async def run(tx: Tx) -> Reply:
        return await idempotency.perform(tx, IdemRequest("k", b"1" * 32), ns, "op", "", boom)

    with pytest.raises(RuntimeError):
        await db.transaction(run)
    assert not (await claim_and_store(db, ns, "k", b"2" * 32)).replayed


async def test_claimed_but_not_stored_is_in_progress(db: Database) -> None:
    ns = new_id()

    async def forgetful(tx: Tx) -> None:
        assert await idempotency.claim(tx, ns, "op", "", "k", b"1" * 32) is None

    await db.transaction(forgetful)
    with pytest.raises(IdempotencyInProgress):
        await claim_and_store(db, ns, "k", b"1" * 32)

    async def unclaimed(tx: Tx) -> None:
        await idempotency.store_response(tx, ns, "op", "", "other", 200, b"{}")

    with pytest.raises(RuntimeError, match="not claimed"):
        await db.transaction(unclaimed)


async def test_expired_key_is_reusable_and_cleanup_is_bounded(db: Database) -> None:
    ns = new_id()

    async def claim_at(tx: Tx, key: str, digest: bytes, now: datetime) -> idempotency.Replay | None:
        replay = await idempotency.claim(tx, ns, "op", "", key, digest, retention_s=60, now=now)
        if replay is None:
            await idempotency.store_response(tx, ns, "op", "", key, 201, b"{}")
        return replay

    for i in range(5):
        await db.transaction(lambda tx, i=i: claim_at(tx, f"old-{i}", b"1" * 32, OLD))
    # Within the window: replay. After it: a different body is accepted as new.
    assert await db.transaction(
        lambda tx: claim_at(tx, "old-0", b"1" * 32, OLD + timedelta(seconds=30))
    )
    assert (
        await db.transaction(
            lambda tx: claim_at(tx, "old-0", b"2" * 32, OLD + timedelta(seconds=61))
        )
        is None
    )
    # old-0 now expires at OLD+121s; the other four at OLD+60s. Cleanup at OLD+90s is bounded.
    at = OLD + timedelta(seconds=90)
    assert await idempotency.cleanup_once(db, 3, now=at) == 3
    assert await idempotency.cleanup_once(db, 3, now=at) == 1
    assert await idempotency.cleanup_once(db, 3, now=at) == 0
    assert await idempotency.cleanup_once(db, 3, now=OLD + timedelta(seconds=200)) == 1


# A JSON value strategy (bounded depth) and re-serialisation with other key order/spacing.
json_values = st.recursive(
    st.none() | st.booleans() | st.integers(-(2**63), 2**63) | st.text(max_size=8)
    | st.floats(allow_nan=False, allow_infinity=False),
    lambda children: st.lists(children, max_size=3) | st.dictionaries(st.text(max_size=4), children, max_size=3),
    max_leaves=8,
)  # fmt: skip


def reserialise(value: Any, reverse: bool) -> bytes:
    def order(v: Any) -> Any:
        if isinstance(v, dict):
            items = sorted(v.items(), reverse=reverse)
            return {k: order(x) for k, x in items}
        if isinstance(v, list):
            return [order(x) for x in v]
        return v

    return json.dumps(order(value), indent=1 if reverse else None, ensure_ascii=reverse).encode()


@settings(
    max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(
    requests=st.lists(
        st.tuples(st.sampled_from(["a", "b", "c"]), st.dictionaries(st.sampled_from("xyz"), json_values, max_size=3), st.booleans()),
        min_size=1, max_size=8,
    )
)  # fmt: skip
async def test_property_same_key_same_body_replays_else_422(
    db: Database, requests: list[tuple[str, dict[str, Any], bool]]
) -> None:
    ns = new_id()
    first_body: dict[str, bytes] = {}
    first_reply: dict[str, bytes] = {}
    effects = 0
    for n, (key, body, reverse) in enumerate(requests):
        raw = reserialise(body, reverse)
        digest = idempotency.request_digest("POST", "/v1/things", raw)

        async def effect(tx: Tx, n: int = n) -> tuple[int, Any]:
            nonlocal effects
            effects += 1
            return 201, {"effect": n}

        async def run(tx: Tx, key: str = key, digest: bytes = digest) -> Reply:
            return await idempotency.perform(
                tx, IdemRequest(key, digest), ns, "things.create", "", effect
            )

        canonical = idempotency.canonical_json(raw)
        if key in first_body and first_body[key] != canonical:
            with pytest.raises(IdempotencyMismatch):
                await db.transaction(run)
            continue
        reply = await db.transaction(run)
        if key in first_body:
            assert reply.replayed and reply.body == first_reply[key]
        else:
            assert not reply.replayed
            first_body[key], first_reply[key] = canonical, reply.body
    assert effects == len(first_body)


async def test_concurrent_same_key_requests_make_one_effect(db: Database) -> None:
    """Eight requests with one key on eight pooled connections: the first holds the key's
    index record while its effect runs; the others wait on the INSERT, then replay."""
    ns, subject = new_id(), new_id()
    digest = idempotency.request_digest("POST", "/v1/things", b'{"a":1}')
    runs = 0

    async def effect(tx: Tx) -> tuple[int, Any]:
        nonlocal runs
        runs += 1
        await events.append_event(tx, ns, "thing.created", "thing", subject)
        await asyncio.sleep(0.3)  # keep the transaction (and the key) open while others arrive
        return 201, {"subject": subject.hex()}

    async def one() -> Reply:
        async def run(tx: Tx) -> Reply:
            return await idempotency.perform(
                tx, IdemRequest("same", digest), ns, "things.create", "", effect
            )

        return await db.transaction(run)

    replies = await asyncio.gather(*(one() for _ in range(8)))
    assert runs == 1
    assert len({r.body for r in replies}) == 1
    assert sorted(r.replayed for r in replies) == [False] + [True] * 7

    async def count(tx: Tx) -> int:
        return len(await events.subject_events(tx, ns, "thing", subject))

    assert await db.read(count) == 1
