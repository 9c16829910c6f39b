"""``orbit admin bootstrap``: get-or-create an application, a namespace and an all-powerful key
for that namespace, directly on the database (no server, no key needed).

Idempotent: re-running never creates a second application, namespace or credential and
**changes nothing**: every key keeps working. The key is the application's credential named
``bootstrap/<namespace>`` (``bootstrap-global/<ns>`` with ``--global-admin``). It is shown
only when the credential is created (a revoked one is replaced by a new one); since only its
digest is stored, a re-run answers ``"key": null`` with a hint. Only ``rotate=True``
(``--rotate``) replaces its secret — the new key is shown once, the previous one stops
working on its next request, and the rotation is audited (``credentials.rotate``).
Concurrent runs serialise on the application row; a lost insert race is retried.
"""

from __future__ import annotations

from dataclasses import dataclass

from orbit import audit
from orbit.applications import insert_application
from orbit.audit import CLI_ACTOR
from orbit.credentials import insert_credential, new_key
from orbit.errors import Conflict
from orbit.ids import id_hex
from orbit.namespaces import insert_namespace
from orbit.storage import Database, Tx
from orbit.store import applications as app_store
from orbit.store import credentials as cred_store
from orbit.store import namespaces as ns_store
from orbit.types import ALL_ACTIONS, check_name

ROTATE = "credentials.rotate"


#: What a re-run says when the credential exists (its key cannot be shown again).
EXISTING_HINT = (
    "the application, namespace and bootstrap credential already exist and nothing was"
    " changed: the key shown when the credential was created (or last rotated) still works;"
    " run again with --rotate to replace it (the previous key then stops working)"
)


@dataclass(frozen=True, slots=True)
class BootstrapResult:
    """What bootstrap made or found. ``key`` is the clear key when the credential was created
    or rotated by this run, None when it already existed (its key still works)."""

    application_id: bytes
    namespace: str
    namespace_id: bytes
    credential_id: bytes
    key: str | None
    created_application: bool = False
    created_namespace: bool = False
    created_credential: bool = False
    rotated: bool = False

    @property
    def hint(self) -> str | None:
        """Why there is no key (None when there is one)."""
        return EXISTING_HINT if self.key is None else None

    def to_json(self) -> dict[str, object]:
        """The contract's line ``{"application_id", "namespace", "credential_id", "key"}``
        (docs/api/conventions.md#command-line-fixed-names-and-flags), plus what this run
        created, whether it rotated the key, and the hint of a re-run."""
        out: dict[str, object] = {
            "application_id": id_hex(self.application_id),
            "namespace": self.namespace,
            "credential_id": id_hex(self.credential_id),
            "key": self.key,
            "created": {
                "application": self.created_application,
                "namespace": self.created_namespace,
                "credential": self.created_credential,
            },
            "rotated": self.rotated,
        }
        if self.hint is not None:
            out["hint"] = self.hint
        return out


def credential_name(namespace: str, global_admin: bool) -> str:
    return f"{'bootstrap-global' if global_admin else 'bootstrap'}/{namespace}"


async def bootstrap(
    db: Database,
    application: str,
    namespace: str,
    *,
    global_admin: bool = False,
    rotate: bool = False,
) -> BootstrapResult:
    """Get-or-create ``application``/``namespace`` and its bootstrap credential.

    The key holds every action, ``admin`` for the application, on that namespace; with
    ``global_admin`` it may also create and administer other applications. An existing
    credential is left as it is (``key`` None) unless ``rotate``: then its secret is
    replaced and its full grant restored, audited as ``credentials.rotate``.
    """
    check_name(application, "application")
    check_name(namespace, "namespace")

    async def run(tx: Tx) -> BootstrapResult:
        app = await app_store.application_get_by_name_for_update(tx, application)
        new_app = app is None
        if app is None:
            app = await insert_application(tx, CLI_ACTOR, application)
        ns = await ns_store.namespace_get_by_name(tx, app.id, namespace)
        new_ns = ns is None
        if ns is None:
            ns = await insert_namespace(tx, CLI_ACTOR, app.id, namespace)
        made = {"created_application": new_app, "created_namespace": new_ns}
        name = credential_name(namespace, global_admin)
        grant = [id_hex(ns.id)]
        cred = await cred_store.credential_find_by_name(tx, app.id, name)
        if cred is None:
            row, key = await insert_credential(
                tx,
                CLI_ACTOR,
                app.id,
                name=name,
                namespaces=grant,
                actions=ALL_ACTIONS,
                global_admin=global_admin,
            )
            return BootstrapResult(app.id, ns.name, ns.id, row.id, key, **made,
                                   created_credential=True)  # fmt: skip
        if not rotate:  # a re-run: nothing changes, every key keeps working
            return BootstrapResult(app.id, ns.name, ns.id, cred.id, None, **made)
        key, secret_digest = new_key(cred.id)
        ok = await cred_store.credential_rotate_if_revision(
            tx,
            cred.id,
            cred.revision,
            secret_digest=secret_digest,
            namespaces=grant,
            actions=ALL_ACTIONS,
            global_admin=global_admin,
        )
        if not ok:
            raise Conflict("bootstrap credential changed concurrently", kind="cas")
        await audit.record(
            tx,
            actor=CLI_ACTOR,
            action=ROTATE,
            resource_kind="credential",
            resource_id=cred.id,
            status_code=0,
            details={"application_id": id_hex(app.id), "reason": "bootstrap"},
        )
        return BootstrapResult(app.id, ns.name, ns.id, cred.id, key, **made, rotated=True)

    for attempt in range(5):
        try:
            return await db.transaction(run)
        except Conflict:
            # A concurrent bootstrap created the same application/namespace first, or
            # rotated the key between our read and write: run again, it now exists.
            if attempt == 4:
                raise
    raise AssertionError("unreachable")
