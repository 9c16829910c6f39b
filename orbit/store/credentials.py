"""SQL for ``orbit_credentials``. JSON columns are decoded here."""

from __future__ import annotations

from collections.abc import Sequence
from datetime import datetime
from typing import Any

import msgspec

from orbit.storage import Tx, load_queries
from orbit.types import AuthRow, CredentialRow

Q = load_queries(__file__, "credentials")
_ENC = msgspec.json.Encoder()


def _decode_json(row: dict[str, Any]) -> dict[str, Any]:
    out = dict(row)
    for col in ("namespaces", "actions", "queues"):
        value = out.get(col)
        if isinstance(value, (str, bytes)):
            out[col] = msgspec.json.decode(value)
    for col in ("global_admin", "revoked", "expired"):
        if col in out:
            out[col] = bool(out[col])
    return out


def _json(value: Sequence[str] | None) -> str | None:
    return None if value is None else _ENC.encode(list(value)).decode()


async def credential_insert(
    tx: Tx,
    *,
    cred_id: bytes,
    app_id: bytes,
    name: str,
    secret_digest: bytes,
    namespaces: Sequence[str],
    actions: Sequence[str],
    queues: Sequence[str] | None,
    global_admin: bool,
    expires_at: datetime | None,
    now: datetime | None,
) -> None:
    await tx.execute(
        Q.credential_insert,
        {
            "id": cred_id,
            "application_id": app_id,
            "name": name,
            "secret_digest": secret_digest,
            "namespaces": _json(namespaces),
            "actions": _json(actions),
            "queues": _json(queues),
            "global_admin": int(global_admin),
            "expires_at": expires_at,
            "now": now,
        },
    )


async def credential_get_for_auth(
    tx: Tx, cred_id: bytes, namespace: str | None, now: datetime | None
) -> AuthRow | None:
    """The credential, its application's status and ``namespace`` resolved (one query)."""
    row = await tx.fetchone(
        Q.credential_get_for_auth, {"id": cred_id, "namespace": namespace, "now": now}
    )
    return None if row is None else msgspec.convert(_decode_json(row), AuthRow)


async def credential_get(tx: Tx, cred_id: bytes) -> CredentialRow | None:
    row = await tx.fetchone(Q.credential_get, {"id": cred_id})
    return None if row is None else msgspec.convert(_decode_json(row), CredentialRow)


async def credential_find_by_name(tx: Tx, app_id: bytes, name: str) -> CredentialRow | None:
    """The oldest unrevoked credential of the application with this name."""
    row = await tx.fetchone(Q.credential_find_by_name, {"application_id": app_id, "name": name})
    return None if row is None else msgspec.convert(_decode_json(row), CredentialRow)


async def credential_list_for_application(
    tx: Tx, app_id: bytes, after_id: bytes, limit: int
) -> list[CredentialRow]:
    args = {"application_id": app_id, "after_id": after_id, "limit": limit}
    rows = await tx.fetchall(Q.credential_list_for_application, args)
    return [msgspec.convert(_decode_json(r), CredentialRow) for r in rows]


async def credential_revoke_if_revision(
    tx: Tx, cred_id: bytes, revision: int, now: datetime | None
) -> bool:
    """False: already revoked, or the revision moved on."""
    args = {"id": cred_id, "revision": revision, "now": now}
    return await tx.execute(Q.credential_revoke_if_revision, args) == 1


async def credential_rotate_if_revision(
    tx: Tx,
    cred_id: bytes,
    revision: int,
    *,
    secret_digest: bytes,
    namespaces: Sequence[str],
    actions: Sequence[str],
    global_admin: bool,
) -> bool:
    """Give the credential a new secret and grant; False when the revision moved on."""
    args = {
        "id": cred_id,
        "revision": revision,
        "secret_digest": secret_digest,
        "namespaces": _json(namespaces),
        "actions": _json(actions),
        "global_admin": int(global_admin),
    }
    return await tx.execute(Q.credential_rotate_if_revision, args) == 1
