"""A schedule version: the PUT body (:class:`SchedulePut`), its checks and the columns it
becomes (:func:`version_fields`), and the JSON views of schedules, versions and occurrences.
Pure: no database; the service is :mod:`pulse.schedules`."""

from __future__ import annotations

from datetime import datetime
from typing import Annotated, Any, Literal

import msgspec
from msgspec import Meta

from orbit.business_json import check_json_text
from orbit.errors import InvalidRequest
from orbit.ids import id_hex
from orbit.times import Time, format_opt, format_time, parse_time
from pulse.cron import CronError, local_text, make_timing, tzdata_version
from pulse.scheduler import render_dedup_key, timing_of
from pulse.types import NO_TRAILING_SPACE, Name

#: Defaults of a PUT body (docs/api/schedules.md).
DEFAULT_GRACE_MS = 60_000
DEFAULT_CATCHUP_MS = 3_600_000
_MAX_MS = 10 * 366 * 86_400_000

Ms = Annotated[int, Meta(ge=0, le=_MAX_MS)]
#: What a fire time does while the schedule's previous run is unfinished
#: (:mod:`pulse.schedule_overlap`).
Overlap = Literal["allow", "skip", "buffer_one", "cancel_previous"]

class ScheduleTask(msgspec.Struct, forbid_unknown_fields=True, kw_only=True):
    """The task template of a schedule version (``task`` of a PUT body)."""

    kind: Annotated[str, Meta(min_length=1, max_length=255, extra_json_schema=NO_TRAILING_SPACE)]
    payload: msgspec.Raw = msgspec.field(default_factory=lambda: msgspec.Raw(b"null"))
    priority: Annotated[int, Meta(ge=0, le=9)] = 0
    pipeline_version: Annotated[str, Meta(max_length=64, extra_json_schema=NO_TRAILING_SPACE)] = ""
    #: Dedup rule (additive): a template with ``{schedule}``, ``{fire_at}``,
    #: ``{fire_at_local}``, ``{version}``; None = no de-duplication beyond the occurrence.
    dedup_key: (
        Annotated[str, Meta(min_length=1, max_length=255, extra_json_schema=NO_TRAILING_SPACE)]
        | None
    ) = None
    max_attempts: Annotated[int, Meta(ge=1, le=1000)] | None = None
    retry_safe: bool = False
    #: Deadline of each task, counted from its fire time (additive).
    deadline_ms: Annotated[int, Meta(ge=1, le=_MAX_MS)] | None = None


class SchedulePut(msgspec.Struct, forbid_unknown_fields=True, kw_only=True):
    """``PUT /v1/namespaces/{ns}/schedules/{name}``: the whole new version."""

    queue: Name
    task: ScheduleTask
    cron: Annotated[str, Meta(min_length=1, max_length=255)] | None = None
    every_ms: Annotated[int, Meta(ge=1000, le=_MAX_MS)] | None = None
    timezone: Annotated[str, Meta(min_length=1, max_length=64)] = "UTC"
    catchup_window_ms: Ms = DEFAULT_CATCHUP_MS
    grace_ms: Ms = DEFAULT_GRACE_MS
    start_at: Time | None = None
    end_at: Time | None = None
    overlap: Overlap = "allow"




# ------------------------------------------------------------------------------ validation

_SAMPLE_FIRE = datetime(2000, 12, 31, 23, 59, 59, 999999)


def _time(value: str | None, field: str) -> datetime | None:
    if value is None:
        return None
    try:
        return parse_time(value)
    except ValueError as exc:
        raise InvalidRequest(f"{field}: {exc}", field=field) from None


def _no_trailing_space(value: str | None, field: str) -> None:
    # utf8mb4_bin pads with spaces: "a" and "a " would be the same task identity.
    if value is not None and value.endswith(" "):
        raise InvalidRequest(f"{field} must not end with a space", field=field)


def version_fields(body: SchedulePut) -> dict[str, Any]:
    """The stored fields of the version ``body`` describes (400 naming the field when
    invalid). Builds the fire-time computation once, so a version that is stored can
    always be computed."""
    task = body.task
    payload = check_json_text(bytes(task.payload), "task.payload")
    _no_trailing_space(task.kind, "task.kind")
    _no_trailing_space(task.pipeline_version, "task.pipeline_version")
    _no_trailing_space(task.dedup_key, "task.dedup_key")
    start_at = _time(body.start_at, "start_at")
    end_at = _time(body.end_at, "end_at")
    try:
        make_timing(
            cron=body.cron,
            every_ms=body.every_ms,
            timezone=body.timezone,
            start_at=start_at,
            end_at=end_at,
        )
    except CronError as exc:
        raise InvalidRequest(str(exc), field=exc.field) from None
    if task.dedup_key is not None:
        widest = render_dedup_key(
            task.dedup_key, schedule="n" * 63, fire_at=_SAMPLE_FIRE,
            local="2000-12-31T23:59:59.999999+14:00", version=4_294_967_295,
        )  # fmt: skip
        if len(widest) > 255:
            raise InvalidRequest(
                "task.dedup_key can render longer than 255 characters", field="task.dedup_key"
            )
    options = {
        k: v
        for k, v in (
            ("dedup_key", task.dedup_key),
            ("max_attempts", task.max_attempts),
            ("retry_safe", task.retry_safe or None),
            ("deadline_ms", task.deadline_ms),
        )
        if v is not None
    }
    return {
        "queue_name": body.queue,
        "cron": None if body.cron is None else " ".join(body.cron.split()),
        "every_ms": body.every_ms,
        "timezone": body.timezone,
        "tzdata_version": tzdata_version(),
        "task_kind": task.kind,
        "task_payload": payload,
        "task_priority": task.priority,
        "task_pipeline_version": task.pipeline_version,
        "task_options": msgspec.json.encode(options, order="sorted").decode() if options else None,
        "catchup_window_ms": body.catchup_window_ms,
        "grace_ms": body.grace_ms,
        "start_at": start_at,
        "end_at": end_at,
        "overlap": body.overlap,
    }


def _decoded_options(value: Any) -> dict[str, Any]:
    if value is None:
        return {}
    if isinstance(value, (str, bytes)):
        out = msgspec.json.decode(value)
        return out if isinstance(out, dict) else {}
    return dict(value)


def _same_version(stored: dict[str, Any], fields: dict[str, Any]) -> bool:
    for key, value in fields.items():
        old = stored[key]
        if key == "task_options":
            if _decoded_options(old) != _decoded_options(value):
                return False
        elif key in ("every_ms", "task_priority", "catchup_window_ms", "grace_ms"):
            if (None if old is None else int(old)) != value:
                return False
        elif old != value:
            return False
    return True


# ------------------------------------------------------------------------------ views


def version_view(version: dict[str, Any]) -> dict[str, Any]:
    """The configuration of a version as the API shows it."""
    opts = _decoded_options(version["task_options"])
    return {
        "version": int(version["version"]),
        "queue": version["queue_name"],
        "cron": version["cron"],
        "every_ms": None if version["every_ms"] is None else int(version["every_ms"]),
        "timezone": version["timezone"],
        "tzdata_version": version["tzdata_version"],
        "task": {
            "kind": version["task_kind"],
            "payload": msgspec.Raw(version["task_payload"].encode("utf-8")),
            "priority": int(version["task_priority"]),
            "pipeline_version": version["task_pipeline_version"],
            "dedup_key": opts.get("dedup_key"),
            "max_attempts": opts.get("max_attempts"),
            "retry_safe": bool(opts.get("retry_safe", False)),
            "deadline_ms": opts.get("deadline_ms"),
        },
        "catchup_window_ms": int(version["catchup_window_ms"]),
        "grace_ms": int(version["grace_ms"]),
        "start_at": format_opt(version["start_at"]),
        "end_at": format_opt(version["end_at"]),
        "overlap": version["overlap"],
        "published_at": format_time(version["created_at"]),
    }


def schedule_view(row: dict[str, Any], version: dict[str, Any], now: datetime) -> dict[str, Any]:
    """The API schedule object: identity, state, the current version's configuration, the
    next fire time (null when paused or finished) and ``covered_until``."""
    timing = timing_of(version)
    nxt = None
    if not row["paused"]:
        nxt = timing.next_fire(max(now, row["covered_until"], version["created_at"]))
    return {
        "id": id_hex(row["id"]),
        "name": row["name"],
        "owner_id": id_hex(row["owner_id"]),
        "revision": int(row["revision"]),
        "paused": bool(row["paused"]),
        "control_revision": int(row["control_revision"]),
        **version_view(version),
        "tzdata_current": tzdata_version(),
        "next_fire_at": format_opt(nxt),
        "next_fire_at_local": None if nxt is None else local_text(timing.zone, nxt),
        "covered_until": format_time(row["covered_until"]),
        "check_at": format_opt(row["check_at"]),
        "last_task_id": None if row["last_task_id"] is None else id_hex(row["last_task_id"]),
        "buffered_fire_at": format_opt(row["buffered_fire_at"]),
        "created_at": format_time(row["created_at"]),
        "updated_at": format_time(row["updated_at"]),
    }


def occurrence_view(row: dict[str, Any]) -> dict[str, Any]:
    """An occurrence as the API shows it."""
    return {
        "id": id_hex(row["id"]),
        "fire_at": format_time(row["fire_at"]),
        "fire_at_local": row["fire_at_local"],
        "version": int(row["version"]),
        "task_id": None if row["task_id"] is None else id_hex(row["task_id"]),
        "outcome": row["outcome"],
        "late": bool(row["late"]),
        "covered_until": format_opt(row["covered_until"]),
        "skipped_count": None if row["skipped_count"] is None else int(row["skipped_count"]),
        "reason": row["reason"],
        "origin": row["origin"],
        "idempotency_key": row["trigger_key"],
        "created_at": format_time(row["created_at"]),
    }
