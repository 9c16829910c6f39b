"""SQL for ``weave_definitions`` and ``weave_definition_versions``."""

from __future__ import annotations

from datetime import datetime
from typing import Any

import msgspec

from orbit.storage import Tx, load_queries
from weave.types import DefinitionRow, VersionRow

Q = load_queries(__file__, "definitions")
#: Unique index on (namespace_id, name): a concurrent first publish of the same name.
NAME_INDEX = "uq_weave_definitions_name"
#: Unique index on (namespace_id, definition_id, version).
VERSION_INDEX = "uq_weave_definition_versions_version"


def _definition(row: dict[str, Any] | None) -> DefinitionRow | None:
    return None if row is None else msgspec.convert(row, DefinitionRow)


def _version(row: dict[str, Any] | None) -> VersionRow | None:
    return None if row is None else msgspec.convert(row, VersionRow)


async def definition_get_by_name(tx: Tx, namespace_id: bytes, name: str) -> DefinitionRow | None:
    return _definition(
        await tx.fetchone(Q.definition_get_by_name, {"namespace_id": namespace_id, "name": name})
    )


async def definition_get_by_name_shared(
    tx: Tx, namespace_id: bytes, name: str
) -> DefinitionRow | None:
    """Read the definition row under a shared lock (an instance start)."""
    return _definition(
        await tx.fetchone(
            Q.definition_get_by_name_shared, {"namespace_id": namespace_id, "name": name}
        )
    )


async def definition_delete_if_revision(
    tx: Tx, namespace_id: bytes, definition_id: bytes, revision: int
) -> bool:
    """Delete the definition row (versions stay). False: the revision moved on."""
    n = await tx.execute(
        Q.definition_delete_if_revision,
        {"namespace_id": namespace_id, "id": definition_id, "revision": revision},
    )
    return n == 1


async def definition_running_instances(
    tx: Tx, namespace_id: bytes, definition_id: bytes, limit: int
) -> tuple[int, list[bytes]]:
    """(how many RUNNING instances the definition has, the first ``limit`` ids)."""
    rows = await tx.fetchall(
        Q.definition_running_instances,
        {"namespace_id": namespace_id, "definition_id": definition_id, "limit": limit},
    )
    return (int(rows[0]["total"]) if rows else 0), [r["id"] for r in rows]


async def definition_lock_by_name(tx: Tx, namespace_id: bytes, name: str) -> DefinitionRow | None:
    """Read and lock the definition row (FOR UPDATE); None when the name is new."""
    return _definition(
        await tx.fetchone(Q.definition_lock_by_name, {"namespace_id": namespace_id, "name": name})
    )


async def definition_get(tx: Tx, namespace_id: bytes, definition_id: bytes) -> DefinitionRow | None:
    return _definition(
        await tx.fetchone(Q.definition_get, {"namespace_id": namespace_id, "id": definition_id})
    )


async def definition_insert(
    tx: Tx,
    namespace_id: bytes,
    definition_id: bytes,
    name: str,
    owner_id: bytes,
    now: datetime | None,
) -> None:
    """Insert a definition with latest_version 1. DuplicateKey(NAME_INDEX) when the name exists
    (the INSERT waits for a concurrent creator's commit first)."""
    await tx.execute(
        Q.definition_insert,
        {
            "namespace_id": namespace_id,
            "id": definition_id,
            "name": name,
            "owner_id": owner_id,
            "now": now,
        },
    )


async def definition_set_latest_if_revision(
    tx: Tx,
    namespace_id: bytes,
    definition_id: bytes,
    revision: int,
    version: int,
    now: datetime | None,
) -> bool:
    """Move latest_version to ``version`` (= the old latest + 1). False means the row moved on
    since the caller read ``revision`` (cannot happen under the caller's row lock)."""
    n = await tx.execute(
        Q.definition_set_latest_if_revision,
        {
            "namespace_id": namespace_id,
            "id": definition_id,
            "revision": revision,
            "version": version,
            "now": now,
        },
    )
    return n == 1


async def definition_list(
    tx: Tx, namespace_id: bytes, after_name: str, limit: int
) -> list[DefinitionRow]:
    rows = await tx.fetchall(
        Q.definition_list, {"namespace_id": namespace_id, "after_name": after_name, "limit": limit}
    )
    return [msgspec.convert(r, DefinitionRow) for r in rows]


async def version_insert(
    tx: Tx,
    *,
    namespace_id: bytes,
    version_id: bytes,
    definition_id: bytes,
    version: int,
    definition: str,
    digest: bytes,
    language_version: int,
    step_count: int,
    published_by: bytes | None,
    now: datetime | None,
) -> None:
    """Insert an immutable version. DuplicateKey(VERSION_INDEX) if the number is taken."""
    await tx.execute(
        Q.version_insert,
        {
            "namespace_id": namespace_id,
            "id": version_id,
            "definition_id": definition_id,
            "version": version,
            "definition": definition,
            "digest": digest,
            "language_version": language_version,
            "step_count": step_count,
            "published_by": published_by,
            "now": now,
        },
    )


async def version_get(
    tx: Tx, namespace_id: bytes, definition_id: bytes, version: int
) -> VersionRow | None:
    args = {"namespace_id": namespace_id, "definition_id": definition_id, "version": version}
    return _version(await tx.fetchone(Q.version_get, args))


async def version_list(
    tx: Tx, namespace_id: bytes, definition_id: bytes, before_version: int, limit: int
) -> list[VersionRow]:
    """Versions below ``before_version``, newest first (``definition`` is empty here)."""
    args = {
        "namespace_id": namespace_id,
        "definition_id": definition_id,
        "before_version": before_version,
        "limit": limit,
    }
    return [msgspec.convert(r, VersionRow) for r in await tx.fetchall(Q.version_list, args)]
