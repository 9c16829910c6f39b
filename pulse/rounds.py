"""Shared plumbing of Pulse's periodic background loops (recovery, the stuck-work watchdog)
and their settings: one place for the round-then-sleep loop and the ``ORBIT_PULSE_<NAME>``
environment overrides."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import random
from collections.abc import Awaitable, Callable
from dataclasses import fields
from typing import Any, TypeVar

S = TypeVar("S")


def settings_from_env(cls: type[S], env: dict[str, str] | None, overrides: dict[str, int]) -> S:
    """``cls`` (a dataclass of int fields) with each field overridden by
    ``ORBIT_PULSE_<FIELD>`` from ``env`` (default: the process environment), then by
    ``overrides``."""
    source = os.environ if env is None else env
    values: dict[str, Any] = {}
    for f in fields(cls):  # type: ignore[arg-type]
        raw = source.get(f"ORBIT_PULSE_{f.name.upper()}")
        if raw is not None:
            values[f.name] = int(raw)
    values.update(overrides)
    return cls(**values)


async def run_rounds(
    round_once: Callable[[], Awaitable[bool]],
    interval_s: float,
    stop: asyncio.Event | None,
    log: logging.Logger,
    what: str,
) -> None:
    """Run ``round_once`` until ``stop`` is set (or the task is cancelled): at once again
    while it returns True (a backlog), else after ``interval_s`` with ±20 % jitter (so nodes
    do not run in step). A failed round is logged and the loop goes on."""
    while stop is None or not stop.is_set():
        try:
            if await round_once():
                continue
        except asyncio.CancelledError:
            raise
        except Exception:
            log.exception("%s round failed", what)
        delay = interval_s * random.uniform(0.8, 1.2)
        if stop is None:
            await asyncio.sleep(delay)
        else:
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(stop.wait(), delay)
