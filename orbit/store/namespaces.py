"""SQL for ``orbit_namespaces``."""

from __future__ import annotations

from datetime import datetime

import msgspec

from orbit.storage import Tx, load_queries
from orbit.types import NamespaceRow

Q = load_queries(__file__, "namespaces")
NAME_INDEX = "uq_orbit_namespaces_application_name"


def _row(row: dict[str, object] | None) -> NamespaceRow | None:
    return None if row is None else msgspec.convert(row, NamespaceRow)


async def namespace_insert(
    tx: Tx, ns_id: bytes, app_id: bytes, name: str, now: datetime | None
) -> None:
    """Insert a namespace; DuplicateKey(NAME_INDEX) when the application has that name."""
    args = {"id": ns_id, "application_id": app_id, "name": name, "now": now}
    await tx.execute(Q.namespace_insert, args)


async def namespace_get(tx: Tx, ns_id: bytes) -> NamespaceRow | None:
    return _row(await tx.fetchone(Q.namespace_get, {"id": ns_id}))


async def namespace_get_by_name(tx: Tx, app_id: bytes, name: str) -> NamespaceRow | None:
    args = {"application_id": app_id, "name": name}
    return _row(await tx.fetchone(Q.namespace_get_by_name, args))


async def namespace_list_for_application(
    tx: Tx, app_id: bytes, after_name: str, limit: int
) -> list[NamespaceRow]:
    args = {"application_id": app_id, "after_name": after_name, "limit": limit}
    rows = await tx.fetchall(Q.namespace_list_for_application, args)
    return [msgspec.convert(r, NamespaceRow) for r in rows]
