"""Server settings with defaults; read from the environment (``ORBIT_*``) or set by tests."""

from __future__ import annotations

import os
from dataclasses import dataclass, fields

MiB = 1024 * 1024


@dataclass(frozen=True, slots=True)
class Settings:
    """Tunables of the platform. Every field has an ``ORBIT_<NAME>`` environment override."""

    #: Largest accepted request body in bytes (default 1 MiB, docs/api/conventions.md#limits);
    #: larger → 413.
    max_body_bytes: int = MiB
    #: Seconds a request body may take to arrive, from the start of the request; slower →
    #: 408 and the connection is closed (a body trickled byte by byte holds no socket).
    body_timeout_s: float = 30.0
    #: Most bytes of stored JSON one list page carries (docs/api/conventions.md#lists); a page
    #: that reaches it ends early with a ``next_cursor``.
    max_page_bytes: int = 4 * MiB
    #: Bytes of list pages one application may read from a node per second, and at once
    #: (orbit/list_bytes.py); past it → 429 ``rate_limited``.
    list_bytes_per_s: int = 8 * MiB
    list_bytes_burst: int = 32 * MiB
    #: Deepest accepted JSON request body (the body object is level 1); deeper → 400.
    max_json_depth: int = 32
    #: How long an Idempotency-Key is remembered (default 24 h,
    #: docs/api/conventions.md#idempotency).
    idempotency_retention_s: int = 24 * 3600
    #: Rows deleted per idempotency cleanup round, and seconds between rounds.
    idempotency_cleanup_batch: int = 1000
    idempotency_cleanup_interval_s: float = 60.0
    #: Seconds between background refreshes of the database-computed gauges of /metrics.
    metrics_refresh_s: float = 10.0
    #: Retention purge (docs/operations.md#retention-and-purge): rows per purge transaction,
    #: batches per kind of history in one pass over a namespace, and seconds between passes
    #: over a namespace that has caught up.
    retention_purge_batch: int = 500
    retention_purge_max_batches: int = 20
    retention_purge_interval_s: float = 60.0
    #: Share of the time a purge pass may spend in its transactions (0.05-1): after each
    #: batch it pauses so batches take at most this share (1: no pause).
    retention_purge_duty: float = 0.5

    @classmethod
    def from_env(cls, env: dict[str, str] | None = None, **overrides: object) -> Settings:
        """Defaults, overridden by ``ORBIT_<FIELD>`` variables, overridden by ``overrides``."""
        source = os.environ if env is None else env
        values: dict[str, object] = {}
        for f in fields(cls):
            raw = source.get(f"ORBIT_{f.name.upper()}")
            if raw is not None:
                values[f.name] = float(raw) if f.type in ("float", float) else int(raw)
        values.update({k: v for k, v in overrides.items() if v is not None})
        return cls(**values)  # type: ignore[arg-type]
