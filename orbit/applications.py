"""Applications (tenants): create, read, list. Each mutation is one transaction that also
writes its audit event; creating an application also creates its (unlimited) resources row.
"""

from __future__ import annotations

from datetime import datetime

from orbit import audit
from orbit.audit import Actor
from orbit.errors import Conflict
from orbit.idempotency import DEFAULT_RETENTION_S, IdemRequest, Reply, perform
from orbit.ids import id_hex, new_id
from orbit.storage import Database, DuplicateKey, Tx
from orbit.store import applications as store
from orbit.store import resources as resources_store
from orbit.times import format_time
from orbit.types import ZERO_ID, ApplicationOut, ApplicationRow, check_name

CREATE = "applications.create"


def application_out(row: ApplicationRow) -> ApplicationOut:
    return ApplicationOut(
        id=id_hex(row.id),
        name=row.name,
        status=row.status,
        revision=row.revision,
        created_at=format_time(row.created_at),
        updated_at=format_time(row.updated_at),
    )


async def insert_application(
    tx: Tx, actor: Actor, name: str, *, request_id: str | None = None, now: datetime | None = None
) -> ApplicationRow:
    """Create the application, its resources row and the audit event in ``tx``.

    Raises Conflict(kind="name_taken") when the name exists.
    """
    check_name(name, "name")
    app_id = new_id()
    try:
        await store.application_insert(tx, app_id, name, now)
    except DuplicateKey as exc:
        if exc.key != store.NAME_INDEX:
            raise
        raise Conflict(
            "an application with this name exists", kind="name_taken", field="name"
        ) from None
    await resources_store.resources_insert(tx, app_id, now)
    await audit.record(
        tx,
        actor=actor,
        action=CREATE,
        resource_kind="application",
        resource_id=app_id,
        status_code=201,
        request_id=request_id,
        details={"name": name},
        now=now,
    )
    row = await store.application_get(tx, app_id)
    assert row is not None
    return row


async def create_application(
    db: Database,
    actor: Actor,
    name: str,
    *,
    request_id: str | None = None,
    idem: IdemRequest | None = None,
    retention_s: int = DEFAULT_RETENTION_S,
) -> Reply:
    """``POST /v1/applications`` → 201 with the application (idempotent with a key)."""

    async def effect(tx: Tx) -> tuple[int, ApplicationOut]:
        row = await insert_application(tx, actor, name, request_id=request_id)
        return 201, application_out(row)

    async def run(tx: Tx) -> Reply:
        return await perform(tx, idem, ZERO_ID, CREATE, "global", effect, retention_s=retention_s)

    return await db.transaction(run)


async def get_application(db: Database, app_id: bytes) -> ApplicationRow | None:
    async def run(tx: Tx) -> ApplicationRow | None:
        return await store.application_get(tx, app_id)

    return await db.read(run)


async def list_applications(db: Database, after_id: bytes, limit: int) -> list[ApplicationRow]:
    """Applications ordered by id, after ``after_id`` (global admins only)."""

    async def run(tx: Tx) -> list[ApplicationRow]:
        return await store.application_list_after(tx, after_id, limit)

    return await db.read(run)
