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
past that moment (an attempt does not outlive its session). When no extension came and the
deadline is half a heartbeat interval away (``lease_margin``: the connection is down, or
heartbeats go unanswered), the handler is cancelled and nothing is reported with its token:
a holder that cannot keep its lease stops *before* recovery can take the lease and give the
task to another worker.

A ``start`` that gets no answer within ``start_timeout`` is sent again (at most
``start_retries`` times): the server answers a re-sent start of an attempt it already
started for this session with a new execution token, so a lost ``started`` costs nothing.

A report (``complete``/``fail``/``cancelled``) the server refuses as *transient*
(``not_ready`` — the database restarting, its pool or connection limit exhausted —,
``rate_limited``, ``quota_exceeded``, ``internal``; :data:`TRANSIENT_REPORT_CODES`) is not
final: it is sent again, with the same content and a new ``msg_id``, after the error's
``Retry-After`` or a jittered backoff, whichever is longer. The attempt keeps heartbeating
meanwhile (it still holds the lease). Receipts make this safe: the server answers a re-sent
identical report with the original receipt. It gives up (``REPORT_LOST``) once the lease can
no longer be held — ``lease_margin`` before the lease deadline as last extended, when the
server reports the lease gone, or after ``report_retry_timeout`` seconds of refusals —
see :func:`report_retry_wait`. ``stale_token`` and 4xx refusals are final
(``REPORT_REJECTED``). A connection lost while a report is in flight is a separate,
connection-level mechanism (``Resend.ALWAYS``): the same request is re-sent once per
reconnect, and the retry loop only sends the next copy after the previous one was answered,
so at most one copy of a report is outstanding at any time.
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

from . import _json
from ._backoff import Backoff
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
    ServerFrame,
    Start,
    StartDenied,
    Started,
)

__all__ = [
    "TRANSIENT_REPORT_CODES",
    "CancelReason",
    "Execution",
    "HandlerSpec",
    "Outcome",
    "report_refusal_is_transient",
    "report_retry_wait",
]

logger = logging.getLogger("orbit_sdk.worker")
_ENCODER = _json.ENCODER
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
    REPORT_LOST = "report_lost"  # not delivered (or not confirmed) while the lease could be held


#: Error codes of a refused report that mean "not now", not "no": the same report is sent
#: again (``not_ready`` 503: database restarting, pool or connection limit exhausted;
#: ``rate_limited`` / ``quota_exceeded`` 429; ``internal`` 500, an unexpected server
#: failure). Everything else (``stale_token``, ``conflict``, ``not_found``,
#: ``invalid_request``, ...) is a final answer.
TRANSIENT_REPORT_CODES = frozenset({"not_ready", "rate_limited", "quota_exceeded", "internal"})


def report_refusal_is_transient(exc: OrbitError) -> bool:
    """True when a report refused with ``exc`` may succeed if sent again later."""
    if isinstance(exc, (StaleToken, OrbitConnectionError)):
        return False
    return exc.code in TRANSIENT_REPORT_CODES


def report_retry_wait(
    exc: OrbitError, *, now: float, give_up_at: float, backoff_delay: float
) -> float | None:
    """Seconds to wait before sending again a report the server refused with ``exc``, or
    None to stop: the refusal is final (not :func:`report_refusal_is_transient`), or ``now``
    is at or past ``give_up_at`` (the lease can no longer be held). The wait is the larger
    of ``backoff_delay`` and the error's ``retry_after``, cut to ``give_up_at`` (one last
    try while the lease still holds)."""
    if not report_refusal_is_transient(exc):
        return None
    remaining = give_up_at - now
    if remaining <= 0:
        return None
    wait = max(0.0, backoff_delay)
    retry_after = getattr(exc, "retry_after", None)
    if isinstance(retry_after, (int, float)) and retry_after > wait:
        wait = float(retry_after)
    return min(wait, remaining)


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
        start_timeout: float = 5.0,
        start_retries: int = 2,
        report_retry_timeout: float = 60.0,
        report_backoff: Backoff | None = None,
    ) -> None:
        self.offer = offer
        self.attempt_id = offer.attempt_id
        self.session_id = session_id
        self._spec = spec
        self._connection = connection
        self._lease_s = lease_ms / 1000.0
        self._heartbeat_s = min(heartbeat_ms, lease_ms) / 1000.0
        #: The handler is stopped this long BEFORE the lease deadline when no heartbeat
        #: extended it: half a heartbeat interval, so a worker that cannot heartbeat stops
        #: before recovery can take its lease away and give the task to someone else.
        self.lease_margin = self._heartbeat_s / 2
        self._start_timeout = start_timeout
        self._start_retries = start_retries
        self._retry_unknown = retry_unknown_errors
        self._report_retry_timeout = report_retry_timeout
        self._report_backoff = report_backoff or Backoff(initial=0.2, maximum=5.0)
        self._loop = asyncio.get_running_loop()
        self.lease_deadline = 0.0  # loop time; set by `started`
        self.cancel_reason: CancelReason | None = None
        self.holds_lease = False  # True from `started` until the receipt: heartbeat it
        self._handler_running = False
        self._wake = asyncio.Event()
        self._ctx: TaskContext | None = None
        self._progress_sent = 0  # version of the handler's progress the server has

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

    def pending_progress(self) -> tuple[int, bytes] | None:
        """(version, document) of progress the handler set since the server last got it."""
        ctx = self._ctx
        if ctx is None or ctx._progress is None or ctx._progress_version <= self._progress_sent:
            return None
        return ctx._progress_version, ctx._progress

    def progress_sent(self, version: int) -> None:
        """A heartbeat carrying ``version`` of the progress extended the lease: it is kept."""
        self._progress_sent = max(self._progress_sent, version)

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
        try:
            sent_at, reply = await self._start()
        except OrbitConnectionError as exc:
            logger.warning("attempt %s not started: %s", self.attempt_id, exc.message)
            return Outcome.NOT_STARTED
        except OrbitError as exc:
            logger.warning(
                "attempt %s not started: %s (%s)", self.attempt_id, exc.code, exc.message
            )
            return Outcome.START_DENIED
        if reply is None:
            logger.warning(
                "attempt %s not started: no answer to %d start requests",
                self.attempt_id,
                self._start_retries + 1,
            )
            return Outcome.NOT_STARTED
        if isinstance(reply, StartDenied):
            logger.info("attempt %s: start denied (%s)", self.attempt_id, reply.reason)
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

    async def _start(self) -> tuple[float, ServerFrame | None]:
        """Send ``start``; without an answer within ``start_timeout`` send it again (a new
        ``msg_id``, the same attempt), at most ``start_retries`` more times. A re-sent start
        of an attempt the server already started for this session answers ``started`` with
        a NEW execution token (the lost one is stale), so a lost ``started`` reply costs
        nothing. Returns (loop time the answered request was sent, its reply), or
        (now, None) when no request was answered."""
        for n in range(self._start_retries + 1):
            sent_at = self._loop.time()
            start = Start(msg_id=self._connection.next_msg_id(), attempt_id=self.attempt_id)
            try:
                async with asyncio.timeout(self._start_timeout):
                    reply = await self._connection.request(start, resend=Resend.SAME_SESSION)
            except TimeoutError:
                if self.cancel_reason is CancelReason.LEASE_LOST:
                    break  # the session is gone: the offer went with it
                logger.warning(
                    "attempt %s: no answer to start within %.1fs (%d of %d)",
                    self.attempt_id,
                    self._start_timeout,
                    n + 1,
                    self._start_retries + 1,
                )
                continue
            return sent_at, reply
        return self._loop.time(), None

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
            remaining = self.lease_deadline - self.lease_margin - self._loop.time()
            if remaining <= 0:
                self.lease_lost("lease not extended by a heartbeat; stopping before it can expire")
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
            payload = _json.decode(ctx.payload_raw, spec.payload_type)
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
        """Send the report until it gets a receipt or a final answer; a transient refusal
        is re-sent (same content, new ``msg_id``) while the lease can be held."""
        first_refusal: float | None = None
        tries = 0
        while True:
            tries += 1
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
                now = self._loop.time()
                if first_refusal is None:
                    first_refusal = now
                if not report_refusal_is_transient(exc):
                    logger.error(
                        "attempt %s: report rejected: %s (%s)",
                        self.attempt_id,
                        exc.code,
                        exc.message,
                    )
                    return Outcome.REPORT_REJECTED
                wait = report_retry_wait(
                    exc,
                    now=now,
                    give_up_at=self._report_give_up_at(first_refusal),
                    backoff_delay=self._report_backoff.next_delay(),
                )
                if wait is None or self.cancel_reason is CancelReason.LEASE_LOST:
                    self._log_report_given_up(exc, tries)
                    return Outcome.REPORT_LOST
                logger.warning(
                    "attempt %s: report refused: %s (%s); sending it again in %.2fs (try %d)",
                    self.attempt_id,
                    exc.code,
                    exc.message,
                    wait,
                    tries,
                )
                if not await self._pause(wait):
                    self._log_report_given_up(exc, tries)
                    return Outcome.REPORT_LOST
                report = msgspec.structs.replace(report, msg_id=self._connection.next_msg_id())
                continue
            if isinstance(reply, Receipt):
                logger.debug(
                    "attempt %s: receipt %s (%s), task %s",
                    self.attempt_id,
                    reply.receipt_id,
                    reply.outcome,
                    reply.task_state,
                )
            return outcome

    def _report_give_up_at(self, first_refusal: float) -> float:
        """Loop time after which a refused report is not sent again: the moment the
        handler would have been stopped for want of a heartbeat (``lease_margin`` before
        the lease deadline as last extended), or ``report_retry_timeout`` after the first
        refusal (a server that keeps answering heartbeats but refusing the report)."""
        return min(
            self.lease_deadline - self.lease_margin, first_refusal + self._report_retry_timeout
        )

    def _log_report_given_up(self, exc: OrbitError, tries: int) -> None:
        logger.error(
            "attempt %s: report refused %d times (last: %s, %s); giving up, the lease can no"
            " longer be held (the server recovers the attempt)",
            self.attempt_id,
            tries,
            exc.code,
            exc.message,
        )

    async def _pause(self, seconds: float) -> bool:
        """Sleep ``seconds``; False (at once) when the lease is lost meanwhile."""
        end = self._loop.time() + seconds
        while not self._lease_lost():
            remaining = end - self._loop.time()
            if remaining <= 0:
                return True
            self._wake.clear()
            try:
                async with asyncio.timeout(remaining):
                    await self._wake.wait()
            except TimeoutError:
                return not self._lease_lost()
        return False

    def _lease_lost(self) -> bool:
        # A method, not an inline comparison: the reason changes while _pause awaits.
        return self.cancel_reason is CancelReason.LEASE_LOST


class _NoHandler(TaskError):
    """No handler for the offered kind: retryable, a worker that has one may pick it up."""

    retryable = True

    def __init__(self, message: str) -> None:
        super().__init__(message, type="HandlerNotFound")
