"""``client.workers`` (connected worker sessions, an operator's close) and ``client.audit``
(the namespace's audit trail)."""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable
from datetime import datetime

from . import _json
from ._http import HttpTransport, seg
from ._requests import iterate_pages, utc_text
from ._tasks import decode_items
from .ops_types import AuditEvent, Retention, WorkerPage, WorkerSession
from .types import Page
from .wire import SessionClosed

__all__ = ["AuditAPI", "RetentionAPI", "WorkersAPI"]


class WorkersAPI:
    """Worker sessions of the client's namespace (``/v1/namespaces/{ns}/workers``)."""

    def __init__(self, http: HttpTransport, namespace: Callable[[], str]) -> None:
        self._http = http
        self._ns = namespace

    def _path(self, suffix: str = "") -> str:
        return f"/v1/namespaces/{seg(self._ns())}/workers{suffix}"

    async def list(
        self,
        *,
        state: str | None = None,
        queue: str | None = None,
        limit: int | None = None,
        cursor: str | None = None,
    ) -> WorkerPage:
        """One page of sessions by id: ACTIVE unless ``state`` says otherwise (``CLOSED``,
        ``EXPIRED`` or ``any``); ``queue`` keeps the sessions that take work from it (a key
        limited to some queues must give one). Needs ``tasks.read``."""
        response = await self._http.request(
            "GET", self._path(),
            params={"state": state, "queue": queue, "limit": limit, "cursor": cursor},
        )  # fmt: skip
        return _json.decode(response.content, WorkerPage)

    async def iter(
        self, *, state: str | None = None, queue: str | None = None, page_size: int | None = None
    ) -> AsyncIterator[WorkerSession]:
        """Every session matching the filters, page by page."""
        cursor: str | None = None
        while True:
            page = await self.list(state=state, queue=queue, limit=page_size, cursor=cursor)
            for session in page.sessions:
                yield session
            if not page.next_cursor:
                return
            cursor = page.next_cursor

    async def close(self, session_id: str) -> SessionClosed:
        """Close a session as an operator: its offers go back to their queues, its running
        attempts are recovered as when a session expires (retried when ``retry_safe``, else
        NEEDS_REVIEW). Idempotent. Needs ``queues.manage``. The worker process opens a new
        session: stop the process (or pause queues) to stop its work."""
        response = await self._http.request(
            "POST", self._path(f"/{seg(session_id)}/close"), body={}
        )
        return _json.decode(response.content, SessionClosed)


class AuditAPI:
    """The audit trail of the client's namespace (``/v1/namespaces/{ns}/audit``)."""

    def __init__(self, http: HttpTransport, namespace: Callable[[], str]) -> None:
        self._http = http
        self._ns = namespace

    async def list(
        self,
        *,
        outcome: str | None = None,
        action: str | None = None,
        since: datetime | str | None = None,
        until: datetime | str | None = None,
        limit: int | None = None,
        cursor: str | None = None,
    ) -> Page[AuditEvent]:
        """One page of audit events, newest first. ``since`` is inclusive, ``until``
        exclusive (naive datetimes are UTC). Needs ``admin``."""
        response = await self._http.request(
            "GET",
            f"/v1/namespaces/{seg(self._ns())}/audit",
            params={
                "outcome": outcome, "action": action,
                "since": None if since is None else utc_text(since),
                "until": None if until is None else utc_text(until),
                "limit": limit, "cursor": cursor,
            },
        )  # fmt: skip
        return decode_items(response.content, AuditEvent)

    def iter(
        self,
        *,
        outcome: str | None = None,
        action: str | None = None,
        since: datetime | str | None = None,
        until: datetime | str | None = None,
        page_size: int | None = None,
    ) -> AsyncIterator[AuditEvent]:
        """Every matching audit event, newest first, following ``next_cursor``."""
        return iterate_pages(
            lambda cursor: self.list(
                outcome=outcome, action=action, since=since, until=until, limit=page_size,
                cursor=cursor,
            )
        )  # fmt: skip


class RetentionAPI:
    """The retention windows of the client's namespace (``/v1/namespaces/{ns}/retention``;
    needs ``admin``)."""

    def __init__(self, http: HttpTransport, namespace: Callable[[], str]) -> None:
        self._http = http
        self._ns = namespace

    def _path(self) -> str:
        return f"/v1/namespaces/{seg(self._ns())}/retention"

    async def get(self) -> Retention:
        """The windows and the purge's progress (``purged_total``, ``last_run_at``)."""
        return await self._http.call("GET", self._path(), Retention)

    async def put(
        self,
        *,
        finished_tasks_days: int | None = None,
        events_days: int | None = None,
        audit_days: int | None = None,
        idempotency_hours: int | None = None,
        if_match: int | None = None,
    ) -> Retention:
        """Replace the whole settings (a window left None keeps that history forever);
        ``if_match`` a revision makes it conditional (412 otherwise)."""
        body = {"finished_tasks_days": finished_tasks_days, "events_days": events_days,
                "audit_days": audit_days, "idempotency_hours": idempotency_hours}  # fmt: skip
        headers = None if if_match is None else {"If-Match": f'"{if_match}"'}
        return await self._http.call("PUT", self._path(), Retention, body=body, headers=headers)
