"""``client.tasks``: submit, read, list, cancel, resolve and re-run tasks; read a task's
history and result events."""

from __future__ import annotations

import asyncio
import builtins
from collections.abc import AsyncIterator, Callable, Mapping, Sequence
from datetime import datetime
from typing import Any, TypeVar

import msgspec
from msgspec import UNSET

from . import _json
from ._http import HttpTransport, seg
from ._requests import utc_text
from .history_types import TaskEvent, TaskEventPage
from .types import (
    Attempt,
    BatchItem,
    CancelAllResult,
    Event,
    EventPage,
    Page,
    RetryAllResult,
    Task,
    TaskRetry,
    TaskSpec,
)

__all__ = ["TasksAPI"]

T = TypeVar("T")


class _BatchResult(msgspec.Struct):
    items: builtins.list[BatchItem] = msgspec.field(default_factory=builtins.list)


def idempotency_headers(key: str | None) -> dict[str, str] | None:
    """The ``Idempotency-Key`` header for a creating call (None: no header)."""
    return {"Idempotency-Key": key} if key is not None else None


def decode_items(content: bytes, item: type[T]) -> Page[T]:
    """Decode a list answer: the ``{"items", "next_cursor"}`` page, or a bare JSON array."""
    if content.lstrip()[:1] == b"[":
        return Page(items=_json.decode(content, builtins.list[item]))  # type: ignore[valid-type]
    return _json.decode(content or b"{}", Page[item])  # type: ignore[valid-type]


class TasksAPI:
    """Tasks of the client's namespace (``/v1/namespaces/{ns}/tasks``)."""

    def __init__(self, http: HttpTransport, namespace: Callable[[], str]) -> None:
        self._http = http
        self._ns = namespace

    def _path(self, suffix: str = "") -> str:
        return f"/v1/namespaces/{seg(self._ns())}/tasks{suffix}"

    async def submit(
        self,
        queue: str,
        kind: str,
        payload: Any = None,
        *,
        pipeline_version: str | None = None,
        dedup_key: str | None = None,
        priority: int | None = None,
        delay_ms: int | None = None,
        available_at: datetime | None = None,
        deadline_at: datetime | None = None,
        max_attempts: int | None = None,
        retry_safe: bool | None = None,
        concurrency_key: str | None = None,
        retry: TaskRetry | Mapping[str, Any] | None = None,
        idempotency_key: str | None = None,
        fairness_key: str | None = None,
    ) -> Task:
        """Submit one task. Returns the new task, or the existing one with
        ``deduplicated=True`` when ``(kind, pipeline_version, dedup_key)`` already exists
        for this owner. Pass ``msgspec.Raw(b"...")`` as ``payload`` to send exact bytes.
        ``retry`` (a :class:`~orbit_sdk.TaskRetry` or a mapping with its keys) gives the task
        its own backoff, within the queue's ``retry_bounds``. ``fairness_key`` (an end user or
        subject of yours) makes dispatch within the queue rotate across the keys with due
        tasks, so one subject's flood does not hold another's tasks back."""
        spec = TaskSpec(queue=queue, kind=kind, payload=payload)
        for name, value in (
            ("pipeline_version", pipeline_version),
            ("dedup_key", dedup_key),
            ("priority", priority),
            ("delay_ms", delay_ms),
            ("available_at", available_at),
            ("deadline_at", deadline_at),
            ("max_attempts", max_attempts),
            ("retry_safe", retry_safe),
            ("concurrency_key", concurrency_key),
            ("fairness_key", fairness_key),
            ("retry", msgspec.convert(retry, TaskRetry) if isinstance(retry, Mapping) else retry),
        ):
            if value is not None:
                setattr(spec, name, value)
        return await self._http.call(
            "POST", self._path(), Task, body=spec, headers=idempotency_headers(idempotency_key)
        )

    async def submit_batch(
        self,
        tasks: Sequence[TaskSpec | Mapping[str, Any]],
        *,
        idempotency_key: str | None = None,
    ) -> builtins.list[BatchItem]:
        """Submit up to 1000 tasks in one transaction; one :class:`BatchItem` per task, in
        order. Valid items commit together; invalid ones carry their ``error``."""
        result = await self._http.call(
            "POST",
            self._path(":batch"),
            _BatchResult,
            body={"tasks": builtins.list(tasks)},
            headers=idempotency_headers(idempotency_key),
        )
        return result.items

    async def get(self, task_id: str) -> Task:
        """The task (404 :class:`~orbit_sdk.errors.NotFound` if absent or not visible)."""
        return await self._http.call("GET", self._path(f"/{seg(task_id)}"), Task)

    async def list(
        self,
        *,
        queue: str | None = None,
        state: str | None = None,
        kind: str | None = None,
        owner_id: str | None = None,
        dedup_key: str | None = None,
        stuck: bool | None = None,
        limit: int | None = None,
        cursor: str | None = None,
    ) -> Page[Task]:
        """One page of tasks matching the filters (cursors are bound to their filters).

        ``stuck=True``: only the tasks the server's stuck-work watchdog surfaced in their
        current state (``Task.stuck_at`` / ``Task.stuck_reason`` say when and why);
        ``stuck=False``: only the others; None: no filter.
        """
        params = {
            "queue": queue,
            "state": state,
            "kind": kind,
            "owner_id": owner_id,
            "dedup_key": dedup_key,
            "stuck": None if stuck is None else ("true" if stuck else "false"),
            "limit": limit,
            "cursor": cursor,
        }
        response = await self._http.request("GET", self._path(), params=params)
        return decode_items(response.content, Task)

    async def iter(
        self,
        *,
        queue: str | None = None,
        state: str | None = None,
        kind: str | None = None,
        owner_id: str | None = None,
        dedup_key: str | None = None,
        stuck: bool | None = None,
        page_size: int | None = None,
    ) -> AsyncIterator[Task]:
        """Every task matching the filters, following ``next_cursor`` page by page."""
        cursor: str | None = None
        while True:
            page = await self.list(
                queue=queue,
                state=state,
                kind=kind,
                owner_id=owner_id,
                dedup_key=dedup_key,
                stuck=stuck,
                limit=page_size,
                cursor=cursor,
            )
            for task in page.items:
                yield task
            if not page.next_cursor:
                return
            cursor = page.next_cursor

    async def cancel(self, task_id: str) -> Task:
        """Cancel a task: a waiting or leased task is CANCELLED at once; a running one gets
        ``cancel_requested=True`` and its worker is told to stop. Another terminal state
        raises :class:`~orbit_sdk.errors.Conflict`."""
        response = await self._http.request("POST", self._path(f"/{seg(task_id)}/cancel"))
        task = _json.decode(response.content, Task)
        if response.status_code == 202 and not task.cancel_requested:
            task.cancel_requested = True
        return task

    async def cancel_all(
        self,
        *,
        owner_id: str | None = None,
        queue: str | None = None,
        kind: str | None = None,
    ) -> CancelAllResult:
        """Cancel every unfinished task matching the filters ("stop everything of this
        owner" is ``cancel_all(owner_id=...)``)."""
        body = {
            k: v
            for k, v in (("owner_id", owner_id), ("queue", queue), ("kind", kind))
            if v is not None
        }
        return await self._http.call("POST", self._path(":cancel"), CancelAllResult, body=body)

    async def resolve(
        self,
        task_id: str,
        action: str,
        *,
        note: str,
        result: Any = UNSET,
        error: Mapping[str, Any] | None = None,
    ) -> Task:
        """Resolve a NEEDS_REVIEW task: ``action`` is ``"retry"``, ``"succeed"`` (with
        ``result``) or ``"fail"`` (with ``error``); ``note`` is kept in the audit trail."""
        body: dict[str, Any] = {"action": action, "note": note}
        if result is not UNSET:
            body["result"] = result
        if error is not None:
            body["error"] = dict(error)
        return await self._http.call(
            "POST", self._path(f"/{seg(task_id)}/resolve"), Task, body=body
        )

    async def retry(self, task_id: str, *, note: str, attempts: int = 1) -> Task:
        """Re-run a FAILED or CANCELLED task: back to WAITING with a new generation, at least
        ``attempts`` more attempts allowed; its attempts stay in its history and ``note`` is
        kept on it (``resolution``) and in the audit trail. Another state raises
        :class:`~orbit_sdk.errors.Conflict`; a full queue
        :class:`~orbit_sdk.errors.QuotaExceeded`."""
        return await self._http.call(
            "POST", self._path(f"/{seg(task_id)}/retry"), Task,
            body={"note": note, "attempts": attempts},
        )  # fmt: skip

    async def retry_all(
        self,
        *,
        note: str,
        attempts: int = 1,
        states: Sequence[str] | None = None,
        queue: str | None = None,
        kind: str | None = None,
        owner_id: str | None = None,
        error_type: str | None = None,
        finished_after: datetime | str | None = None,
        finished_before: datetime | str | None = None,
        dry_run: bool = False,
    ) -> RetryAllResult:
        """Re-run every finished task of the filters (``states`` FAILED and/or CANCELLED,
        default both; ``error_type`` matches a failed task's error ``type``; the finish time
        in ``[finished_after, finished_before)``, ``finished_before`` defaulting to now), oldest
        finish first. ``dry_run`` only counts (``matched``, ``more`` past 100,000). A quota
        that fills up stops it (``quota_refused``)."""
        body: dict[str, Any] = {"note": note, "attempts": attempts, "dry_run": dry_run}
        for name, value in (("states", list(states) if states else None), ("queue", queue),
                            ("kind", kind), ("owner_id", owner_id), ("error_type", error_type),
                            ("finished_after", finished_after),
                            ("finished_before", finished_before)):  # fmt: skip
            if value is not None:
                body[name] = utc_text(value) if isinstance(value, datetime) else value
        return await self._http.call("POST", self._path(":retry"), RetryAllResult, body=body)

    async def attempts(self, task_id: str) -> builtins.list[Attempt]:
        """The task's attempts, oldest first, with the server's evidence."""
        response = await self._http.request("GET", self._path(f"/{seg(task_id)}/attempts"))
        return decode_items(response.content, Attempt).items

    async def history(
        self, task_id: str, *, limit: int | None = None, cursor: str | None = None
    ) -> TaskEventPage:
        """One page of the task's raw state events, oldest first (needs ``tasks.read``). A
        page may hold fewer than ``limit`` events and still have a ``next_cursor``."""
        response = await self._http.request(
            "GET", self._path(f"/{seg(task_id)}/events"), params={"limit": limit, "cursor": cursor}
        )
        return _json.decode(response.content, TaskEventPage)

    async def iter_history(
        self, task_id: str, *, page_size: int | None = None
    ) -> AsyncIterator[TaskEvent]:
        """Every raw state event of the task, oldest first, page by page."""
        cursor: str | None = None
        while True:
            page = await self.history(task_id, limit=page_size, cursor=cursor)
            for event in page.events:
                yield event
            if not page.next_cursor:
                return
            cursor = page.next_cursor

    async def events(
        self, *, after_seq: int = 0, limit: int | None = None, cursor: str | None = None
    ) -> EventPage:
        """Result events of the namespace with ``seq > after_seq`` (or from ``cursor``), in
        sequence order. Keep polling with ``after_seq=page.next_after_seq``."""
        params = {"after_seq": None if cursor else after_seq, "limit": limit, "cursor": cursor}
        response = await self._http.request(
            "GET", f"/v1/namespaces/{seg(self._ns())}/events", params=params
        )
        if response.content.lstrip()[:1] == b"[":
            items = _json.decode(response.content, builtins.list[Event])
            return EventPage(items=items, next_after_seq=items[-1].seq if items else after_seq)
        return _json.decode(response.content, EventPage)

    async def wait(
        self,
        task_id: str,
        *,
        timeout: float | None = None,  # noqa: ASYNC109 - a deadline reads better for producers
        interval: float = 0.2,
    ) -> Task:
        """Poll until the task is terminal or NEEDS_REVIEW; return it.

        Raises :class:`TimeoutError` after ``timeout`` seconds (None: wait forever).
        """
        async with asyncio.timeout(timeout):
            while True:
                task = await self.get(task_id)
                if task.is_terminal or task.state == "NEEDS_REVIEW":
                    return task
                await asyncio.sleep(interval)
