"""Progress of running attempts: a small JSON document a handler reports with its heartbeat.

A heartbeat (WebSocket frame or HTTP) may carry ``progress``: a JSON object per attempt it
lists (``{"<attempt id>": {...}}``; the attempt heartbeat route takes one object). The
heartbeat round writes each document with the lease it extends, in the same two guarded
UPDATEs (pulse/heartbeat_round.py), onto the attempt and onto its task: so a document is
kept only while its attempt still holds the task, and costs no statement of its own. The
task shows it while that attempt is its latest (``progress_generation``).

Bounds: at most :data:`MAX_PROGRESS_BYTES` of JSON text per document, an object (``{…}``),
for an attempt the same heartbeat lists. Anything else is a 400 ``invalid_request`` naming
``progress.<attempt id>``, and the heartbeat changes nothing.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import msgspec

from orbit.errors import InvalidRequest
from orbit.times import format_opt

#: The largest progress document, in bytes of JSON text.
MAX_PROGRESS_BYTES = 4096


def check_progress(
    progress: Mapping[str, msgspec.Raw] | None, attempt_ids: Sequence[str]
) -> dict[str, str]:
    """The documents of a heartbeat, checked: attempt id → its JSON object text (as sent,
    without surrounding whitespace). Raises 400 naming the first bad one."""
    if not progress:
        return {}
    listed = set(attempt_ids)
    out: dict[str, str] = {}
    for attempt_id, raw in progress.items():
        field = f"progress.{attempt_id}"
        if attempt_id not in listed:
            raise InvalidRequest(
                "progress may be reported only for an attempt the heartbeat lists", field=field
            )
        text = bytes(raw).strip()
        if len(text) > MAX_PROGRESS_BYTES:
            raise InvalidRequest(
                f"progress is {len(text)} bytes of JSON, at most {MAX_PROGRESS_BYTES}",
                field=field, max_bytes=MAX_PROGRESS_BYTES,
            )  # fmt: skip
        if not text.startswith(b"{"):
            raise InvalidRequest("progress must be a JSON object", field=field)
        try:  # the frame or body it came in was parsed as JSON; its text must be UTF-8
            out[attempt_id] = text.decode("utf-8")
        except UnicodeDecodeError:
            raise InvalidRequest("progress is not valid UTF-8", field=field) from None
    return out


def task_progress(row: Mapping[str, Any]) -> tuple[msgspec.Raw | None, str | None]:
    """``(progress, progress_at)`` of a task row: the document of its latest attempt (None
    when that attempt reported none, or the row was read without the columns)."""
    text = row.get("progress")
    if text is None or row.get("progress_generation") != row.get("attempts"):
        return None, None
    return msgspec.Raw(text.encode() if isinstance(text, str) else bytes(text)), format_opt(
        row.get("progress_at")
    )


def attempt_progress(row: Mapping[str, Any]) -> tuple[msgspec.Raw | None, str | None]:
    """``(progress, progress_at)`` of an attempt row (None: none reported)."""
    text = row.get("progress")
    if text is None:
        return None, None
    raw = text.encode() if isinstance(text, str) else bytes(text)
    return msgspec.Raw(raw), format_opt(row.get("progress_at"))
