"""``client.queues``: create/update queues (ETag, If-Match), read, list, pause, resume."""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable
from typing import Any

import httpx
from msgspec import UNSET, UnsetType

from . import _json
from ._http import HttpTransport, seg
from ._tasks import decode_items
from .types import Page, Queue, QueueConfig, RetryBounds, RetryPolicy

__all__ = ["QueuesAPI"]


def _queue_from(response: httpx.Response) -> Queue:
    queue = _json.decode(response.content or b"{}", Queue)
    queue.etag = response.headers.get("etag")
    queue.created = response.status_code == 201
    return queue


class QueuesAPI:
    """Queues of the client's namespace (``/v1/namespaces/{ns}/queues``)."""

    def __init__(self, http: HttpTransport, namespace: Callable[[], str]) -> None:
        self._http = http
        self._ns = namespace

    def _path(self, suffix: str = "") -> str:
        return f"/v1/namespaces/{seg(self._ns())}/queues{suffix}"

    async def put(
        self,
        name: str,
        *,
        max_unfinished_tasks: int | UnsetType | None = UNSET,
        max_concurrency: int | UnsetType | None = UNSET,
        max_starts_per_second: float | UnsetType | None = UNSET,
        lease_ms: int | UnsetType = UNSET,
        retry: RetryPolicy | UnsetType = UNSET,
        retry_bounds: RetryBounds | UnsetType = UNSET,
        stuck_after_ms: int | UnsetType | None = UNSET,
        if_match: str | None = None,
        create_only: bool = False,
    ) -> Queue:
        """Create (``created=True``) or update a queue; returns it with its ``etag``.

        ``if_match`` (an ETag from :meth:`get`/:meth:`put`) makes the update conditional:
        a concurrent change raises :class:`~orbit_sdk.errors.PreconditionFailed`.
        ``create_only`` sends ``If-None-Match: *`` (an existing queue → PreconditionFailed).
        Unset fields are not sent. ``None`` means unlimited where the server allows it.
        ``retry_bounds`` limits what a task's own retry policy may ask for.
        """
        config = QueueConfig(
            max_unfinished_tasks=max_unfinished_tasks,
            max_concurrency=max_concurrency,
            max_starts_per_second=max_starts_per_second,
            lease_ms=lease_ms,
            retry=retry,
            retry_bounds=retry_bounds,
            stuck_after_ms=stuck_after_ms,
        )
        headers: dict[str, str] = {}
        if if_match is not None:
            headers["If-Match"] = if_match
        if create_only:
            headers["If-None-Match"] = "*"
        response = await self._http.request(
            "PUT", self._path(f"/{seg(name)}"), body=config, headers=headers
        )
        return _queue_from(response)

    async def get(self, name: str) -> Queue:
        """The queue's configuration, live counts by state and ``etag``."""
        return _queue_from(await self._http.request("GET", self._path(f"/{seg(name)}")))

    async def list(self, *, limit: int | None = None, cursor: str | None = None) -> Page[Queue]:
        """One page of queues."""
        response = await self._http.request(
            "GET", self._path(), params={"limit": limit, "cursor": cursor}
        )
        return decode_items(response.content, Queue)

    async def iter(self, *, page_size: int | None = None) -> AsyncIterator[Queue]:
        """Every queue of the namespace, page by page."""
        cursor: str | None = None
        while True:
            page = await self.list(limit=page_size, cursor=cursor)
            for queue in page.items:
                yield queue
            if not page.next_cursor:
                return
            cursor = page.next_cursor

    async def pause(self, name: str) -> Any:
        """Close the queue's execution gate (no new starts; running attempts continue).
        Idempotent. Returns the server's answer as plain JSON values."""
        response = await self._http.request("POST", self._path(f"/{seg(name)}/pause"))
        return _json.decode(response.content or b"null")

    async def resume(self, name: str) -> Any:
        """Open the queue's execution gate again. Idempotent."""
        response = await self._http.request("POST", self._path(f"/{seg(name)}/resume"))
        return _json.decode(response.content or b"null")

    async def delete(self, name: str, *, if_match: str | None = None) -> None:
        """Delete a queue nothing holds any more. While it has unfinished tasks, a schedule
        targets it or a worker session takes work from it, this raises
        :class:`~orbit_sdk.errors.Conflict` whose ``details`` name them
        (``unfinished_tasks``, ``schedules``, ``sessions``). Finished tasks stay readable."""
        headers = {"If-Match": if_match} if if_match is not None else None
        await self._http.request("DELETE", self._path(f"/{seg(name)}"), headers=headers)
