"""Namespaces: the isolation boundary of runtime data. Created inside one application; never
renamed or deleted (so a name → id mapping may be cached)."""

from __future__ import annotations

from datetime import datetime

from orbit import audit
from orbit.audit import Actor
from orbit.errors import Conflict, NotFound
from orbit.idempotency import DEFAULT_RETENTION_S, IdemRequest, Reply, perform
from orbit.ids import id_hex, new_id
from orbit.storage import Database, DuplicateKey, Tx
from orbit.store import applications as app_store
from orbit.store import namespaces as store
from orbit.times import format_time
from orbit.types import ZERO_ID, NamespaceOut, NamespaceRow, check_name

CREATE = "namespaces.create"


def namespace_out(row: NamespaceRow) -> NamespaceOut:
    return NamespaceOut(
        id=id_hex(row.id),
        application_id=id_hex(row.application_id),
        name=row.name,
        revision=row.revision,
        created_at=format_time(row.created_at),
    )


async def insert_namespace(
    tx: Tx,
    actor: Actor,
    app_id: bytes,
    name: str,
    *,
    request_id: str | None = None,
    now: datetime | None = None,
) -> NamespaceRow:
    """Create a namespace of an existing application in ``tx`` (with its audit event).

    Raises NotFound when the application does not exist, Conflict(kind="name_taken") when the
    application already has a namespace with this name.
    """
    check_name(name, "name")
    if await app_store.application_get(tx, app_id) is None:
        raise NotFound("application")
    ns_id = new_id()
    try:
        await store.namespace_insert(tx, ns_id, app_id, name, now)
    except DuplicateKey as exc:
        if exc.key != store.NAME_INDEX:
            raise
        raise Conflict(
            "a namespace with this name exists", kind="name_taken", field="name"
        ) from None
    await audit.record(
        tx,
        actor=actor,
        action=CREATE,
        resource_kind="namespace",
        resource_id=ns_id,
        status_code=201,
        request_id=request_id,
        details={"application_id": id_hex(app_id), "name": name},
        now=now,
    )
    row = await store.namespace_get(tx, ns_id)
    assert row is not None
    return row


async def create_namespace(
    db: Database,
    actor: Actor,
    app_id: bytes,
    name: str,
    *,
    request_id: str | None = None,
    idem: IdemRequest | None = None,
    retention_s: int = DEFAULT_RETENTION_S,
) -> Reply:
    """``POST /v1/applications/{app_id}/namespaces`` → 201 with the namespace."""

    async def effect(tx: Tx) -> tuple[int, NamespaceOut]:
        row = await insert_namespace(tx, actor, app_id, name, request_id=request_id)
        return 201, namespace_out(row)

    async def run(tx: Tx) -> Reply:
        return await perform(
            tx, idem, ZERO_ID, CREATE, id_hex(app_id), effect, retention_s=retention_s
        )

    return await db.transaction(run)


async def get_namespace_by_name(db: Database, app_id: bytes, name: str) -> NamespaceRow | None:
    async def run(tx: Tx) -> NamespaceRow | None:
        return await store.namespace_get_by_name(tx, app_id, name)

    return await db.read(run)


async def list_namespaces(
    db: Database, app_id: bytes, after_name: str, limit: int
) -> list[NamespaceRow]:
    """Namespaces of one application ordered by name, after ``after_name``."""

    async def run(tx: Tx) -> list[NamespaceRow]:
        return await store.namespace_list_for_application(tx, app_id, after_name, limit)

    return await db.read(run)
