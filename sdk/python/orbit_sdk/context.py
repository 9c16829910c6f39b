"""``TaskContext``: what a handler knows about its attempt, and the side-effect barrier.

``await ctx.effect(key, fn)`` makes an outside effect happen at most once per task, even
across retries on other workers:

1. ``begin`` is recorded for ``key`` (stable across retries of the same task);
2. the server answers ``committed`` → the stored result is returned, ``fn`` is not called;
   ``uncertain`` (an earlier attempt began but never committed) → :class:`EffectUncertain`;
   ``new`` → ``fn`` runs, and its result is committed and returned.

Both paths return the JSON-decoded result (optionally as ``result_type``), so a handler
sees the same value whether the effect ran now or in an earlier attempt.
"""

from __future__ import annotations

import inspect
import logging
from collections.abc import Awaitable, Callable
from datetime import datetime
from typing import Any, TypeVar, overload

import msgspec

from . import _json
from ._connection import Resend, StreamConnection
from .errors import EffectUncertain
from .wire import Effect, EffectState, Offer, Started

__all__ = ["TaskContext"]

T = TypeVar("T")
logger = logging.getLogger("orbit_sdk.worker")
_ENCODER = _json.ENCODER

#: The largest progress document the server keeps, in bytes of JSON text.
MAX_PROGRESS_BYTES = 4096


class TaskContext:
    """The running attempt, passed to every handler as its first argument."""

    def __init__(self, offer: Offer, started: Started, connection: StreamConnection) -> None:
        task = offer.task
        self.task_id: str = task.id
        """The task's id (stable across attempts)."""
        self.attempt_id: str = offer.attempt_id
        """This attempt's id."""
        self.queue: str = task.queue
        self.kind: str = task.kind
        self.priority: int = task.priority
        self.deadline_at: datetime | None = task.deadline_at
        self.concurrency_key: str | None = task.concurrency_key
        self.generation: int = started.generation or task.generation
        """The attempt's execution generation (1 for the first attempt, then +1)."""
        self.concurrency_token: int | None = started.concurrency_token
        """Fencing token of the task's concurrency key (None without a key)."""
        self.lease_expires_at: datetime | None = started.lease_expires_at
        """Lease expiry as the server last reported it (server clock)."""
        self.payload_raw: msgspec.Raw = task.payload
        """The payload's exact JSON bytes as submitted."""
        self.logger = logging.LoggerAdapter(
            logger, {"task_id": task.id, "attempt_id": offer.attempt_id}
        )
        """A logger that tags records with ``task_id`` and ``attempt_id``."""
        self._execution_token = started.execution_token
        self._connection = connection
        self._cancel_requested = False
        self._progress: bytes | None = None  # the latest document, encoded
        self._progress_version = 0  # bumped by every set_progress

    def __repr__(self) -> str:
        return (
            f"TaskContext(task_id={self.task_id!r}, attempt_id={self.attempt_id!r}, "
            f"kind={self.kind!r}, generation={self.generation})"
        )

    def set_progress(self, progress: Any) -> None:
        """Report how far the handler got: ``progress`` is a JSON object (a dict, or any
        msgspec-encodable value that encodes to one, e.g. a Struct) of at most
        :data:`MAX_PROGRESS_BYTES` bytes, such as ``{"done": 40, "total": 100}``.

        It goes to the server with the attempt's next heartbeat (every ``heartbeat_ms`` of
        the session) and shows on the task (``progress``, ``progress_at``) and its attempt,
        over the API, in ``orbit tasks get`` and in the console. Only the latest document
        counts: calling this often costs nothing more than calling it once per heartbeat.
        Raises :class:`TypeError` for a value that does not encode to a JSON object and
        :class:`ValueError` for one that is too large (nothing is sent then)."""
        try:
            encoded = _ENCODER.encode(progress)
        except (TypeError, msgspec.EncodeError) as exc:
            raise TypeError(f"progress must encode to a JSON object: {exc}") from None
        if not encoded.startswith(b"{"):
            raise TypeError(f"progress must be a JSON object, not {type(progress).__name__}")
        if len(encoded) > MAX_PROGRESS_BYTES:
            raise ValueError(
                f"progress is {len(encoded)} bytes of JSON, at most {MAX_PROGRESS_BYTES}"
            )
        self._progress = encoded
        self._progress_version += 1

    @property
    def progress(self) -> Any:
        """The latest document given to :meth:`set_progress` (decoded), or None."""
        return None if self._progress is None else msgspec.json.decode(self._progress)

    @property
    def cancel_requested(self) -> bool:
        """True once the server asked to cancel this task (the handler is being cancelled)."""
        return self._cancel_requested

    @overload
    async def effect(
        self, key: str, fn: Callable[[], Awaitable[Any]] | Callable[[], Any]
    ) -> Any: ...
    @overload
    async def effect(
        self,
        key: str,
        fn: Callable[[], Awaitable[Any]] | Callable[[], Any],
        *,
        result_type: type[T],
    ) -> T: ...
    async def effect(
        self,
        key: str,
        fn: Callable[[], Awaitable[Any]] | Callable[[], Any],
        *,
        result_type: Any = Any,
    ) -> Any:
        """Run ``fn`` at most once for this task and ``key``; return its (stored) result.

        ``fn`` may be sync or async and must return a msgspec-encodable value. If ``fn``
        raises, nothing is committed and the effect stays begun: a later attempt gets
        :class:`~orbit_sdk.errors.EffectUncertain` for this key, because ``fn`` may have
        acted before failing.
        """
        if not key:
            raise ValueError("effect key must be a non-empty string")
        begin = Effect(
            msg_id=self._connection.next_msg_id(),
            attempt_id=self.attempt_id,
            execution_token=self._execution_token,
            key=key,
            phase="begin",
        )
        reply = await self._connection.request(begin, resend=Resend.ALWAYS)
        state = _effect_state(reply, key)
        if state.state == "committed":
            self.logger.debug("effect %r already committed; not running it again", key)
            return _json.decode(state.result, result_type)
        if state.state != "new":
            raise EffectUncertain(key)
        value = fn()
        if inspect.isawaitable(value):
            value = await value
        raw = msgspec.Raw(_ENCODER.encode(value))
        commit = Effect(
            msg_id=self._connection.next_msg_id(),
            attempt_id=self.attempt_id,
            execution_token=self._execution_token,
            key=key,
            phase="commit",
            result=raw,
        )
        _effect_state(await self._connection.request(commit, resend=Resend.ALWAYS), key)
        return _json.decode(raw, result_type)


def _effect_state(reply: object, key: str) -> EffectState:
    if not isinstance(reply, EffectState):
        raise TypeError(f"unexpected reply {type(reply).__name__} to effect {key!r}")
    return reply
