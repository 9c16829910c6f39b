"""Workflow definitions: publish validated immutable versions, read them, compile them.

Publishing (``POST /v1/namespaces/{ns}/workflows/{name}/versions``):

* The definition is validated before anything is written (pure, outside the transaction);
  an invalid one is 400 naming the first failing step, with every problem in
  ``details.errors``.
* Versions are numbered 1, 2, … per workflow without gaps: the publish locks the workflow's
  row (``SELECT … FOR UPDATE``) and takes ``latest_version + 1``. The first publish of a
  name inserts the row; a concurrent first publish waits on the unique name index, gets
  1062, then locks the committed row and goes on as a second publish.
* Re-publishing a definition identical to the latest version (same canonical digest: keys
  sorted, whitespace ignored, numbers as written) creates nothing and answers **200** with
  that version and ``"unchanged": true``; a new version answers **201**.
* ``Idempotency-Key`` is honoured (operation ``workflows.publish``, scope = the name).
* The stored text is the exact bytes of the ``definition`` value of the request.

The engine reads versions through :func:`load_definition`, which caches compiled
definitions per (namespace, workflow id, version): versions are immutable, so the cache is
always right.
"""

from __future__ import annotations

from collections import OrderedDict
from datetime import datetime

from orbit import audit, events
from orbit.audit import Actor
from orbit.errors import Conflict
from orbit.idempotency import IdemRequest, Reply, perform
from orbit.ids import id_hex, new_id
from orbit.pagination import encode_cursor
from orbit.storage import CasConflict, Database, DuplicateKey, Tx
from orbit.times import format_time
from orbit.types import check_name
from weave.definition import DefinitionError, check, compile_definition, definition_digest
from weave.definition.model import LANGUAGE_VERSION, Definition
from weave.errors import InvalidDefinition, VersionNotFound, WeaveError, WorkflowNotFound
from weave.store import definitions as store
from weave.types import DefinitionRow, VersionOut, VersionRow, WorkflowOut, WorkflowSummary

PUBLISH = "workflows.publish"
DELETE = "workflows.delete"
#: Running instances named in a 409 at most.
INSTANCES_SHOWN = 20


def version_out(
    d: DefinitionRow, v: VersionRow, *, with_definition: bool = False, unchanged: bool | None = None
) -> VersionOut:
    import msgspec

    return VersionOut(
        name=d.name,
        workflow_id=id_hex(d.id),
        version=v.version,
        digest=v.definition_digest.hex(),
        step_count=v.step_count,
        language_version=v.language_version,
        created_at=format_time(v.created_at),
        definition=msgspec.Raw(v.definition.encode()) if with_definition else msgspec.UNSET,
        unchanged=unchanged if unchanged is not None else msgspec.UNSET,
    )


def workflow_summary(d: DefinitionRow) -> WorkflowSummary:
    return WorkflowSummary(
        id=id_hex(d.id),
        name=d.name,
        owner_id=id_hex(d.owner_id),
        latest_version=d.latest_version,
        created_at=format_time(d.created_at),
        updated_at=format_time(d.updated_at),
    )


def validate_for_publish(raw: bytes) -> tuple[str, bytes, int]:
    """Validate definition bytes; return (text, canonical digest, step count).

    Raises :class:`weave.errors.InvalidDefinition` (400) with every problem.
    """
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError:
        from weave.definition.problems import Problem, Rule

        raise InvalidDefinition(
            [Problem(None, "definition is not UTF-8", Rule.SCHEMA, None)]
        ) from None
    try:
        draft, problems, _ = check(text)
    except DefinitionError as exc:
        raise InvalidDefinition(exc.problems) from None
    if problems:
        raise InvalidDefinition(problems)
    return text, definition_digest(text), len(draft.steps)


async def publish_in_tx(
    tx: Tx,
    actor: Actor,
    namespace_id: bytes,
    name: str,
    text: str,
    digest: bytes,
    step_count: int,
    *,
    request_id: str | None = None,
    now: datetime | None = None,
) -> tuple[int, VersionOut]:
    """Publish an already validated definition in ``tx``; (201, new version) or (200, the
    unchanged latest version). The owner of a new workflow is the actor's application."""
    row = await store.definition_lock_by_name(tx, namespace_id, name)
    created = False
    if row is None:
        definition_id = new_id()
        try:
            await store.definition_insert(
                tx, namespace_id, definition_id, name, actor.application_id or bytes(16), now
            )
            created = True
        except DuplicateKey as exc:
            if exc.key != store.NAME_INDEX:
                raise
        row = await store.definition_lock_by_name(tx, namespace_id, name)
        assert row is not None, "definition row vanished after a duplicate-name insert"
    if created:
        version = 1
    else:
        latest = await store.version_get(tx, namespace_id, row.id, row.latest_version)
        assert latest is not None, "latest_version points at no version row"
        if latest.definition_digest == digest:
            return 200, version_out(row, latest, unchanged=True)
        version = row.latest_version + 1
    await store.version_insert(
        tx,
        namespace_id=namespace_id,
        version_id=new_id(),
        definition_id=row.id,
        version=version,
        definition=text,
        digest=digest,
        language_version=LANGUAGE_VERSION,
        step_count=step_count,
        published_by=actor.credential_id,
        now=now,
    )
    if not created and not await store.definition_set_latest_if_revision(
        tx, namespace_id, row.id, row.revision, version, now
    ):
        raise CasConflict("workflow", "latest_version moved under the row lock")
    row = await store.definition_get(tx, namespace_id, row.id)
    v = await store.version_get(tx, namespace_id, row.id, version) if row is not None else None
    assert row is not None and v is not None
    await events.append_event(
        tx, namespace_id, "workflow.version_published", "workflow", row.id,
        {"name": name, "version": version, "digest": digest.hex()}, request_id, now=now,
    )  # fmt: skip
    await audit.record(
        tx,
        actor=actor,
        action=PUBLISH,
        resource_kind="workflow",
        resource_id=row.id,
        status_code=201,
        namespace_id=namespace_id,
        request_id=request_id,
        details={"name": name, "version": version},
        now=now,
    )
    return 201, version_out(row, v, unchanged=False)


async def publish_version(
    db: Database,
    actor: Actor,
    namespace_id: bytes,
    name: str,
    raw_definition: bytes,
    *,
    request_id: str | None = None,
    idem: IdemRequest | None = None,
    now: datetime | None = None,
) -> Reply:
    """``POST .../workflows/{name}/versions``: validate, then publish in one transaction."""
    check_name(name, "name")
    text, digest, step_count = validate_for_publish(raw_definition)

    async def effect(tx: Tx) -> tuple[int, VersionOut]:
        return await publish_in_tx(
            tx, actor, namespace_id, name, text, digest, step_count, request_id=request_id, now=now
        )

    async def run(tx: Tx) -> Reply:
        return await perform(tx, idem, namespace_id, PUBLISH, name, effect)

    return await db.transaction(run)


class WorkflowInUse(WeaveError, Conflict):
    """A workflow with RUNNING instances cannot be deleted."""

    def __init__(self, name: str, running: int, instances: list[str]) -> None:
        Conflict.__init__(
            self,
            f"workflow {name!r} has {running} running instance{'s' if running > 1 else ''}",
            kind="workflow_in_use",
            running_instances=running,
            instances=instances,
        )


async def delete_definition(
    db: Database,
    actor: Actor,
    namespace_id: bytes,
    name: str,
    *,
    request_id: str | None = None,
) -> None:
    """``DELETE .../workflows/{name}``: remove the workflow so no instance can start and the
    name is free (a later publish starts again at version 1). Refused with 409
    :class:`WorkflowInUse` while any instance of it is RUNNING (paused ones included);
    WorkflowNotFound (404) when absent. Its versions and finished instances stay as
    history until retention removes them."""

    async def run(tx: Tx) -> None:
        row = await store.definition_lock_by_name(tx, namespace_id, name)
        if row is None:
            raise WorkflowNotFound()
        running, ids = await store.definition_running_instances(
            tx, namespace_id, row.id, INSTANCES_SHOWN
        )
        if running:
            raise WorkflowInUse(name, running, [id_hex(i) for i in ids])
        if not await store.definition_delete_if_revision(tx, namespace_id, row.id, row.revision):
            raise CasConflict("workflow", "revision moved under the row lock")
        data = {"name": name, "latest_version": row.latest_version}
        await events.append_event(
            tx, namespace_id, "workflow.deleted", "workflow", row.id, data, request_id
        )
        await audit.record(
            tx, actor=actor, action=DELETE, resource_kind="workflow", resource_id=row.id,
            status_code=204, namespace_id=namespace_id, request_id=request_id, details=data,
        )  # fmt: skip

    await db.transaction(run)


def version_cursor_filters(name: str) -> dict[str, str]:
    """Filters a version-list cursor is bound to (a cursor of one workflow fails on another)."""
    return {"workflow": name}


async def get_workflow(
    db: Database,
    namespace_id: bytes,
    name: str,
    *,
    before_version: int | None = None,
    limit: int = 50,
) -> WorkflowOut:
    """``GET .../workflows/{name}``: the workflow and a page of its versions, newest first."""

    async def run(tx: Tx) -> WorkflowOut:
        row = await store.definition_get_by_name(tx, namespace_id, name)
        if row is None:
            raise WorkflowNotFound()
        start = row.latest_version + 1 if before_version is None else before_version
        versions = await store.version_list(tx, namespace_id, row.id, start, limit)
        more = len(versions) == limit and versions[-1].version > 1
        nxt = (
            encode_cursor({"before": versions[-1].version}, version_cursor_filters(name))
            if more
            else None
        )
        return WorkflowOut(
            id=id_hex(row.id),
            name=row.name,
            owner_id=id_hex(row.owner_id),
            latest_version=row.latest_version,
            created_at=format_time(row.created_at),
            updated_at=format_time(row.updated_at),
            versions=[version_out(row, v) for v in versions],
            next_cursor=nxt,
        )

    return await db.read(run)


async def get_version(db: Database, namespace_id: bytes, name: str, version: int) -> VersionOut:
    """One version with its exact definition text."""

    async def run(tx: Tx) -> VersionOut:
        row = await store.definition_get_by_name(tx, namespace_id, name)
        if row is None:
            raise WorkflowNotFound()
        v = await store.version_get(tx, namespace_id, row.id, version)
        if v is None:
            raise VersionNotFound()
        return version_out(row, v, with_definition=True)

    return await db.read(run)


async def list_workflows(
    db: Database, namespace_id: bytes, after_name: str, limit: int
) -> list[DefinitionRow]:
    async def run(tx: Tx) -> list[DefinitionRow]:
        return await store.definition_list(tx, namespace_id, after_name, limit)

    return await db.read(run)


# ----------------------------------------------------------------------------- for the engine


async def resolve_version(
    tx: Tx, namespace_id: bytes, name: str, version: int | None = None, *, shared: bool = False
) -> tuple[DefinitionRow, VersionRow]:
    """The workflow ``name`` and its ``version`` (latest when None), read in ``tx``;
    ``shared`` reads the workflow under a shared lock (an instance start, so a delete cannot
    pass it: :func:`delete_definition`).

    Raises WorkflowNotFound / VersionNotFound (404). Used by instance start.
    """
    if shared:
        row = await store.definition_get_by_name_shared(tx, namespace_id, name)
    else:
        row = await store.definition_get_by_name(tx, namespace_id, name)
    if row is None:
        raise WorkflowNotFound()
    v = await store.version_get(
        tx, namespace_id, row.id, version if version is not None else row.latest_version
    )
    if v is None:
        raise VersionNotFound()
    return row, v


class DefinitionCache:
    """Bounded LRU of compiled definitions keyed by (namespace, workflow id, version).

    A rebuildable hint only (versions are immutable): losing it costs a re-parse.
    """

    def __init__(self, maxsize: int = 256) -> None:
        self.maxsize = maxsize
        self._items: OrderedDict[tuple[bytes, bytes, int], Definition] = OrderedDict()
        self.hits = 0
        self.misses = 0

    def get(self, namespace_id: bytes, definition_id: bytes, version: int) -> Definition | None:
        key = (namespace_id, definition_id, version)
        d = self._items.get(key)
        if d is not None:
            self.hits += 1
            self._items.move_to_end(key)
        return d

    def get_or_compile(self, v: VersionRow) -> Definition:
        key = (v.namespace_id, v.definition_id, v.version)
        d = self.get(*key)
        if d is not None:
            return d
        self.misses += 1
        d = compile_definition(v.definition)
        self._items[key] = d
        if len(self._items) > self.maxsize:
            self._items.popitem(last=False)
        return d


_CACHE = DefinitionCache()


async def load_definition(
    tx: Tx, namespace_id: bytes, definition_id: bytes, version: int
) -> Definition:
    """The compiled definition of one version (cached). Raises VersionNotFound."""
    cached = _CACHE.get(namespace_id, definition_id, version)
    if cached is not None:
        return cached
    v = await store.version_get(tx, namespace_id, definition_id, version)
    if v is None:
        raise VersionNotFound()
    return _CACHE.get_or_compile(v)
