"""``client.workflows`` (publish and read definition versions) and ``client.instances``
(start, read, history, signal, pause, resume, cancel, wait)."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Callable, Mapping
from typing import Any

import msgspec
from msgspec import UNSET, UnsetType

from . import _json
from ._http import HttpTransport, seg
from ._requests import conditional_headers, decode_resource, iterate_pages
from ._tasks import decode_items, idempotency_headers
from .types import Page
from .workflow_types import (
    History,
    HistoryEntry,
    Instance,
    Signal,
    WorkflowInfo,
    WorkflowSummary,
    WorkflowVersion,
)

__all__ = ["InstancesAPI", "WorkflowsAPI"]


class _Publish(msgspec.Struct):
    definition: Any


class _Start(msgspec.Struct, kw_only=True):
    input: Any = None
    version: int | UnsetType = UNSET
    business_key: str | UnsetType = UNSET


class _SignalBody(msgspec.Struct, kw_only=True):
    signal_id: str
    payload: Any = None
    correlation_key: str | UnsetType = UNSET


def _definition(definition: Any) -> Any:
    """A dict, :class:`msgspec.Raw` (sent byte for byte) or a builder with ``to_dict()``
    (:class:`orbit_sdk.workflow.Workflow`)."""
    if isinstance(definition, (msgspec.Raw, Mapping)):
        return definition
    to_dict = getattr(definition, "to_dict", None)
    if callable(to_dict):
        return to_dict()
    raise TypeError(
        "definition must be a mapping, msgspec.Raw or orbit_sdk.workflow.Workflow, "
        f"not {type(definition).__name__}"
    )


class WorkflowsAPI:
    """Workflow definitions of the client's namespace (``/v1/namespaces/{ns}/workflows``)."""

    def __init__(self, http: HttpTransport, namespace: Callable[[], str]) -> None:
        self._http = http
        self._ns = namespace

    def _path(self, suffix: str = "") -> str:
        return f"/v1/namespaces/{seg(self._ns())}/workflows{suffix}"

    async def publish(
        self, name: str, definition: Any, *, idempotency_key: str | None = None
    ) -> WorkflowVersion:
        """Validate and publish a new immutable version of workflow ``name``.

        ``definition`` is a dict, the builder's :class:`~orbit_sdk.workflow.Workflow`, or
        :class:`msgspec.Raw` JSON bytes (stored exactly as sent). Returns the version with
        ``created=True`` (201), or the latest one with ``unchanged=True`` (200) when the
        definition equals it. An invalid definition raises
        :class:`~orbit_sdk.errors.InvalidRequest` whose ``details`` name the failing
        ``step``, ``rule`` and ``field`` (``details["errors"]`` lists every problem).
        """
        response = await self._http.request(
            "POST",
            self._path(f"/{seg(name)}/versions"),
            body=_Publish(_definition(definition)),
            headers=idempotency_headers(idempotency_key),
        )
        return decode_resource(response, WorkflowVersion)

    async def get(
        self, name: str, *, limit: int | None = None, cursor: str | None = None
    ) -> WorkflowInfo:
        """The workflow and one page of its versions, newest first."""
        return await self._http.call(
            "GET",
            self._path(f"/{seg(name)}"),
            WorkflowInfo,
            params={"limit": limit, "cursor": cursor},
        )

    def iter_versions(
        self, name: str, *, page_size: int | None = None
    ) -> AsyncIterator[WorkflowVersion]:
        """Every version of the workflow, newest first."""

        async def page(cursor: str | None) -> Page[WorkflowVersion]:
            info = await self.get(name, limit=page_size, cursor=cursor)
            return Page(items=info.versions, next_cursor=info.next_cursor)

        return iterate_pages(page)

    async def version(self, name: str, version: int) -> WorkflowVersion:
        """One version with its ``definition`` exactly as published."""
        return await self._http.call(
            "GET", self._path(f"/{seg(name)}/versions/{int(version)}"), WorkflowVersion
        )

    async def list(
        self, *, limit: int | None = None, cursor: str | None = None
    ) -> Page[WorkflowSummary]:
        """One page of the namespace's workflows, by name."""
        response = await self._http.request(
            "GET", self._path(), params={"limit": limit, "cursor": cursor}
        )
        return decode_items(response.content, WorkflowSummary)

    async def delete(self, name: str) -> None:
        """Delete the workflow so no instance can start (a later publish begins again at
        version 1). While an instance runs this raises :class:`~orbit_sdk.errors.Conflict`
        (``details``: ``running_instances``, ``instances``). Versions and finished instances
        stay."""
        await self._http.request("DELETE", self._path(f"/{seg(name)}"))

    def iter(self, *, page_size: int | None = None) -> AsyncIterator[WorkflowSummary]:
        """Every workflow of the namespace."""
        return iterate_pages(lambda cursor: self.list(limit=page_size, cursor=cursor))


class InstancesAPI:
    """Workflow instances of the client's namespace (``/v1/namespaces/{ns}/instances``)."""

    def __init__(self, http: HttpTransport, namespace: Callable[[], str]) -> None:
        self._http = http
        self._ns = namespace

    def _path(self, suffix: str = "") -> str:
        return f"/v1/namespaces/{seg(self._ns())}/instances{suffix}"

    async def start(
        self,
        workflow: str,
        input: Any = None,
        *,
        version: int | None = None,
        business_key: str | None = None,
        idempotency_key: str | None = None,
    ) -> Instance:
        """Start an instance of ``workflow`` (the latest version unless ``version``).

        ``input`` is any msgspec-encodable value or :class:`msgspec.Raw` (kept byte for
        byte); it is checked against the version's ``input_schema`` (mismatch:
        :class:`~orbit_sdk.errors.InvalidRequest` with ``field == "input"``). With
        ``business_key``, a second start returns the existing instance with
        ``deduplicated=True``; ``idempotency_key`` replays the first answer of a retried
        request. A quota refusing the first task raises
        :class:`~orbit_sdk.errors.QuotaExceeded`.
        """
        body = _Start(input=input)
        if version is not None:
            body.version = version
        if business_key is not None:
            body.business_key = business_key
        response = await self._http.request(
            "POST",
            f"/v1/namespaces/{seg(self._ns())}/workflows/{seg(workflow)}/instances",
            body=body,
            headers=idempotency_headers(idempotency_key),
        )
        return decode_resource(response, Instance)

    async def get(self, instance_id: str) -> Instance:
        """The instance with its steps and ``etag`` (404 :class:`~orbit_sdk.errors.NotFound`
        when absent or another namespace's)."""
        return decode_resource(
            await self._http.request("GET", self._path(f"/{seg(instance_id)}")), Instance
        )

    async def list(
        self,
        *,
        workflow: str | None = None,
        state: str | None = None,
        limit: int | None = None,
        cursor: str | None = None,
    ) -> Page[Instance]:
        """One page of instances (without steps), newest first."""
        response = await self._http.request(
            "GET",
            self._path(),
            params={"workflow": workflow, "state": state, "limit": limit, "cursor": cursor},
        )
        return decode_items(response.content, Instance)

    def iter(
        self,
        *,
        workflow: str | None = None,
        state: str | None = None,
        page_size: int | None = None,
    ) -> AsyncIterator[Instance]:
        """Every instance matching the filters, newest first."""
        return iterate_pages(
            lambda cursor: self.list(workflow=workflow, state=state, limit=page_size, cursor=cursor)
        )

    async def history(
        self, instance_id: str, *, limit: int | None = None, cursor: str | None = None
    ) -> History:
        """One page of the instance's history (``items`` by ``seq``; ``transitions`` and
        ``signals`` complete on every page)."""
        return await self._http.call(
            "GET",
            self._path(f"/{seg(instance_id)}/history"),
            History,
            params={"limit": limit, "cursor": cursor},
        )

    def iter_history(
        self, instance_id: str, *, page_size: int | None = None
    ) -> AsyncIterator[HistoryEntry]:
        """Every history entry of the instance, in ``seq`` order."""

        async def page(cursor: str | None) -> Page[HistoryEntry]:
            h = await self.history(instance_id, limit=page_size, cursor=cursor)
            return Page(items=h.items, next_cursor=h.next_cursor)

        return iterate_pages(page)

    async def signal(
        self,
        instance_id: str,
        name: str,
        payload: Any = None,
        *,
        signal_id: str,
        correlation_key: str | None = None,
        idempotency_key: str | None = None,
    ) -> Signal:
        """Send signal ``name`` to the instance; ``payload`` may be :class:`msgspec.Raw`.

        ``signal_id`` (1–128 printable ASCII, chosen by the sender) de-duplicates: sending
        the same signal again returns the first answer with ``duplicate=True``; the same
        ``signal_id`` with anything different raises :class:`~orbit_sdk.errors.Conflict`,
        as does a signal to a finished instance. A signal with no open wait is kept.
        """
        body = _SignalBody(signal_id=signal_id, payload=payload)
        if correlation_key is not None:
            body.correlation_key = correlation_key
        response = await self._http.request(
            "POST",
            self._path(f"/{seg(instance_id)}/signals/{seg(name)}"),
            body=body,
            headers=idempotency_headers(idempotency_key),
        )
        sig = _json.decode(response.content, Signal)
        sig.duplicate = response.status_code == 200
        return sig

    async def _control(
        self, instance_id: str, what: str, if_match: str | int | None, body: Any = None
    ) -> Instance:
        response = await self._http.request(
            "POST",
            self._path(f"/{seg(instance_id)}/{what}"),
            body=body,
            headers=conditional_headers(if_match),
        )
        return decode_resource(response, Instance)

    async def pause(self, instance_id: str, *, if_match: str | int | None = None) -> Instance:
        """Pause a RUNNING instance (what happens meanwhile is kept as pending advances).
        Idempotent. ``if_match`` (the instance's ``etag``) makes it conditional
        (:class:`~orbit_sdk.errors.PreconditionFailed`); a finished instance raises
        :class:`~orbit_sdk.errors.Conflict`."""
        return await self._control(instance_id, "pause", if_match)

    async def resume(self, instance_id: str, *, if_match: str | int | None = None) -> Instance:
        """Resume a paused instance, applying its pending advances in order. Idempotent."""
        return await self._control(instance_id, "resume", if_match)

    async def cancel(
        self,
        instance_id: str,
        *,
        reason: str | None = None,
        if_match: str | int | None = None,
    ) -> Instance:
        """Cancel the instance and its running tasks (``error.code == "cancelled"``, with
        ``reason`` as the message). Cancelling a cancelled instance changes nothing; a
        SUCCEEDED or FAILED one raises :class:`~orbit_sdk.errors.Conflict`."""
        body = {"reason": reason} if reason is not None else None
        return await self._control(instance_id, "cancel", if_match, body)

    async def wait(
        self,
        instance_id: str,
        *,
        timeout: float | None = None,  # noqa: ASYNC109 - a deadline reads better for producers
        interval: float = 0.2,
    ) -> Instance:
        """Poll until the instance is SUCCEEDED, FAILED or CANCELLED; return it.

        Raises :class:`TimeoutError` after ``timeout`` seconds (None: wait forever).
        """
        async with asyncio.timeout(timeout):
            while True:
                instance = await self.get(instance_id)
                if instance.is_terminal:
                    return instance
                await asyncio.sleep(interval)
