"""A task's own retry policy, within the bounds its queue sets.

A submit may give ``retry: {"backoff_initial_ms"?, "backoff_max_ms"?, "backoff_multiplier"?}``
(its ``max_attempts`` stays where it always was, at the top of the body). What it gives
replaces the queue's default retry policy for this task; what it leaves out keeps the
queue's value. The policy is frozen into the task at submit, like the queue's.

The queue's ``retry_bounds: {"min_delay_ms"?, "max_delay_ms"?, "max_multiplier"?}`` says what
a task may ask for: each delay it gives (initial and cap) within ``[min_delay_ms,
max_delay_ms]``, its multiplier at most ``max_multiplier``. A bound left out does not bind
(the API's own limits still do: delays up to 2^32 − 1 ms, multipliers 1 to 100). A policy
outside a bound, or whose cap ends up below its initial delay, is a 400 naming the field
(``retry.backoff_initial_ms`` …) and the bound; nothing is written. The bounds only limit
what tasks ask for: the queue's own default policy is the queue owner's choice.
"""

from __future__ import annotations

from typing import Any

from orbit.errors import InvalidRequest
from pulse.types import QueuePut, TaskSubmit


def bounds_config(body: QueuePut) -> dict[str, Any]:
    """The stored columns of a queue PUT's ``retry_bounds`` (400 when min > max)."""
    b = body.retry_bounds
    if b is None:
        return {"retry_bound_min_ms": None, "retry_bound_max_ms": None,
                "retry_bound_multiplier_max": None}  # fmt: skip
    if b.min_delay_ms is not None and b.max_delay_ms is not None and b.min_delay_ms > b.max_delay_ms:
        raise InvalidRequest(
            "retry_bounds.max_delay_ms must be at least min_delay_ms",
            field="retry_bounds.max_delay_ms",
        )
    return {
        "retry_bound_min_ms": b.min_delay_ms,
        "retry_bound_max_ms": b.max_delay_ms,
        "retry_bound_multiplier_max": None if b.max_multiplier is None else float(b.max_multiplier),
    }


def bounds_view(row: dict[str, Any]) -> dict[str, Any]:
    """The API ``retry_bounds`` of a queue row (every bound null when none is set)."""
    mult = row.get("retry_bound_multiplier_max")
    return {
        "min_delay_ms": row.get("retry_bound_min_ms"),
        "max_delay_ms": row.get("retry_bound_max_ms"),
        "max_multiplier": None if mult is None else float(mult),
    }


def _bad(field: str, message: str) -> InvalidRequest:
    return InvalidRequest(f"retry.{field} {message}", field=f"retry.{field}")


def check(body: TaskSubmit, queue: dict[str, Any]) -> InvalidRequest | None:
    """The error of ``body``'s own retry policy against ``queue``'s bounds (None: fine)."""
    r = body.retry
    if r is None:
        return None
    lo, hi = queue.get("retry_bound_min_ms"), queue.get("retry_bound_max_ms")
    for field, value in (("backoff_initial_ms", r.backoff_initial_ms),
                         ("backoff_max_ms", r.backoff_max_ms)):  # fmt: skip
        if value is None:
            continue
        if lo is not None and value < int(lo):
            return _bad(field, f"must be at least {int(lo)} (the queue's retry_bounds.min_delay_ms)")
        if hi is not None and value > int(hi):
            return _bad(field, f"must be at most {int(hi)} (the queue's retry_bounds.max_delay_ms)")
    top = queue.get("retry_bound_multiplier_max")
    if r.backoff_multiplier is not None and top is not None and r.backoff_multiplier > float(top):
        return _bad(
            "backoff_multiplier", f"must be at most {float(top)} (the queue's retry_bounds.max_multiplier)"
        )
    initial, cap, _ = effective(body, queue)
    if cap < initial:
        return _bad("backoff_max_ms", f"({cap}) must be at least backoff_initial_ms ({initial})")
    return None


def effective(body: TaskSubmit, queue: dict[str, Any]) -> tuple[int, int, float]:
    """(initial delay, cap, multiplier) the task is frozen with: its own where given, else
    the queue's default."""
    r = body.retry
    initial = int(queue["retry_backoff_initial_ms"])
    cap = int(queue["retry_backoff_max_ms"])
    mult = float(queue["retry_backoff_multiplier"])
    if r is not None:
        initial = initial if r.backoff_initial_ms is None else r.backoff_initial_ms
        cap = cap if r.backoff_max_ms is None else r.backoff_max_ms
        mult = mult if r.backoff_multiplier is None else float(r.backoff_multiplier)
    return initial, cap, mult


__all__ = ["bounds_config", "bounds_view", "check", "effective"]
