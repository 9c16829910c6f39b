"""The rules of attempts that need no database: start denial reasons, the retry backoff, the
canonical form of a result report and its digest, and what applying a report to its current
attempt writes (pure planning; :mod:`pulse.report_round` runs it). :mod:`pulse.attempts` has
the transactions and re-exports these names.
"""

from __future__ import annotations

import hashlib
from collections.abc import Mapping
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any

import msgspec

from orbit import backoff, business_json
from orbit.ids import id_hex
from orbit.times import format_time
from pulse import transitions, wire
from pulse.store import attempts as store

Row = dict[str, Any]

# Start denial reasons (``start_denied.reason``; docs/api/workers.md).
DENY_NOT_FOUND = "not_found"  # no such attempt in this namespace, or another session's
DENY_ALREADY_STARTED = "already_started"  # RUNNING, but its lease passed or the task moved on
DENY_NOT_OFFERED = "not_offered"  # released, finished or lost
DENY_OFFER_EXPIRED = "offer_expired"  # the offer's lease passed before start
DENY_NOT_CURRENT = "not_current"  # the task moved on (cancelled, re-offered)
DENY_PAUSED = "paused"  # the namespace or queue gate is closed
DENY_DEADLINE = "deadline_exceeded"  # the task's deadline passed: it is now FAILED
DENY_SESSION = "session_inactive"  # the session expired or was closed

#: Error object of a task that was not started before its deadline.
DEADLINE_ERROR = {
    "type": "deadline_exceeded",
    "message": "the deadline passed before the task started",
}



# -- pure helpers ----------------------------------------------------------------------------


def backoff_ms(task: Mapping[str, Any], attempts: int, retry_after_ms: int | None = None) -> int:
    """Delay before the next attempt after ``attempts`` attempts, by the task's frozen policy:
    ``min(max, initial × multiplier^(attempts-1))``, or ``retry_after_ms`` when larger."""
    value = backoff.backoff_ms(
        attempts,
        int(task["retry_backoff_initial_ms"]),
        int(task["retry_backoff_max_ms"]),
        float(task["retry_backoff_multiplier"]),
    )
    if retry_after_ms is not None and retry_after_ms > value:
        value = int(retry_after_ms)
    return value


def ms(value: int) -> timedelta:
    return timedelta(milliseconds=value)


def _json_text(raw: msgspec.Raw | None) -> str | None:
    return None if raw is None else bytes(raw).decode()


def _error_json(value: Any) -> str | None:
    return None if value is None else business_json.encode(value).decode()


@dataclass(frozen=True)
class Report:
    """A result report: ``op`` is ``complete``, ``fail`` or ``cancelled``."""

    op: str
    attempt_id: bytes
    execution_token: str
    result: msgspec.Raw | None = None
    error: wire.FailError | None = None
    retryable: bool = False
    retry_after_ms: int | None = None

    @classmethod
    def from_frame(
        cls, frame: wire.Complete | wire.Fail | wire.Cancelled, attempt_id: bytes
    ) -> Report:
        if isinstance(frame, wire.Complete):
            return cls("complete", attempt_id, frame.execution_token, result=frame.result)
        if isinstance(frame, wire.Fail):
            return cls(
                "fail",
                attempt_id,
                frame.execution_token,
                error=frame.error,
                retryable=frame.retryable,
                retry_after_ms=frame.retry_after_ms,
            )
        return cls("cancelled", attempt_id, frame.execution_token)

    def check(self) -> None:
        """Its business JSON (result, error details) judged by the one rule of
        :mod:`orbit.business_json`: 400 naming the field, before anything is written."""
        if self.result is not None:
            business_json.check_json_text(bytes(self.result), "result")
        if self.error is not None and not wire.is_null(self.error.details):
            business_json.check_json_text(bytes(self.error.details), "error.details")

    def canonical(self) -> dict[str, Any]:
        """The report without transport details (msg_id, type, token), values decoded so
        that formatting differences (whitespace, key order) do not change the digest;
        numbers by their exact value (``1e400`` is a number like any other)."""
        out: dict[str, Any] = {"op": self.op, "attempt_id": id_hex(self.attempt_id)}
        if self.op == "complete":
            out["result"] = business_json.canonical_value(bytes(self.result or wire.NULL))
        elif self.op == "fail":
            assert self.error is not None
            out["error"] = {
                "type": self.error.type,
                "message": self.error.message,
                "details": None
                if wire.is_null(self.error.details)
                else business_json.canonical_value(bytes(self.error.details)),
            }
            out["retryable"] = self.retryable
            out["retry_after_ms"] = self.retry_after_ms
        return out

    def digest(self) -> bytes:
        """SHA-256 of the canonical report (keys sorted, compact)."""
        return hashlib.sha256(business_json.canonical(self.canonical())).digest()

    def error_object(self) -> dict[str, Any] | None:
        """The error stored on the attempt and task for a ``fail`` (its details' numbers
        as the worker wrote them)."""
        if self.error is None:
            return None
        out: dict[str, Any] = {"type": self.error.type, "message": self.error.message}
        if not wire.is_null(self.error.details):
            out["details"] = business_json.decode(bytes(self.error.details))
        out["retryable"] = self.retryable
        return out


def is_current(task: Mapping[str, Any], attempt: Mapping[str, Any]) -> bool:
    """The attempt is the task's running generation."""
    return (
        attempt["state"] == "RUNNING"
        and task["state"] == "RUNNING"
        and task["current_attempt_id"] == attempt["id"]
        and int(task["attempts"]) == int(attempt["generation"])
    )


@dataclass
class ReportPlan:
    """What applying a report to its current attempt writes (see :func:`plan_report`)."""

    state: str  # the task's new state
    event: str  # its raw event type
    data: dict[str, Any]  # the raw event's data
    statements: list[tuple[str, Any]]  # attempt finish + task end-run, guarded, by key
    after: Row  # the task row as the end-run UPDATE leaves it (computed, not re-read)
    finish: dict[str, Any]  # the attempt's new values and guard (attempt_finish_if_running)
    end_run: dict[str, Any]  # the task's new values and guard (task_end_run_if_running)


def plan_report(
    namespace_id: bytes, task: Row, attempt: Row, rep: Report, now: datetime
) -> ReportPlan:
    """The outcome of a report on the current attempt (pure): the task's new state and the
    two guarded UPDATEs — attempt RUNNING → its end state, task RUNNING → the new state."""
    result_text: str | None = None
    error: dict[str, Any] | None = None
    available_at: datetime | None = None
    if rep.op == "complete":
        attempt_state = state = "SUCCEEDED"
        result_text = _json_text(rep.result or wire.NULL)
        event = transitions.EVENT_SUCCEEDED
    elif rep.op == "fail":
        attempt_state = "FAILED"
        error = rep.error_object()
        attempts = int(task["attempts"])
        if task["cancel_requested"]:
            state = "CANCELLED" if rep.retryable else "FAILED"
        elif rep.retryable and attempts < int(task["max_attempts"]):
            state = "WAITING"
            available_at = now + ms(backoff_ms(task, attempts, rep.retry_after_ms))
        else:
            state = "FAILED"
        event = {
            "WAITING": transitions.EVENT_RETRY_SCHEDULED,
            "FAILED": transitions.EVENT_FAILED,
            "CANCELLED": transitions.EVENT_CANCELLED,
        }[state]
    else:
        attempt_state = state = "CANCELLED"
        error = {"type": "cancelled", "message": "cancelled on request; the worker stopped"}
        event = transitions.EVENT_CANCELLED
    error_text = _error_json(error)
    finish = {
        "namespace_id": namespace_id,
        "id": attempt["id"],
        "state": attempt_state,
        "now": now,
        "result": result_text,
        "error": error_text,
        "retryable": int(rep.retryable) if rep.op == "fail" else None,
        "revision": attempt["revision"],
    }
    end_run = {
        "namespace_id": namespace_id,
        "id": task["id"],
        "attempt_id": attempt["id"],
        "state": state,
        "result": result_text,
        "error": error_text,
        "finished_at": now if state in transitions.TERMINAL_STATES else None,
        "available_at": available_at,
        "effect_uncertain": 0,
        "now": now,
        "revision": task["revision"],
    }
    data: dict[str, Any] = {"attempt_id": id_hex(attempt["id"]), "report": rep.op}
    if available_at is not None:
        data["available_at"] = format_time(available_at)
    after = {
        **task,
        "state": state,
        "result": result_text,
        "error": error_text,
        "finished_at": end_run["finished_at"],
        "available_at": available_at if available_at is not None else task["available_at"],
        "effect_uncertain": 0,
        "current_attempt_id": None,
        "session_id": None,
        "lease_expires_at": None,
        "cancel_requested": 0,
        "state_version": int(task["state_version"]) + 1,
        "state_changed_at": now,
        "revision": int(task["revision"]) + 1,
    }
    return ReportPlan(
        state=state,
        event=event,
        data=data,
        after=after,
        finish=finish,
        end_run=end_run,
        statements=[
            (store.Q.attempt_finish_if_running, finish),
            (store.Q.task_end_run_if_running, end_run),
        ],
    )


def offer_rows(
    namespace_id: bytes,
    row: Mapping[str, Any],
    attempt_id: bytes,
    session_id: bytes,
    lease_expires_at: datetime,
    now: datetime,
) -> tuple[dict[str, Any], dict[str, Any]]:
    """An offer of the WAITING task ``row`` to a session: the OFFERED attempt to insert
    (generation ``attempts + 1``, for ``attempt_insert_many``) and the task row as the
    guarded lease UPDATE leaves it (computed, not re-read: its events need no more)."""
    attempt = {
        "namespace_id": namespace_id, "id": attempt_id, "task_id": row["id"],
        "generation": int(row["attempts"]) + 1, "session_id": session_id,
        "lease_expires_at": lease_expires_at, "now": now,
    }  # fmt: skip
    leased = {
        **row, "state": "LEASED", "current_attempt_id": attempt_id,
        "session_id": session_id, "lease_expires_at": lease_expires_at,
        "state_version": int(row["state_version"]) + 1, "state_changed_at": now,
        "revision": int(row["revision"]) + 1,
    }  # fmt: skip
    return attempt, leased

