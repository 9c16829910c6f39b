"""orbit.bootstrap and credential authentication on MariaDB."""

from __future__ import annotations

import asyncio

import pytest
from platform_fixtures import raw_query, unique

from orbit.bootstrap import BootstrapResult, bootstrap
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


async def test_a_rerun_changes_nothing_and_every_key_keeps_working(db: Database, dsn: DSN) -> None:
    app = unique("boot")
    first = await bootstrap(db, app, "default")
    second = await bootstrap(db, app, "default")
    assert (first.application_id, first.namespace_id, first.credential_id) == (
        second.application_id, second.namespace_id, second.credential_id,
    )  # fmt: skip
    assert first.key is not None and second.key is None
    assert await works(db, first.key)  # a deploy script that re-runs locks nobody out
    principal, ns_id = await authenticate(db, first.key, "default")
    assert ns_id == first.namespace_id and principal.sees_namespace(ns_id)
    assert principal.actions == ACTIONS and not principal.global_admin and principal.queues is None
    counts = raw_query(
        dsn,
        "SELECT (SELECT COUNT(*) FROM orbit_applications WHERE name = %s),"
        " (SELECT COUNT(*) FROM orbit_namespaces WHERE application_id = %s),"
        " (SELECT COUNT(*) FROM orbit_credentials WHERE application_id = %s)",
        (app, first.application_id, first.application_id),
    )
    assert counts == [(1, 1, 1)]
    assert first.to_json() == {
        "application_id": first.application_id.hex(), "namespace": "default",
        "credential_id": first.credential_id.hex(), "key": first.key,
        "created": {"application": True, "namespace": True, "credential": True},
        "rotated": False,
    }  # fmt: skip
    again = second.to_json()
    assert again["key"] is None and again["rotated"] is False
    assert again["created"] == {"application": False, "namespace": False, "credential": False}
    assert "already exist" in str(again["hint"]) and "--rotate" in str(again["hint"])
    assert _audit_actions(dsn, first) == [
        "applications.create", "namespaces.create", "credentials.create",
    ]  # fmt: skip


async def test_rotate_replaces_the_key_once_and_is_audited(db: Database, dsn: DSN) -> None:
    app = unique("boot")
    first = await bootstrap(db, app, "default")
    rotated = await bootstrap(db, app, "default", rotate=True)
    assert rotated.credential_id == first.credential_id and rotated.rotated
    assert rotated.key is not None and rotated.key != first.key and rotated.hint is None
    assert not await works(db, first.key) and await works(db, rotated.key)  # type: ignore[arg-type]
    after = await bootstrap(db, app, "default")  # and a plain re-run keeps the new one
    assert after.key is None and await works(db, rotated.key)  # type: ignore[arg-type]
    assert _audit_actions(dsn, first)[-1] == "credentials.rotate"
    assert _audit_actions(dsn, first).count("credentials.rotate") == 1


def _audit_actions(dsn: DSN, r: BootstrapResult) -> list[str]:
    rows = raw_query(
        dsn,
        "SELECT action FROM orbit_audit_events WHERE resource_id IN (%s, %s, %s)"
        " ORDER BY created_at",
        (r.application_id.hex(), r.namespace_id.hex(), r.credential_id.hex()),
    )
    return [str(row[0]) for row in rows]


async def test_global_admin_and_second_namespace_get_their_own_credentials(db: Database) -> None:
    app = unique("boot")
    plain = await bootstrap(db, app, "one")
    glob = await bootstrap(db, app, "one", global_admin=True)
    other = await bootstrap(db, app, "two")
    assert len({plain.credential_id, glob.credential_id, other.credential_id}) == 3
    assert plain.key and glob.key and other.key
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
    keys = [r.key for r in results if r.key is not None]
    assert len(keys) == 1  # one run created the credential; the others found it
    assert await works(db, keys[0])
    assert raw_query(dsn, "SELECT COUNT(*) FROM orbit_applications WHERE name = %s", (app,)) == [
        (1,)
    ]


async def test_bootstrap_validates_names(db: Database) -> None:
    with pytest.raises(InvalidRequest):
        await bootstrap(db, "bad name", "default")
    with pytest.raises(InvalidRequest):
        await bootstrap(db, unique(), "")
