"""One attempt from offer to receipt: start, run the handler, watch the lease, report.

```
offer ──start──▶ started ──handler──▶ returned ───────────────▶ complete ─▶ receipt
   │               │          │
   │ start_denied  │          ├─ raised RetryableError/other ──▶ fail (retryable)
   ▼               │          ├─ raised PermanentError ───────▶ fail (not retryable)
  done             │          ├─ cancelled: server `cancel` ──▶ cancelled
                   │          ├─ cancelled: drain timeout ────▶ fail {"type": "Drained"}
                   │          └─ cancelled: lease lost ───────▶ no report (stale holder)
```

The lease is tracked on the local monotonic clock. Each extension (``started``, or a
``heartbeat_ok`` entry with ``ok``) carries the server's ``lease_expires_at``; the worker turns
it into a local deadline with its wall clock, bounded by two facts that need no clock
agreement: the lease lasts at least ``heartbeat_ms`` past the moment the extending request
was *sent* (else heartbeating could never keep it), and at most the session's ``lease_ms``
past that moment (an attempt does not outlive its session). When the deadline passes
without a new extension the handler is cancelled, so a holder that lost its lease stops.
"""

from __future__ import annotations

import asyncio
import enum
import logging
import time
import traceback
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from datetime import datetime
from typing import Any

import msgspec

from ._connection import Resend, StreamConnection
from .context import TaskContext
from .errors import OrbitConnectionError, OrbitError, PermanentError, StaleToken, TaskError
from .wire import (
    Cancelled,
    Complete,
    ErrorInfo,
    Fail,
    Offer,
    Receipt,
    Start,
    StartDenied,
    Started,
)

__all__ = ["CancelReason", "Execution", "HandlerSpec", "Outcome"]

logger = logging.getLogger("orbit_sdk.worker")
_ENCODER = msgspec.json.Encoder()
_TRACEBACK_CHARS = 4000

Handler = Callable[[TaskContext, Any], Awaitable[Any]]


@dataclass(frozen=True)
class HandlerSpec:
    """A registered handler for ``(queue, kind)``; the payload is decoded as ``payload_type``."""

    queue: str
    kind: str
    fn: Handler
    payload_type: Any = Any


class CancelReason(enum.IntEnum):
    """Why the worker stops a handler; a higher value overrides a lower one."""

    DRAIN = 1  # drain timeout: report a retryable failure {"type": "Drained"}
    CANCEL_REQUESTED = 2  # the server sent `cancel`: report `cancelled`
    LEASE_LOST = 3  # the lease could not be kept: stop silently (someone else may own it)


class Outcome(enum.StrEnum):
    """How an execution ended (counted in the worker's stats)."""

    SUCCEEDED = "succeeded"  # complete reported
    FAILED = "failed"  # fail reported (handler error)
    CANCELLED = "cancelled"  # cancelled reported
    DRAINED = "drained"  # fail {"type": "Drained"} reported
    LEASE_LOST = "lease_lost"  # handler stopped without a report
    START_DENIED = "start_denied"  # the server refused start
    NOT_STARTED = "not_started"  # start got no answer (connection or session lost)
    REPORT_REJECTED = "report_rejected"  # the server refused the report (e.g. stale token)
    REPORT_LOST = "report_lost"  # the report could not be delivered before shutdown


class Execution:
    """Drives one offered attempt. Create it, then run :meth:`run` as a task."""

    def __init__(
        self,
        offer: Offer,
        spec: HandlerSpec | None,
        connection: StreamConnection,
        *,
        session_id: str,
        lease_ms: int,
        heartbeat_ms: int,
        retry_unknown_errors: bool,
    ) -> None:
        self.offer = offer
        self.attempt_id = offer.attempt_id
        self.session_id = session_id
        self._spec = spec
        self._connection = connection
        self._lease_s = lease_ms / 1000.0
        self._heartbeat_s = min(heartbeat_ms, lease_ms) / 1000.0
        self._retry_unknown = retry_unknown_errors
        self._loop = asyncio.get_running_loop()
        self.lease_deadline = 0.0  # loop time; set by `started`
        self.cancel_reason: CancelReason | None = None
        self.holds_lease = False  # True from `started` until the receipt: heartbeat it
        self._handler_running = False
        self._wake = asyncio.Event()
        self._ctx: TaskContext | None = None

    def __repr__(self) -> str:
        return f"Execution(attempt_id={self.attempt_id!r}, task_id={self.offer.task.id!r})"

    # ------------------------------------------------------------ signals from outside

    def request_cancel(self, reason: CancelReason) -> None:
        """Ask the handler to stop for ``reason`` (the strongest reason wins)."""
        if self.cancel_reason is None or reason > self.cancel_reason:
            self.cancel_reason = reason
            if reason is CancelReason.CANCEL_REQUESTED and self._ctx is not None:
                self._ctx._cancel_requested = True
            self._wake.set()

    def lease_extended(self, sent_at: float, expires_at: datetime | None) -> None:
        """The server extended the lease (to ``expires_at``, server clock) in answer to a
        request sent at loop time ``sent_at``; see the module docstring for the bounds."""
        earliest = sent_at + self._heartbeat_s
        latest = sent_at + self._lease_s
        deadline = latest
        if expires_at is not None:
            deadline = self._loop.time() + (expires_at.timestamp() - time.time())
            deadline = min(max(deadline, earliest), latest)
        self.lease_deadline = max(self.lease_deadline, deadline)

    def lease_lost(self, why: str) -> None:
        """The lease is gone: stop the handler if it still runs."""
        if self._handler_running and self.cancel_reason is not CancelReason.LEASE_LOST:
            logger.warning(
                "attempt %s (task %s): %s; cancelling its handler",
                self.attempt_id,
                self.offer.task.id,
                why,
            )
        self.request_cancel(CancelReason.LEASE_LOST)

    # ------------------------------------------------------------ lifecycle

    async def run(self) -> Outcome:
        """Start, run and report the attempt; never raises except on cancellation."""
        sent_at = self._loop.time()
        start = Start(msg_id=self._connection.next_msg_id(), attempt_id=self.attempt_id)
        try:
            reply = await self._connection.request(start, resend=Resend.SAME_SESSION)
        except OrbitConnectionError as exc:
            logger.warning("attempt %s not started: %s", self.attempt_id, exc.message)
            return Outcome.NOT_STARTED
        except OrbitError as exc:
            logger.warning(
                "attempt %s not started: %s (%s)", self.attempt_id, exc.code, exc.message
            )
            return Outcome.START_DENIED
        if isinstance(reply, StartDenied):
            # "already_started" after a re-sent start means the first `started` answer was
            # lost with the connection: the server's lease on it will expire and recover it.
            level = logging.WARNING if reply.reason == "already_started" else logging.INFO
            logger.log(level, "attempt %s: start denied (%s)", self.attempt_id, reply.reason)
            return Outcome.START_DENIED
        if not isinstance(reply, Started):
            logger.error(
                "attempt %s: unexpected reply %s to start", self.attempt_id, type(reply).__name__
            )
            return Outcome.NOT_STARTED
        self.lease_extended(sent_at, reply.lease_expires_at)
        self.holds_lease = True
        try:
            report, outcome = await self._execute(reply)
            if report is None:
                return outcome
            return await self._report(report, outcome)
        finally:
            self.holds_lease = False

    async def _execute(
        self, started: Started
    ) -> tuple[Complete | Fail | Cancelled | None, Outcome]:
        ctx = TaskContext(self.offer, started, self._connection)
        self._ctx = ctx
        token = started.execution_token
        if self.cancel_reason is not None:  # cancel or drain arrived before `started`
            ctx._cancel_requested = self.cancel_reason is CancelReason.CANCEL_REQUESTED
            return self._report_for_cancel(token, None)
        handler = asyncio.create_task(self._invoke(ctx), name=f"orbit-handler-{self.attempt_id}")
        self._handler_running = True
        try:
            await self._supervise(handler)
        except asyncio.CancelledError:
            handler.cancel()
            raise
        finally:
            self._handler_running = False
        if not handler.cancelled() and handler.exception() is None:
            result: msgspec.Raw = handler.result()
            complete = Complete(
                msg_id=self._connection.next_msg_id(),
                attempt_id=self.attempt_id,
                execution_token=token,
                result=result,
            )
            return complete, Outcome.SUCCEEDED
        exc = None if handler.cancelled() else handler.exception()
        if self.cancel_reason is not None:
            return self._report_for_cancel(token, exc)
        return self._report_for_error(token, exc), Outcome.FAILED

    async def _supervise(self, handler: asyncio.Task[msgspec.Raw]) -> None:
        while not handler.done():
            if self.cancel_reason is not None:
                handler.cancel()
                await asyncio.wait({handler})
                return
            remaining = self.lease_deadline - self._loop.time()
            if remaining <= 0:
                self.lease_lost("lease not extended before it expired")
                continue
            self._wake.clear()
            waker = asyncio.create_task(self._wake.wait())
            try:
                await asyncio.wait(
                    {handler, waker}, timeout=remaining, return_when=asyncio.FIRST_COMPLETED
                )
            finally:
                waker.cancel()

    async def _invoke(self, ctx: TaskContext) -> msgspec.Raw:
        spec = self._spec
        if spec is None:
            raise _NoHandler(f"no handler registered for queue {ctx.queue!r} kind {ctx.kind!r}")
        try:
            payload = msgspec.json.decode(ctx.payload_raw, type=spec.payload_type)
        except msgspec.DecodeError as exc:
            raise PermanentError(
                f"payload does not decode: {exc}", type="PayloadDecodeError"
            ) from exc
        value = await spec.fn(ctx, payload)
        if isinstance(value, msgspec.Raw):
            return value
        try:
            return msgspec.Raw(_ENCODER.encode(value))
        except (TypeError, ValueError, msgspec.EncodeError) as exc:
            raise PermanentError(
                f"handler result is not JSON-encodable: {exc}", type="ResultEncodeError"
            ) from exc

    # ------------------------------------------------------------ reports

    def _report_for_cancel(
        self, token: str, exc: BaseException | None
    ) -> tuple[Cancelled | Fail | None, Outcome]:
        reason = self.cancel_reason
        msg_id = self._connection.next_msg_id()
        if reason is CancelReason.LEASE_LOST:
            return None, Outcome.LEASE_LOST
        if reason is CancelReason.CANCEL_REQUESTED:
            return Cancelled(
                msg_id=msg_id, attempt_id=self.attempt_id, execution_token=token
            ), Outcome.CANCELLED
        logger.warning(
            "attempt %s: handler stopped by drain timeout; giving the task back", self.attempt_id
        )
        error = ErrorInfo(
            type="Drained", message="the worker shut down before the handler finished"
        )
        fail = Fail(
            msg_id=msg_id,
            attempt_id=self.attempt_id,
            execution_token=token,
            error=error,
            retryable=True,
        )
        return fail, Outcome.DRAINED

    def _report_for_error(self, token: str, exc: BaseException | None) -> Fail:
        msg_id = self._connection.next_msg_id()
        fail = Fail(
            msg_id=msg_id,
            attempt_id=self.attempt_id,
            execution_token=token,
            error=ErrorInfo(type="Cancelled", message="the handler was cancelled"),
            retryable=True,
        )
        if isinstance(exc, TaskError):
            fail.error = ErrorInfo(type=exc.type, message=exc.message)
            if exc.details is not None:
                fail.error.details = exc.details
            fail.retryable = exc.retryable
            retry_after = getattr(exc, "retry_after_ms", None)
            if retry_after is not None:
                fail.retry_after_ms = int(retry_after)
            logger.info(
                "attempt %s failed (%s, retryable=%s): %s",
                self.attempt_id,
                exc.type,
                exc.retryable,
                exc.message,
            )
        elif exc is not None:
            text = "".join(traceback.format_exception(exc))[-_TRACEBACK_CHARS:]
            fail.error = ErrorInfo(
                type=type(exc).__name__, message=str(exc), details={"traceback": text}
            )
            fail.retryable = self._retry_unknown
            logger.warning(
                "attempt %s: handler raised %s", self.attempt_id, type(exc).__name__, exc_info=exc
            )
        return fail

    async def _report(self, report: Complete | Fail | Cancelled, outcome: Outcome) -> Outcome:
        try:
            reply = await self._connection.request(report, resend=Resend.ALWAYS)
        except StaleToken:
            logger.warning(
                "attempt %s: report rejected, execution token is stale (the task moved on)",
                self.attempt_id,
            )
            return Outcome.REPORT_REJECTED
        except OrbitConnectionError as exc:
            logger.error("attempt %s: report not delivered: %s", self.attempt_id, exc.message)
            return Outcome.REPORT_LOST
        except OrbitError as exc:
            logger.error(
                "attempt %s: report rejected: %s (%s)", self.attempt_id, exc.code, exc.message
            )
            return Outcome.REPORT_REJECTED
        if isinstance(reply, Receipt):
            logger.debug(
                "attempt %s: receipt %s (%s), task %s",
                self.attempt_id,
                reply.receipt_id,
                reply.outcome,
                reply.task_state,
            )
        return outcome


class _NoHandler(TaskError):
    """No handler for the offered kind: retryable, a worker that has one may pick it up."""

    retryable = True

    def __init__(self, message: str) -> None:
        super().__init__(message, type="HandlerNotFound")
