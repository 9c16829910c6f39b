"""Credentials (API keys): format, creation, revocation, authentication.

**Key format**: ``orb_<credential id, 32 lowercase hex>_<secret>``, where the secret is 43
URL-safe base64 characters (32 random bytes). Only SHA-256(secret) is stored
(``secret_digest BINARY(32)``); the key is shown once, in the 201 answer of its creation.
Authentication parses the id, reads that one row (joined with its application and the
requested namespace) and compares digests in constant time.

**No credential cache.** Every authenticated request reads the credential row by primary key
(one indexed read that also resolves ``{ns}``), so revocation, expiry (judged by the database
clock) and disabling the application take effect on the very next request on every node.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass, replace
from datetime import datetime

import msgspec

from orbit import audit
from orbit.audit import Actor
from orbit.errors import Forbidden, InvalidRequest, NotFound, Unauthenticated
from orbit.idempotency import DEFAULT_RETENTION_S, IdemRequest, Reply, perform
from orbit.ids import digest, digest_matches, id_hex, new_id, new_secret, parse_id
from orbit.storage import Database, Tx
from orbit.store import credentials as store
from orbit.store import namespaces as ns_store
from orbit.store.clock import clock_now
from orbit.times import format_opt, format_time, parse_time
from orbit.types import (
    ACTIONS,
    ALL_NAMESPACES,
    ZERO_ID,
    AuthRow,
    CredentialCreate,
    CredentialOut,
    CredentialRow,
)

KEY_PREFIX = "orb"
_KEY_RE = re.compile(r"orb_([0-9a-f]{32})_([A-Za-z0-9_\-]{16,128})")
CREATE = "credentials.create"
REVOKE = "credentials.revoke"


def format_key(cred_id: bytes, secret: str) -> str:
    """``orb_<32 hex id>_<secret>``."""
    return f"{KEY_PREFIX}_{id_hex(cred_id)}_{secret}"


def parse_key(key: str) -> tuple[bytes, str] | None:
    """(credential id, secret) of a well-formed key, else None."""
    m = _KEY_RE.fullmatch(key)
    if m is None:
        return None
    cred_id = parse_id(m.group(1))
    return None if cred_id is None else (cred_id, m.group(2))


def new_key(cred_id: bytes) -> tuple[str, bytes]:
    """A fresh key for ``cred_id`` and the digest to store."""
    secret = new_secret(32)
    return format_key(cred_id, secret), digest(secret)


@dataclass(frozen=True, slots=True)
class Principal:
    """Who is calling and what the presented key may do.

    ``namespace_ids`` None means every namespace of the application. ``namespace_id`` and
    ``namespace_name`` are set once a route's ``{ns}`` was authorised.
    """

    application_id: bytes
    credential_id: bytes
    actions: frozenset[str]
    queues: frozenset[str] | None
    global_admin: bool
    namespace_ids: frozenset[bytes] | None
    credential_revision: int
    namespace_id: bytes | None = None
    namespace_name: str | None = None

    @property
    def actor(self) -> Actor:
        return Actor(self.credential_id, self.application_id)

    def may(self, action: str) -> bool:
        return action in self.actions

    def may_use_queue(self, queue: str) -> bool:
        return self.queues is None or queue in self.queues

    def sees_namespace(self, namespace_id: bytes) -> bool:
        return self.namespace_ids is None or namespace_id in self.namespace_ids

    def administers(self, application_id: bytes) -> bool:
        """True when this key holds ``admin`` for ``application_id`` (or is a global admin)."""
        return self.may("admin") and (self.global_admin or application_id == self.application_id)

    def in_namespace(self, namespace_id: bytes, name: str) -> Principal:
        return replace(self, namespace_id=namespace_id, namespace_name=name)


async def authenticate(
    db: Database, key: str | None, namespace: str | None = None, *, now: datetime | None = None
) -> tuple[Principal, bytes | None]:
    """Verify ``key``; return the principal and the id of ``namespace`` in its application
    (None when absent or not requested). Visibility of that namespace is the caller's check.

    Raises Unauthenticated (401) for a missing, malformed, unknown, wrong, revoked or expired
    key, or one whose application is disabled. The message does not say which.
    """
    parsed = parse_key(key) if key else None
    if parsed is None:
        raise Unauthenticated("missing or invalid API key")
    cred_id, secret = parsed

    async def run(tx: Tx) -> AuthRow | None:
        return await store.credential_get_for_auth(tx, cred_id, namespace, now)

    row = await db.read(run)
    if row is None or not digest_matches(secret, row.secret_digest):
        raise Unauthenticated("missing or invalid API key")
    if row.revoked or row.expired or row.application_status != "active":
        raise Unauthenticated("missing or invalid API key")
    namespace_ids: frozenset[bytes] | None
    if ALL_NAMESPACES in row.namespaces:
        namespace_ids = None
    else:
        namespace_ids = frozenset(b for b in (parse_id(h) for h in row.namespaces) if b)
    principal = Principal(
        application_id=row.application_id,
        credential_id=row.id,
        actions=frozenset(row.actions),
        queues=None if row.queues is None else frozenset(row.queues),
        global_admin=row.global_admin,
        namespace_ids=namespace_ids,
        credential_revision=row.revision,
    )
    return principal, row.namespace_id


def credential_out(
    row: CredentialRow, names: dict[str, str], key: str | None = None
) -> CredentialOut:
    """API view; ``names`` maps namespace id hex → name (unknown ids are shown as ids)."""
    return CredentialOut(
        id=id_hex(row.id),
        application_id=id_hex(row.application_id),
        name=row.name,
        namespaces=[names.get(n, n) for n in row.namespaces],
        actions=list(row.actions),
        queues=None if row.queues is None else list(row.queues),
        global_admin=row.global_admin,
        expires_at=format_opt(row.expires_at),
        revoked_at=format_opt(row.revoked_at),
        revision=row.revision,
        created_at=format_time(row.created_at),
        key=key,
    )


async def _namespace_names(tx: Tx, app_id: bytes) -> dict[str, str]:
    rows = await ns_store.namespace_list_for_application(tx, app_id, "", 10_000)
    return {id_hex(r.id): r.name for r in rows}


def _validate_actions(actions: Sequence[str]) -> list[str]:
    out: list[str] = []
    for i, a in enumerate(actions):
        if a not in ACTIONS:
            raise InvalidRequest(f"unknown action {a!r}", field=f"actions[{i}]")
        if a not in out:
            out.append(a)
    if not out:
        raise InvalidRequest("at least one action is required", field="actions")
    return out


async def _resolve_namespaces(tx: Tx, app_id: bytes, names: Sequence[str]) -> list[str]:
    if list(names) == [ALL_NAMESPACES]:
        return [ALL_NAMESPACES]
    out: list[str] = []
    for i, name in enumerate(names):
        row = await ns_store.namespace_get_by_name(tx, app_id, name)
        if row is None:
            raise InvalidRequest(
                f"no namespace {name!r} in this application", field=f"namespaces[{i}]"
            )
        if id_hex(row.id) not in out:
            out.append(id_hex(row.id))
    return out


async def insert_credential(
    tx: Tx,
    actor: Actor,
    app_id: bytes,
    *,
    name: str,
    namespaces: Sequence[str],
    actions: Sequence[str],
    queues: Sequence[str] | None = None,
    expires_at: datetime | None = None,
    global_admin: bool = False,
    request_id: str | None = None,
    now: datetime | None = None,
) -> tuple[CredentialRow, str]:
    """Create a credential in ``tx`` (namespace *ids* or ``"*"``); return (row, clear key)."""
    cred_id = new_id()
    key, secret_digest = new_key(cred_id)
    await store.credential_insert(
        tx,
        cred_id=cred_id,
        app_id=app_id,
        name=name,
        secret_digest=secret_digest,
        namespaces=namespaces,
        actions=actions,
        queues=None if queues is None else sorted(set(queues)),
        global_admin=global_admin,
        expires_at=expires_at,
        now=now,
    )
    await audit.record(
        tx,
        actor=actor,
        action=CREATE,
        resource_kind="credential",
        resource_id=cred_id,
        status_code=201,
        request_id=request_id,
        details={
            "application_id": id_hex(app_id),
            "actions": list(actions),
            "global_admin": global_admin,
        },
        now=now,
    )
    row = await store.credential_get(tx, cred_id)
    assert row is not None
    return row, key


def _redacted(out: CredentialOut) -> CredentialOut:
    return msgspec.structs.replace(out, key=None, key_redacted=True)


async def create_credential(
    db: Database,
    principal: Principal,
    app_id: bytes,
    body: CredentialCreate,
    *,
    request_id: str | None = None,
    idem: IdemRequest | None = None,
    retention_s: int = DEFAULT_RETENTION_S,
) -> Reply:
    """``POST /v1/applications/{app_id}/credentials`` → 201 ``{"id", "key", ...}``.

    Namespaces are given by name (or ``["*"]``); unknown names and actions answer 400 naming
    the entry. Only a global admin may grant ``global_admin`` (403 otherwise). An expiry in
    the past (database clock) answers 400. The stored idempotent reply omits the key.
    """
    if body.global_admin and not principal.global_admin:
        raise Forbidden("only a global admin may create a global admin key")
    actions = _validate_actions(body.actions)
    if not body.namespaces:
        raise InvalidRequest('at least one namespace (or "*") is required', field="namespaces")
    expires_at: datetime | None = None
    if body.expires_at is not None:
        try:
            expires_at = parse_time(body.expires_at)
        except ValueError as exc:
            raise InvalidRequest(str(exc), field="expires_at") from None

    async def effect(tx: Tx) -> tuple[int, CredentialOut]:
        if expires_at is not None and expires_at <= await clock_now(tx):
            raise InvalidRequest("expires_at is in the past", field="expires_at")
        ns_ids = await _resolve_namespaces(tx, app_id, body.namespaces)
        row, key = await insert_credential(
            tx,
            principal.actor,
            app_id,
            name=body.name,
            namespaces=ns_ids,
            actions=actions,
            queues=body.queues,
            expires_at=expires_at,
            global_admin=body.global_admin,
            request_id=request_id,
        )
        return 201, credential_out(row, await _namespace_names(tx, app_id), key)

    async def run(tx: Tx) -> Reply:
        return await perform(
            tx,
            idem,
            ZERO_ID,
            CREATE,
            id_hex(app_id),
            effect,
            redact=_redacted,
            retention_s=retention_s,
        )

    return await db.transaction(run)


async def revoke_credential(
    db: Database, principal: Principal, cred_id: bytes, *, request_id: str | None = None
) -> CredentialOut:
    """``DELETE /v1/credentials/{id}``: revoke; revoking a revoked key is a 200 no-op.

    A credential of another application (unless the caller is a global admin) is the same
    404 as an absent one. Effective on the next request: authentication reads the row.
    """

    async def run(tx: Tx) -> CredentialOut:
        row = await store.credential_get(tx, cred_id)
        if row is None or not principal.administers(row.application_id):
            raise NotFound("credential")
        if row.revoked_at is None:
            # False means it was revoked concurrently: the goal state holds, re-read below.
            if await store.credential_revoke_if_revision(tx, cred_id, row.revision, None):
                await audit.record(
                    tx,
                    actor=principal.actor,
                    action=REVOKE,
                    resource_kind="credential",
                    resource_id=cred_id,
                    status_code=200,
                    request_id=request_id,
                    details={"application_id": id_hex(row.application_id)},
                )
            fresh = await store.credential_get(tx, cred_id)
            assert fresh is not None
            row = fresh
        return credential_out(row, await _namespace_names(tx, row.application_id))

    return await db.transaction(run)


async def list_credentials(
    db: Database, app_id: bytes, after_id: bytes, limit: int
) -> list[CredentialOut]:
    """Credentials of one application ordered by id (never keys or digests)."""

    async def run(tx: Tx) -> list[CredentialOut]:
        rows = await store.credential_list_for_application(tx, app_id, after_id, limit)
        names = await _namespace_names(tx, app_id) if rows else {}
        return [credential_out(r, names) for r in rows]

    return await db.read(run)
