"""orbit.bootstrap and credential authentication on MariaDB."""

from __future__ import annotations

import asyncio

import pytest
from platform_fixtures import raw_query, unique

from orbit.bootstrap import bootstrap
from orbit.credentials import authenticate
from orbit.errors import InvalidRequest, Unauthenticated
from orbit.storage import DSN, Database
from orbit.types import ACTIONS


async def works(db: Database, key: str, namespace: str | None = None) -> bool:
    try:
        await authenticate(db, key, namespace)
        return True
    except Unauthenticated:
        return False


async def test_bootstrap_is_idempotent_and_rotates_the_key(db: Database, dsn: DSN) -> None:
    app = unique("boot")
    first = await bootstrap(db, app, "default")
    second = await bootstrap(db, app, "default")
    assert (first.application_id, first.namespace_id, first.credential_id) == (
        second.application_id, second.namespace_id, second.credential_id,
    )  # fmt: skip
    assert first.key != second.key
    assert not await works(db, first.key) and await works(db, second.key)
    principal, ns_id = await authenticate(db, second.key, "default")
    assert ns_id == second.namespace_id and principal.sees_namespace(ns_id)
    assert principal.actions == ACTIONS and not principal.global_admin and principal.queues is None
    counts = raw_query(
        dsn,
        "SELECT (SELECT COUNT(*) FROM orbit_applications WHERE name = %s),"
        " (SELECT COUNT(*) FROM orbit_namespaces WHERE application_id = %s),"
        " (SELECT COUNT(*) FROM orbit_credentials WHERE application_id = %s)",
        (app, first.application_id, first.application_id),
    )
    assert counts == [(1, 1, 1)]
    assert second.to_json() == {
        "application_id": second.application_id.hex(), "namespace": "default",
        "credential_id": second.credential_id.hex(), "key": second.key,
    }  # fmt: skip
    actions = [r[0] for r in raw_query(dsn, "SELECT action FROM orbit_audit_events WHERE resource_id IN (%s, %s, %s) ORDER BY created_at",
                                       (first.application_id.hex(), first.namespace_id.hex(), first.credential_id.hex()))]  # fmt: skip
    assert actions == [
        "applications.create",
        "namespaces.create",
        "credentials.create",
        "credentials.rotate",
    ]


async def test_global_admin_and_second_namespace_get_their_own_credentials(db: Database) -> None:
    app = unique("boot")
    plain = await bootstrap(db, app, "one")
    glob = await bootstrap(db, app, "one", global_admin=True)
    other = await bootstrap(db, app, "two")
    assert len({plain.credential_id, glob.credential_id, other.credential_id}) == 3
    assert await works(db, plain.key) and await works(db, glob.key) and await works(db, other.key)
    p, _ = await authenticate(db, glob.key)
    assert p.global_admin
    _, two_id = await authenticate(db, plain.key, "two")
    p1, _ = await authenticate(db, plain.key)
    assert two_id == other.namespace_id and not p1.sees_namespace(two_id)


async def test_concurrent_bootstraps_converge(db: Database, dsn: DSN) -> None:
    app = unique("race")
    results = await asyncio.gather(*(bootstrap(db, app, "default") for _ in range(4)))
    assert len({r.application_id for r in results}) == 1
    assert len({r.credential_id for r in results}) == 1
    valid = [await works(db, r.key) for r in results]
    assert valid.count(True) == 1  # every run rotates: only the last committed key works
    assert raw_query(dsn, "SELECT COUNT(*) FROM orbit_applications WHERE name = %s", (app,)) == [
        (1,)
    ]


async def test_bootstrap_validates_names(db: Database) -> None:
    with pytest.raises(InvalidRequest):
        await bootstrap(db, "bad name", "default")
    with pytest.raises(InvalidRequest):
        await bootstrap(db, unique(), "")
