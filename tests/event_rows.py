"""Raw events as rows, for tests that check what a transaction recorded.

Raw events are stored as batch rows (one per transaction, namespace, event type and subject
kind; orbit/events.py). :func:`raw_events` reads them back one row per change, shaped like a
table row — ``type``, ``subject_kind``, ``subject_id`` (bytes or None), ``data`` (JSON
text), ``request_id``, ``created_at`` — oldest first, optionally filtered.
"""

from __future__ import annotations

from typing import Any

import msgspec

from orbit.events import namespace_events
from orbit.storage import Tx


async def raw_events(
    tx: Tx,
    namespace_id: bytes,
    *,
    type: str | None = None,
    type_prefix: str | None = None,
    subject_kind: str | None = None,
    subject_id: bytes | None = None,
) -> list[dict[str, Any]]:
    """The namespace's raw events, one dict per change (see the module docstring)."""
    out: list[dict[str, Any]] = []
    for e in await namespace_events(tx, namespace_id, type=type):
        if type_prefix is not None and not e.type.startswith(type_prefix):
            continue
        if subject_kind is not None and e.subject_kind != subject_kind:
            continue
        if subject_id is not None and e.subject_id != subject_id:
            continue
        out.append({
            "type": e.type, "subject_kind": e.subject_kind, "subject_id": e.subject_id,
            "data": msgspec.json.encode(e.data).decode(), "request_id": e.request_id,
            "created_at": e.created_at,
        })  # fmt: skip
    return out
