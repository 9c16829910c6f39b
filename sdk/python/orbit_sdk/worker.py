"""``Worker``: runs task handlers for offers pushed by the Orbit server.

    worker = Worker("http://127.0.0.1:8080", api_key, namespace="default", max_concurrency=8)

    @worker.task("emails", "send_welcome")
    async def send_welcome(ctx: TaskContext, payload: dict) -> dict:
        message_id = await ctx.effect("send", lambda: mailer.send(payload["user"]))
        return {"message_id": message_id}

    worker.run_sync()          # until SIGTERM/SIGINT, then drain

The worker opens one session for every queue it has handlers for, keeps it alive with
heartbeats, starts each offered attempt, runs its handler, extends its lease while it runs
and reports the outcome. See ``docs/sdk.md`` for drain, cancellation and burst modes.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import inspect
import logging
import os
import signal
import socket
import threading
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, TypeVar

import httpx
import msgspec
from msgspec import UNSET

from ._backoff import Backoff
from ._connection import Resend, StreamConnection
from ._execution import CancelReason, Execution, Handler, HandlerSpec, Outcome
from ._http import HttpTransport
from ._version import SDK_NAME
from .client import DEFAULT_URL
from .errors import OrbitConnectionError, OrbitError
from .wire import Cancel, Heartbeat, HeartbeatOk, InstanceInfo, Offer, SessionCreate

__all__ = ["Worker", "WorkerStats"]

logger = logging.getLogger("orbit_sdk.worker")
F = TypeVar("F", bound=Handler)


@dataclass
class WorkerStats:
    """What a worker did during :meth:`Worker.run` (``outcomes`` by :class:`Outcome`)."""

    offers: int = 0
    ignored_offers: int = 0
    outcomes: dict[str, int] = field(default_factory=dict)
    sessions: int = 0
    connects: int = 0
    resent_requests: int = 0

    @property
    def succeeded(self) -> int:
        """Attempts reported complete."""
        return self.outcomes.get(Outcome.SUCCEEDED.value, 0)

    @property
    def failed(self) -> int:
        """Attempts reported failed by their handler."""
        return self.outcomes.get(Outcome.FAILED.value, 0)


class Worker:
    """Registers handlers and runs them for offers of their ``(queue, kind)``.

    Parameters:
        base_url: the server, or several nodes of one deployment (a list, or one string
            with commas; default ``ORBIT_URL``). When the node in use cannot be reached or
            drops the stream, the worker goes to the next node at once with the same session
            (its running attempts go on); its backoff applies only after every node failed.
        max_concurrency: attempts held at once (the server never offers more).
        drain_timeout: seconds running handlers get to finish after a drain request
            (SIGTERM/SIGINT or :meth:`drain`) before they are cancelled and given back.
        report_timeout: seconds to wait for outstanding reports when stopping.
        retry_unknown_errors: report exceptions other than ``RetryableError`` /
            ``PermanentError`` as retryable (default) or not.
        concurrency_keys: accept tasks that carry a ``concurrency_key`` (default True): the
            server runs at most one attempt per key and hands the handler the key's fencing
            token in ``ctx.concurrency_token``, to pass to whatever the handler writes. With
            False the worker takes only unkeyed tasks; keyed ones wait for another worker
            (the worker logs a warning when the server reports keyed tasks waiting on its
            queues).
        instance_id: reuse a known worker instance id (default: the server assigns one, kept
            across reconnects).
        start_timeout: seconds to wait for the answer to a ``start`` before re-sending it
            (a lost ``started`` reply: the server answers a re-sent start of the same
            session with a new execution token).
        start_retries: how many times a ``start`` is re-sent after ``start_timeout``; then
            the offer is given up (the server releases or recovers it).
        report_retry_timeout: longest time (seconds) a report refused as transient
            (``not_ready``, ``rate_limited``, ...) is sent again; it is given up earlier
            when the attempt's lease can no longer be held (docs/sdk.md "Reports").
    """

    def __init__(
        self,
        base_url: str | Sequence[str] | None = None,
        api_key: str | None = None,
        *,
        namespace: str | None = None,
        max_concurrency: int = 10,
        drain_timeout: float = 30.0,
        report_timeout: float = 10.0,
        retry_unknown_errors: bool = True,
        concurrency_keys: bool = True,
        instance_id: str | None = None,
        backoff: Backoff | None = None,
        http: httpx.AsyncClient | None = None,
        start_timeout: float = 5.0,
        start_retries: int = 2,
        report_retry_timeout: float = 60.0,
    ) -> None:
        key = api_key if api_key is not None else os.environ.get("ORBIT_KEY")
        ns = namespace if namespace is not None else os.environ.get("ORBIT_NAMESPACE")
        if not key:
            raise ValueError("api_key is required (or set ORBIT_KEY)")
        if not ns:
            raise ValueError("namespace is required (or set ORBIT_NAMESPACE)")
        if max_concurrency < 1:
            raise ValueError("max_concurrency must be >= 1")
        if start_timeout <= 0 or start_retries < 0:
            raise ValueError("start_timeout must be > 0 and start_retries >= 0")
        if report_retry_timeout < 0:
            raise ValueError("report_retry_timeout must be >= 0")
        self.report_retry_timeout = report_retry_timeout
        self.start_timeout = start_timeout
        self.start_retries = start_retries
        self.base_url = base_url or os.environ.get("ORBIT_URL") or DEFAULT_URL
        self.namespace = ns
        self.max_concurrency = max_concurrency
        self.drain_timeout = drain_timeout
        self.report_timeout = report_timeout
        self.retry_unknown_errors = retry_unknown_errors
        self.concurrency_keys = concurrency_keys
        self._api_key = key
        self._instance_id = instance_id
        self._backoff = backoff or Backoff()
        self._http_client = http
        self._handlers: dict[tuple[str, str], HandlerSpec] = {}
        self._executions: dict[str, Execution] = {}
        self._tasks: dict[str, asyncio.Task[Outcome]] = {}
        self._connection: StreamConnection | None = None
        self._accepting = False
        self._accept_limit: int | None = None
        self._accepted = 0
        self._drain_requested: asyncio.Event | None = None
        self._force: asyncio.Event | None = None
        self._activity: asyncio.Event | None = None
        self._heartbeat_kick: asyncio.Event | None = None
        self._last_activity = 0.0
        self._connected_once = False
        self.stats = WorkerStats()

    def __repr__(self) -> str:
        return f"Worker({self.base_url!r}, namespace={self.namespace!r}, queues={self.queues})"

    # ---------------------------------------------------------------- registration

    def task(self, queue: str, kind: str, *, payload_type: Any = Any) -> Callable[[F], F]:
        """Decorator: run ``async def handler(ctx, payload)`` for tasks of ``(queue, kind)``.

        The payload is JSON-decoded (as ``payload_type`` when given: a Struct, dataclass,
        TypedDict...; a mismatch fails the attempt permanently). The return value (any
        msgspec-encodable value, or ``msgspec.Raw``) becomes the task's result.
        """

        def register(fn: F) -> F:
            self.register(queue, kind, fn, payload_type=payload_type)
            return fn

        return register

    def register(self, queue: str, kind: str, fn: Handler, *, payload_type: Any = Any) -> None:
        """Register ``fn`` as the handler of ``(queue, kind)`` (see :meth:`task`)."""
        if not inspect.iscoroutinefunction(fn):
            raise TypeError("a handler must be an `async def` function (ctx, payload)")
        if (queue, kind) in self._handlers:
            raise ValueError(f"a handler for queue {queue!r} kind {kind!r} is already registered")
        self._handlers[(queue, kind)] = HandlerSpec(queue, kind, fn, payload_type)

    @property
    def queues(self) -> list[str]:
        """The queues this worker asks work from (those with a handler)."""
        return sorted({queue for queue, _ in self._handlers})

    # ---------------------------------------------------------------- control

    def drain(self) -> None:
        """Stop taking offers, let running handlers finish within ``drain_timeout``, then
        cancel and give them back. A second call cancels running handlers at once.
        Call it from the worker's event loop (signal handlers installed by :meth:`run` do);
        from another thread use ``loop.call_soon_threadsafe(worker.drain)``. A no-op when
        the worker is not running."""
        if self._drain_requested is None or self._force is None:
            return
        if self._drain_requested.is_set():
            logger.warning("second drain request: cancelling running handlers now")
            self._force.set()
        else:
            logger.info("drain requested: finishing %d running attempts", len(self._executions))
            self._drain_requested.set()
        self._accepting = False

    def run_sync(self, **kwargs: Any) -> WorkerStats:
        """Run :meth:`run` in a new event loop (for scripts): ``worker.run_sync()``."""
        return asyncio.run(self.run(**kwargs))

    async def run(
        self,
        *,
        until_idle: bool = False,
        idle_timeout: float = 1.0,
        max_tasks: int | None = None,
        install_signal_handlers: bool = True,
    ) -> WorkerStats:
        """Run until drained (SIGTERM/SIGINT or :meth:`drain`), or in burst mode:

        - ``until_idle=True``: stop once connected, nothing is running and no offer came
          for ``idle_timeout`` seconds;
        - ``max_tasks=n``: accept at most ``n`` offers, stop when they are finished.

        Raises the OrbitError when the server refuses the session for good (bad key,
        missing action or namespace). Returns the run's :class:`WorkerStats`.
        """
        if not self._handlers:
            raise RuntimeError("no handlers registered: use @worker.task(queue, kind)")
        if self._connection is not None:
            raise RuntimeError("this worker is already running")
        loop = asyncio.get_running_loop()
        self.stats = WorkerStats()
        self._drain_requested, self._force = asyncio.Event(), asyncio.Event()
        self._activity, self._heartbeat_kick = asyncio.Event(), asyncio.Event()
        self._accepting, self._accepted, self._connected_once = True, 0, False
        self._accept_limit = max_tasks
        self._last_activity = loop.time()
        http = HttpTransport(self.base_url, self._api_key, http=self._http_client)
        connection = StreamConnection(
            http,
            self.namespace,
            self._session_request,
            on_offer=self._on_offer,
            on_cancel=self._on_cancel,
            on_connected=self._on_connected,
            on_session_lost=self._on_session_lost,
            backoff=self._backoff,
        )
        self._connection = connection
        conn_task = asyncio.create_task(connection.run(), name="orbit-worker-connection")
        heartbeat_task = asyncio.create_task(
            self._heartbeat_loop(connection), name="orbit-worker-heartbeat"
        )
        restore = self._install_signal_handlers(loop) if install_signal_handlers else []
        try:
            await self._wait_for_stop(conn_task, until_idle, idle_timeout)
            if not conn_task.done():  # a dead connection cannot deliver reports: skip drain
                await self._finish(connection)
                # Finished or given back: end the session now (its offers return to the
                # queue at once) rather than letting it expire.
                await connection.end_session()
        finally:
            for restore_one in restore:
                restore_one()
            for task in list(self._tasks.values()):
                task.cancel()
            await asyncio.gather(*self._tasks.values(), return_exceptions=True)
            heartbeat_task.cancel()
            await connection.close()
            await asyncio.gather(heartbeat_task, return_exceptions=True)
            # The connection may be mid-handshake; give it a moment to notice, then cancel.
            await asyncio.wait({conn_task}, timeout=2.0)
            if not conn_task.done():
                conn_task.cancel()
                await asyncio.gather(conn_task, return_exceptions=True)
            conn_error = None if conn_task.cancelled() else conn_task.exception()
            await http.aclose()
            self.stats.sessions = connection.stats.sessions
            self.stats.connects = connection.stats.connects
            self.stats.resent_requests = connection.stats.resent
            self._connection = None
            self._accepting = False
            self._drain_requested = self._force = None
        if conn_error is not None:
            raise conn_error
        logger.info("worker stopped: %s", self.stats)
        return self.stats

    # ---------------------------------------------------------------- run phases

    async def _wait_for_stop(
        self, conn_task: asyncio.Task[None], until_idle: bool, idle_timeout: float
    ) -> None:
        assert self._drain_requested is not None and self._activity is not None
        loop = asyncio.get_running_loop()
        drain_wait = asyncio.create_task(self._drain_requested.wait())
        try:
            while not self._drain_requested.is_set() and not conn_task.done():
                if self._accept_limit is not None and self._accepted >= self._accept_limit:
                    self._accepting = False
                    if not self._executions:
                        return
                timeout = None
                if until_idle and self._connected_once and not self._executions:
                    timeout = self._last_activity + idle_timeout - loop.time()
                    if timeout <= 0:
                        logger.info("worker idle for %.2fs: stopping", idle_timeout)
                        return
                self._activity.clear()
                activity = asyncio.create_task(self._activity.wait())
                try:
                    await asyncio.wait(
                        {drain_wait, conn_task, activity},
                        timeout=timeout,
                        return_when=asyncio.FIRST_COMPLETED,
                    )
                finally:
                    activity.cancel()
        finally:
            drain_wait.cancel()

    async def _finish(self, connection: StreamConnection) -> None:
        """Drain: no new offers; wait for handlers (bounded), cancel the rest, wait reports."""
        assert self._force is not None
        self._accepting = False
        loop = asyncio.get_running_loop()
        deadline = loop.time() + self.drain_timeout
        force_wait = asyncio.create_task(self._force.wait())
        try:
            while self._tasks and not self._force.is_set():
                remaining = deadline - loop.time()
                if remaining <= 0:
                    break
                await asyncio.wait(
                    {*self._tasks.values(), force_wait},
                    timeout=remaining,
                    return_when=asyncio.FIRST_COMPLETED,
                )
        finally:
            force_wait.cancel()
        for execution in list(self._executions.values()):
            execution.request_cancel(CancelReason.DRAIN)
        if self._tasks:
            await asyncio.wait(list(self._tasks.values()), timeout=self.report_timeout)
        if self._tasks:
            logger.error("stopping with %d attempts not yet reported", len(self._tasks))

    # ---------------------------------------------------------------- callbacks

    def _session_request(self, instance_id: str | None) -> SessionCreate:
        known = instance_id or self._instance_id
        instance = InstanceInfo(
            host=socket.gethostname(), pid=os.getpid(), sdk=SDK_NAME, id=known or UNSET
        )
        concurrency = self.max_concurrency
        if self._accept_limit is not None:
            concurrency = max(1, min(concurrency, self._accept_limit))
        return SessionCreate(
            instance=instance,
            queues=self.queues,
            max_concurrency=concurrency,
            concurrency_keys=self.concurrency_keys,
        )

    def _touch(self) -> None:
        self._last_activity = asyncio.get_running_loop().time()
        if self._activity is not None:
            self._activity.set()

    def _on_connected(self) -> None:
        self._connected_once = True
        self._touch()
        if self._heartbeat_kick is not None:
            self._heartbeat_kick.set()

    def _on_offer(self, offer: Offer) -> None:
        self.stats.offers += 1
        self._touch()
        connection = self._connection
        session = connection.session if connection else None
        if connection is None or session is None:
            return
        if not self._accepting or offer.attempt_id in self._executions:
            self.stats.ignored_offers += 1
            logger.debug("ignoring offer %s (not accepting or duplicate)", offer.attempt_id)
            return
        self._accepted += 1
        if self._accept_limit is not None and self._accepted >= self._accept_limit:
            self._accepting = False
        execution = Execution(
            offer,
            self._find_handler(offer),
            connection,
            session_id=session.session_id,
            lease_ms=session.lease_ms,
            heartbeat_ms=session.heartbeat_ms,
            retry_unknown_errors=self.retry_unknown_errors,
            start_timeout=self.start_timeout,
            start_retries=self.start_retries,
            report_retry_timeout=self.report_retry_timeout,
        )
        task = asyncio.create_task(execution.run(), name=f"orbit-attempt-{offer.attempt_id}")
        self._executions[offer.attempt_id] = execution
        self._tasks[offer.attempt_id] = task
        task.add_done_callback(functools.partial(self._on_execution_done, offer.attempt_id))

    def _find_handler(self, offer: Offer) -> HandlerSpec | None:
        task = offer.task
        spec = self._handlers.get((task.queue, task.kind))
        if spec is None and not task.queue:
            matches = [s for (_, kind), s in self._handlers.items() if kind == task.kind]
            spec = matches[0] if len(matches) == 1 else None
        if spec is None:
            logger.error(
                "no handler for queue %r kind %r (attempt %s)",
                task.queue,
                task.kind,
                offer.attempt_id,
            )
        return spec

    def _on_execution_done(self, attempt_id: str, task: asyncio.Task[Outcome]) -> None:
        self._executions.pop(attempt_id, None)
        self._tasks.pop(attempt_id, None)
        if not task.cancelled():
            exc = task.exception()
            if exc is not None:
                logger.error("attempt %s crashed in the SDK", attempt_id, exc_info=exc)
            else:
                outcome = task.result().value
                self.stats.outcomes[outcome] = self.stats.outcomes.get(outcome, 0) + 1
        self._touch()

    def _on_cancel(self, cancel: Cancel) -> None:
        execution = self._executions.get(cancel.attempt_id)
        if execution is None:
            logger.debug("cancel for unknown attempt %s", cancel.attempt_id)
            return
        logger.info(
            "attempt %s: cancel requested (%s)", cancel.attempt_id, cancel.reason or "no reason"
        )
        execution.request_cancel(CancelReason.CANCEL_REQUESTED)

    def _on_session_lost(self, session_id: str) -> None:
        for execution in list(self._executions.values()):
            if execution.session_id == session_id:
                execution.lease_lost(f"session {session_id} expired")

    # ---------------------------------------------------------------- heartbeats

    async def _heartbeat_loop(self, connection: StreamConnection) -> None:
        """Every ``heartbeat_ms`` (and right after each connect): one heartbeat with every
        attempt this worker holds; extends leases, notices lost leases and cancels."""
        assert self._heartbeat_kick is not None
        loop = asyncio.get_running_loop()
        while True:
            await connection.wait_connected()
            session = connection.session
            if session is None:
                await asyncio.sleep(0.01)
                continue
            interval = max(session.heartbeat_ms, 1) / 1000.0
            held = [e for e in self._executions.values() if e.holds_lease]
            progress: dict[str, msgspec.Raw] = {}
            versions: dict[str, int] = {}
            for e in held:
                pending = e.pending_progress()
                if pending is not None:
                    versions[e.attempt_id] = pending[0]
                    progress[e.attempt_id] = msgspec.Raw(pending[1])
            frame = Heartbeat(
                msg_id=connection.next_msg_id(), attempt_ids=[e.attempt_id for e in held],
                progress=progress or msgspec.UNSET,
            )  # fmt: skip
            sent_at = loop.time()
            self._heartbeat_kick.clear()
            try:
                async with asyncio.timeout(interval):
                    reply = await connection.request(frame, resend=Resend.NEVER)
            except (OrbitConnectionError, TimeoutError):
                logger.debug("heartbeat got no answer")
            except OrbitError as exc:
                logger.warning("heartbeat rejected: %s (%s)", exc.code, exc.message)
            else:
                if isinstance(reply, HeartbeatOk):
                    self._apply_heartbeat(reply, sent_at, versions)
                    if isinstance(reply.keyed_waiting, list):  # absent in most answers
                        connection.keyed_waiting.note(reply.keyed_waiting)
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(max(0.0, sent_at + interval - loop.time())):
                    await self._heartbeat_kick.wait()

    def _apply_heartbeat(
        self, reply: HeartbeatOk, sent_at: float, progress: dict[str, int] | None = None
    ) -> None:
        for lease in reply.attempts:
            execution = self._executions.get(lease.attempt_id)
            if execution is None:
                continue
            if lease.ok:
                execution.lease_extended(sent_at, lease.lease_expires_at)
                if progress and lease.attempt_id in progress:
                    execution.progress_sent(progress[lease.attempt_id])
            else:
                execution.lease_lost("the server reports the lease is gone")
            if lease.cancel_requested:
                execution.request_cancel(CancelReason.CANCEL_REQUESTED)

    # ---------------------------------------------------------------- signals

    def _install_signal_handlers(self, loop: asyncio.AbstractEventLoop) -> list[Callable[[], None]]:
        if threading.current_thread() is not threading.main_thread():
            return []
        restore: list[Callable[[], None]] = []
        for sig in (signal.SIGTERM, signal.SIGINT):
            previous = signal.getsignal(sig)
            try:
                loop.add_signal_handler(sig, self.drain)
            except (NotImplementedError, RuntimeError, ValueError):
                continue

            def undo(sig: signal.Signals = sig, previous: Any = previous) -> None:
                loop.remove_signal_handler(sig)
                if previous is not None:
                    signal.signal(sig, previous)

            restore.append(undo)
        return restore
