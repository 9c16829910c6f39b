"""``client.schedules``: publish schedule versions (ETag, If-Match), read, list, pause,
resume, read occurrences, trigger now, backfill a past range, delete."""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable, Mapping
from datetime import datetime
from typing import Any

import msgspec
from msgspec import UNSET, UnsetType

from . import _json
from ._http import HttpTransport, seg
from ._requests import conditional_headers, decode_resource, iterate_pages, utc_text
from ._tasks import decode_items
from .schedule_types import Backfill, Occurrence, Schedule, ScheduleTaskSpec, Trigger
from .types import Page

__all__ = ["SchedulesAPI"]


class _SchedulePut(msgspec.Struct, kw_only=True):
    """Body of ``PUT .../schedules/{name}``; unset fields are left out (server defaults)."""

    queue: str
    task: ScheduleTaskSpec | dict[str, Any]
    cron: str | UnsetType = UNSET
    every_ms: int | UnsetType = UNSET
    timezone: str | UnsetType = UNSET
    catchup_window_ms: int | UnsetType = UNSET
    grace_ms: int | UnsetType = UNSET
    start_at: str | UnsetType = UNSET
    end_at: str | UnsetType = UNSET
    overlap: str | UnsetType = UNSET


class _Trigger(msgspec.Struct, kw_only=True, omit_defaults=True):
    idempotency_key: str | None = None


class _Backfill(msgspec.Struct, kw_only=True, rename={"from_": "from"}):
    from_: str
    to: str


class SchedulesAPI:
    """Schedules of the client's namespace (``/v1/namespaces/{ns}/schedules``)."""

    def __init__(self, http: HttpTransport, namespace: Callable[[], str]) -> None:
        self._http = http
        self._ns = namespace

    def _path(self, suffix: str = "") -> str:
        return f"/v1/namespaces/{seg(self._ns())}/schedules{suffix}"

    async def put(
        self,
        name: str,
        *,
        queue: str,
        task: ScheduleTaskSpec | Mapping[str, Any],
        cron: str | None = None,
        every_ms: int | None = None,
        timezone: str = "UTC",
        catchup_window_ms: int | None = None,
        grace_ms: int | None = None,
        start_at: datetime | str | None = None,
        end_at: datetime | str | None = None,
        overlap: str | None = None,
        if_match: str | int | None = None,
        create_only: bool = False,
    ) -> Schedule:
        """Create schedule ``name`` (``created=True``, version 1) or publish a new immutable
        version of it. Returns the schedule with its ``etag``.

        Exactly one of ``cron`` (in ``timezone``, an IANA name) and ``every_ms`` (fire times
        are multiples of it from ``start_at``, or from the Unix epoch). The PUT describes the
        whole version: omitted ``catchup_window_ms`` / ``grace_ms`` take the server defaults
        (1 h / 60 s). A PUT equal to the current version changes nothing. ``task`` is a
        :class:`~orbit_sdk.ScheduleTaskSpec` or a mapping with the same keys; its payload
        may be :class:`msgspec.Raw`. Naive datetimes are taken as UTC. ``overlap`` (an
        :class:`~orbit_sdk.Overlap`; server default ``allow``) decides what a fire time does
        while the previous run is unfinished.

        ``if_match`` (an ETag) makes the publish conditional and ``create_only`` sends
        ``If-None-Match: *``; a mismatch raises :class:`~orbit_sdk.errors.PreconditionFailed`.
        An unknown queue raises :class:`~orbit_sdk.errors.NotFound`.
        """
        body = _SchedulePut(
            queue=queue,
            task=task if isinstance(task, ScheduleTaskSpec) else dict(task),
            timezone=timezone,
        )
        if cron is not None:
            body.cron = cron
        if every_ms is not None:
            body.every_ms = every_ms
        if catchup_window_ms is not None:
            body.catchup_window_ms = catchup_window_ms
        if grace_ms is not None:
            body.grace_ms = grace_ms
        if start_at is not None:
            body.start_at = utc_text(start_at)
        if end_at is not None:
            body.end_at = utc_text(end_at)
        if overlap is not None:
            body.overlap = str(overlap)
        response = await self._http.request(
            "PUT",
            self._path(f"/{seg(name)}"),
            body=body,
            headers=conditional_headers(if_match, create_only),
        )
        return decode_resource(response, Schedule)

    async def get(self, name: str) -> Schedule:
        """The schedule: current version, next fire time, ``covered_until`` and ``etag``."""
        return decode_resource(
            await self._http.request("GET", self._path(f"/{seg(name)}")), Schedule
        )

    async def list(self, *, limit: int | None = None, cursor: str | None = None) -> Page[Schedule]:
        """One page of the namespace's schedules, by name."""
        response = await self._http.request(
            "GET", self._path(), params={"limit": limit, "cursor": cursor}
        )
        return decode_items(response.content, Schedule)

    def iter(self, *, page_size: int | None = None) -> AsyncIterator[Schedule]:
        """Every schedule of the namespace, page by page."""
        return iterate_pages(lambda cursor: self.list(limit=page_size, cursor=cursor))

    async def pause(self, name: str) -> Schedule:
        """Pause: what is already due fires first, then nothing more. Idempotent."""
        response = await self._http.request("POST", self._path(f"/{seg(name)}/pause"))
        return decode_resource(response, Schedule)

    async def resume(self, name: str) -> Schedule:
        """Resume: fire times that fell into the pause are recorded as skipped (reason
        ``paused``); firing continues after now. Idempotent."""
        response = await self._http.request("POST", self._path(f"/{seg(name)}/resume"))
        return decode_resource(response, Schedule)

    async def occurrences(
        self,
        name: str,
        *,
        outcome: str | None = None,
        limit: int | None = None,
        cursor: str | None = None,
    ) -> Page[Occurrence]:
        """One page of the schedule's occurrences, newest fire time first. ``outcome``
        filters (``created`` / ``skipped``); a cursor is bound to its filter."""
        response = await self._http.request(
            "GET",
            self._path(f"/{seg(name)}/occurrences"),
            params={"outcome": outcome, "limit": limit, "cursor": cursor},
        )
        return decode_items(response.content, Occurrence)

    def iter_occurrences(
        self, name: str, *, outcome: str | None = None, page_size: int | None = None
    ) -> AsyncIterator[Occurrence]:
        """Every occurrence of the schedule, newest first, following ``next_cursor``."""
        return iterate_pages(
            lambda cursor: self.occurrences(name, outcome=outcome, limit=page_size, cursor=cursor)
        )

    async def trigger(self, name: str, *, idempotency_key: str | None = None) -> Trigger:
        """Fire the schedule once now (paused or not, whatever its overlap policy): exactly
        one occurrence with the current version's task. With ``idempotency_key`` a repeated
        call returns the occurrence the key created (``replayed=True``) instead of a new one,
        for as long as the schedule exists. A refused task raises
        :class:`~orbit_sdk.errors.QuotaExceeded` and writes nothing."""
        response = await self._http.request(
            "POST",
            self._path(f"/{seg(name)}/trigger"),
            body=_Trigger(idempotency_key=idempotency_key),
        )
        return _json.decode(response.content, Trigger)

    async def backfill(
        self, name: str, *, start: datetime | str, end: datetime | str
    ) -> Backfill:
        """Create the task of every fire time in ``[start, end)`` that has not run yet (at
        most 1,000 fire times; each under the version governing it). Fire times that already
        ran are skipped, so repeating a backfill creates nothing new; the range ends at the
        schedule's ``covered_until`` (later fire times are the scheduler's). Naive datetimes
        are taken as UTC."""
        response = await self._http.request(
            "POST",
            self._path(f"/{seg(name)}/backfill"),
            body=_Backfill(from_=utc_text(start), to=utc_text(end)),
        )
        return _json.decode(response.content, Backfill)

    async def delete(self, name: str, *, if_match: str | int | None = None) -> None:
        """Delete the schedule: nothing fires any more and the name is free. Its versions,
        occurrences and tasks stay as history. ``if_match`` makes it conditional."""
        await self._http.request(
            "DELETE", self._path(f"/{seg(name)}"), headers=conditional_headers(if_match)
        )
