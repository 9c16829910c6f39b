"""``SyncOrbitClient``: a blocking facade over :class:`~orbit_sdk.client.OrbitClient`.

For scripts and REPLs. It owns a private event loop (``asyncio.Runner``), so it must not be
used from inside a running event loop (use ``OrbitClient`` there). Every method has the
same parameters and return value as its async twin.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
from collections.abc import AsyncGenerator, Callable, Coroutine, Iterator
from types import TracebackType
from typing import Any, Concatenate, ParamSpec, TypeVar

import httpx

from ._admin import AdminAPI
from ._operators import AuditAPI, RetentionAPI, WorkersAPI
from ._queues import QueuesAPI
from ._schedules import SchedulesAPI
from ._subscriptions import EventsAPI, SubscriptionsAPI
from ._tasks import TasksAPI
from ._workflows import InstancesAPI, WorkflowsAPI
from .client import OrbitClient
from .history_types import TaskEvent
from .ops_types import AuditEvent, WorkerSession
from .schedule_types import Occurrence, Schedule
from .subscription_types import DeliveryInfo
from .types import Event, Queue, Task
from .workflow_types import HistoryEntry, Instance, WorkflowSummary, WorkflowVersion

__all__ = ["SyncOrbitClient"]

P = ParamSpec("P")
R = TypeVar("R")
Y = TypeVar("Y")


class _SyncGroup:
    def __init__(self, target: Any, runner: asyncio.Runner) -> None:
        self._async = target
        self._runner = runner

    def _iterate(self, agen: AsyncGenerator[Y, None]) -> Iterator[Y]:
        try:
            while True:
                try:
                    yield self._runner.run(agen.__anext__())
                except StopAsyncIteration:
                    return
        finally:
            # The runner may already be closed when an abandoned iterator is collected.
            with contextlib.suppress(RuntimeError):
                self._runner.run(agen.aclose())


def _blocking(
    method: Callable[Concatenate[Any, P], Coroutine[Any, Any, R]],
) -> Callable[Concatenate[_SyncGroup, P], R]:
    """Turn an async group method into a blocking one with the same signature."""

    def call(self: _SyncGroup, /, *args: P.args, **kwargs: P.kwargs) -> R:
        return self._runner.run(method(self._async, *args, **kwargs))

    functools.update_wrapper(call, method)
    return call


class SyncTasks(_SyncGroup):
    """Blocking ``client.tasks``."""

    submit = _blocking(TasksAPI.submit)
    submit_batch = _blocking(TasksAPI.submit_batch)
    get = _blocking(TasksAPI.get)
    list = _blocking(TasksAPI.list)
    cancel = _blocking(TasksAPI.cancel)
    cancel_all = _blocking(TasksAPI.cancel_all)
    resolve = _blocking(TasksAPI.resolve)
    retry = _blocking(TasksAPI.retry)
    retry_all = _blocking(TasksAPI.retry_all)
    attempts = _blocking(TasksAPI.attempts)
    history = _blocking(TasksAPI.history)
    events = _blocking(TasksAPI.events)
    wait = _blocking(TasksAPI.wait)

    def iter(self, **filters: Any) -> Iterator[Task]:
        """Every task matching the filters, page by page (see ``TasksAPI.iter``)."""
        return self._iterate(self._async.iter(**filters))

    def iter_history(self, task_id: str, *, page_size: int | None = None) -> Iterator[TaskEvent]:
        """Every raw state event of the task, oldest first."""
        return self._iterate(self._async.iter_history(task_id, page_size=page_size))


class SyncQueues(_SyncGroup):
    """Blocking ``client.queues``."""

    put = _blocking(QueuesAPI.put)
    get = _blocking(QueuesAPI.get)
    list = _blocking(QueuesAPI.list)
    pause = _blocking(QueuesAPI.pause)
    resume = _blocking(QueuesAPI.resume)
    delete = _blocking(QueuesAPI.delete)

    def iter(self, *, page_size: int | None = None) -> Iterator[Queue]:
        """Every queue of the namespace."""
        return self._iterate(self._async.iter(page_size=page_size))


class SyncSchedules(_SyncGroup):
    """Blocking ``client.schedules``."""

    put = _blocking(SchedulesAPI.put)
    get = _blocking(SchedulesAPI.get)
    list = _blocking(SchedulesAPI.list)
    pause = _blocking(SchedulesAPI.pause)
    resume = _blocking(SchedulesAPI.resume)
    occurrences = _blocking(SchedulesAPI.occurrences)
    trigger = _blocking(SchedulesAPI.trigger)
    backfill = _blocking(SchedulesAPI.backfill)
    delete = _blocking(SchedulesAPI.delete)

    def iter(self, *, page_size: int | None = None) -> Iterator[Schedule]:
        """Every schedule of the namespace."""
        return self._iterate(self._async.iter(page_size=page_size))

    def iter_occurrences(
        self, name: str, *, outcome: str | None = None, page_size: int | None = None
    ) -> Iterator[Occurrence]:
        """Every occurrence of the schedule, newest first."""
        return self._iterate(
            self._async.iter_occurrences(name, outcome=outcome, page_size=page_size)
        )


class SyncWorkflows(_SyncGroup):
    """Blocking ``client.workflows``."""

    publish = _blocking(WorkflowsAPI.publish)
    get = _blocking(WorkflowsAPI.get)
    version = _blocking(WorkflowsAPI.version)
    list = _blocking(WorkflowsAPI.list)
    delete = _blocking(WorkflowsAPI.delete)

    def iter(self, *, page_size: int | None = None) -> Iterator[WorkflowSummary]:
        """Every workflow of the namespace."""
        return self._iterate(self._async.iter(page_size=page_size))

    def iter_versions(
        self, name: str, *, page_size: int | None = None
    ) -> Iterator[WorkflowVersion]:
        """Every version of the workflow, newest first."""
        return self._iterate(self._async.iter_versions(name, page_size=page_size))


class SyncInstances(_SyncGroup):
    """Blocking ``client.instances``."""

    start = _blocking(InstancesAPI.start)
    get = _blocking(InstancesAPI.get)
    list = _blocking(InstancesAPI.list)
    history = _blocking(InstancesAPI.history)
    signal = _blocking(InstancesAPI.signal)
    pause = _blocking(InstancesAPI.pause)
    resume = _blocking(InstancesAPI.resume)
    cancel = _blocking(InstancesAPI.cancel)
    wait = _blocking(InstancesAPI.wait)

    def iter(self, **filters: Any) -> Iterator[Instance]:
        """Every instance matching ``workflow=`` / ``state=``, newest first."""
        return self._iterate(self._async.iter(**filters))

    def iter_history(
        self, instance_id: str, *, page_size: int | None = None
    ) -> Iterator[HistoryEntry]:
        """Every history entry of the instance, in ``seq`` order."""
        return self._iterate(self._async.iter_history(instance_id, page_size=page_size))


class SyncSubscriptions(_SyncGroup):
    """Blocking ``client.subscriptions``."""

    put = _blocking(SubscriptionsAPI.put)
    get = _blocking(SubscriptionsAPI.get)
    pull = _blocking(SubscriptionsAPI.pull)
    ack = _blocking(SubscriptionsAPI.ack)
    nack = _blocking(SubscriptionsAPI.nack)
    deliveries = _blocking(SubscriptionsAPI.deliveries)
    add_budget = _blocking(SubscriptionsAPI.add_budget)
    delete = _blocking(SubscriptionsAPI.delete)

    def iter_deliveries(
        self, name: str, *, state: str | None = None, page_size: int | None = None
    ) -> Iterator[DeliveryInfo]:
        """Every delivery of the subscription, in sequence order."""
        return self._iterate(self._async.iter_deliveries(name, state=state, page_size=page_size))


class SyncEvents(_SyncGroup):
    """Blocking ``client.events``."""

    list = _blocking(EventsAPI.list)

    def iter(
        self,
        *,
        after_seq: int = 0,
        page_size: int | None = None,
        follow: bool = False,
        interval: float = 1.0,
    ) -> Iterator[Event]:
        """Every event after ``after_seq`` (with ``follow``: keep polling for new ones)."""
        return self._iterate(
            self._async.iter(
                after_seq=after_seq, page_size=page_size, follow=follow, interval=interval
            )
        )


class SyncWorkers(_SyncGroup):
    """Blocking ``client.workers``."""

    list = _blocking(WorkersAPI.list)
    close = _blocking(WorkersAPI.close)

    def iter(
        self, *, state: str | None = None, queue: str | None = None, page_size: int | None = None
    ) -> Iterator[WorkerSession]:
        """Every matching worker session."""
        return self._iterate(self._async.iter(state=state, queue=queue, page_size=page_size))


class SyncAudit(_SyncGroup):
    """Blocking ``client.audit``."""

    list = _blocking(AuditAPI.list)

    def iter(self, **filters: Any) -> Iterator[AuditEvent]:
        """Every matching audit event, newest first (``outcome=``, ``action=``,
        ``since=``, ``until=``, ``page_size=``)."""
        return self._iterate(self._async.iter(**filters))


class SyncRetention(_SyncGroup):
    """Blocking ``client.retention``."""

    get = _blocking(RetentionAPI.get)
    put = _blocking(RetentionAPI.put)


class SyncAdmin(_SyncGroup):
    """Blocking ``client.admin``."""

    create_application = _blocking(AdminAPI.create_application)
    create_namespace = _blocking(AdminAPI.create_namespace)
    create_credential = _blocking(AdminAPI.create_credential)
    revoke_credential = _blocking(AdminAPI.revoke_credential)
    get_resources = _blocking(AdminAPI.get_resources)
    put_resources = _blocking(AdminAPI.put_resources)


class SyncOrbitClient:
    """Blocking client: ``with SyncOrbitClient(url, key, namespace="ns") as orbit: ...``."""

    def __init__(
        self,
        base_url: str | None = None,
        api_key: str | None = None,
        *,
        namespace: str | None = None,
        timeout: float = 30.0,
        http: httpx.AsyncClient | None = None,
    ) -> None:
        self._runner = asyncio.Runner()
        self._client = OrbitClient(
            base_url, api_key, namespace=namespace, timeout=timeout, http=http
        )
        self.tasks = SyncTasks(self._client.tasks, self._runner)
        self.queues = SyncQueues(self._client.queues, self._runner)
        self.schedules = SyncSchedules(self._client.schedules, self._runner)
        self.workflows = SyncWorkflows(self._client.workflows, self._runner)
        self.instances = SyncInstances(self._client.instances, self._runner)
        self.subscriptions = SyncSubscriptions(self._client.subscriptions, self._runner)
        self.events = SyncEvents(self._client.events, self._runner)
        self.workers = SyncWorkers(self._client.workers, self._runner)
        self.audit = SyncAudit(self._client.audit, self._runner)
        self.retention = SyncRetention(self._client.retention, self._runner)
        self.admin = SyncAdmin(self._client.admin, self._runner)

    def __repr__(self) -> str:
        return f"SyncOrbitClient({self._client.base_url!r}, namespace={self._client.namespace!r})"

    @property
    def async_client(self) -> OrbitClient:
        """The wrapped async client (only usable through this object's loop)."""
        return self._client

    def close(self) -> None:
        """Close the connection pool and the private event loop."""
        try:
            self._runner.run(self._client.aclose())
        finally:
            self._runner.close()

    def __enter__(self) -> SyncOrbitClient:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()
