"""``OrbitClient``: the async producer and admin client.

    async with OrbitClient("http://127.0.0.1:8080", api_key, namespace="default") as orbit:
        task = await orbit.tasks.submit("emails", "send_welcome", {"user": 42})
        done = await orbit.tasks.wait(task.id, timeout=30)

Calls are grouped: ``orbit.tasks``, ``orbit.queues``, ``orbit.schedules``, ``orbit.workflows``,
``orbit.instances``, ``orbit.subscriptions``, ``orbit.events``, ``orbit.workers``,
``orbit.audit``, ``orbit.retention`` (namespaced) and ``orbit.admin``.
``base_url``/``api_key``/``namespace`` default to ``ORBIT_URL``/``ORBIT_KEY``/
``ORBIT_NAMESPACE``.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from types import TracebackType

import httpx

from ._admin import AdminAPI
from ._http import HttpTransport
from ._operators import AuditAPI, RetentionAPI, WorkersAPI
from ._queues import QueuesAPI
from ._schedules import SchedulesAPI
from ._subscriptions import EventsAPI, SubscriptionsAPI
from ._tasks import TasksAPI
from ._workflows import InstancesAPI, WorkflowsAPI

__all__ = ["OrbitClient"]

DEFAULT_URL = "http://127.0.0.1:8080"


class OrbitClient:
    """Async client for the Orbit HTTP API.

    Errors are raised as :mod:`orbit_sdk.errors` classes mapped from the server's ``code``.
    Nothing is retried automatically; pass ``idempotency_key`` to creating calls to make a
    retry safe. The API key is only ever sent in the Authorization header.

    ``base_url`` may name several nodes of one deployment (a list, or one string with
    commas, also in ``ORBIT_URL``): a call that meets a failed node goes to the next one at
    once when that cannot apply it twice — the connection could not be opened, the node
    answered 503, or the call is idempotent (reads, PUTs, deletes, calls given an
    ``idempotency_key``).
    """

    def __init__(
        self,
        base_url: str | Sequence[str] | None = None,
        api_key: str | None = None,
        *,
        namespace: str | None = None,
        timeout: float = 30.0,
        http: httpx.AsyncClient | None = None,
        _transport: HttpTransport | None = None,
    ) -> None:
        if _transport is None:
            key = api_key if api_key is not None else os.environ.get("ORBIT_KEY")
            if not key:
                raise ValueError("api_key is required (or set ORBIT_KEY)")
            url = base_url or os.environ.get("ORBIT_URL") or DEFAULT_URL
            _transport = HttpTransport(url, key, timeout=timeout, http=http)
            self._owns_transport = True
        else:
            self._owns_transport = False
        self._http = _transport
        self._namespace = namespace if namespace is not None else os.environ.get("ORBIT_NAMESPACE")
        self.tasks = TasksAPI(self._http, self._require_namespace)
        """Tasks and result events of the client's namespace."""
        self.queues = QueuesAPI(self._http, self._require_namespace)
        """Queues and their gates in the client's namespace."""
        self.schedules = SchedulesAPI(self._http, self._require_namespace)
        """Schedules (immutable versions, pause/resume, occurrences) in the namespace."""
        self.workflows = WorkflowsAPI(self._http, self._require_namespace)
        """Workflow definitions and their versions in the namespace."""
        self.instances = InstancesAPI(self._http, self._require_namespace)
        """Workflow instances: start, read, history, signals, pause/resume/cancel."""
        self.subscriptions = SubscriptionsAPI(self._http, self._require_namespace)
        """Subscriptions and deliveries (HTTP pull, ack, nack, history, budget)."""
        self.events = EventsAPI(self._http, self._require_namespace)
        """The namespace's result events by sequence."""
        self.workers = WorkersAPI(self._http, self._require_namespace)
        """Connected worker sessions; an operator's close of one."""
        self.audit = AuditAPI(self._http, self._require_namespace)
        """The namespace's audit trail (needs ``admin``)."""
        self.retention = RetentionAPI(self._http, self._require_namespace)
        """The namespace's retention windows and purge progress (needs ``admin``)."""
        self.admin = AdminAPI(self._http)
        """Applications, namespaces, credentials, quotas."""

    def __repr__(self) -> str:
        return f"OrbitClient({self._http.base_url!r}, namespace={self._namespace!r})"

    @property
    def base_url(self) -> str:
        """The server's base URL."""
        return self._http.base_url

    @property
    def namespace(self) -> str | None:
        """The namespace that every group except ``admin`` acts on."""
        return self._namespace

    def with_namespace(self, namespace: str) -> OrbitClient:
        """A client for another namespace sharing this one's connection pool.
        Closing it does not close the shared pool."""
        return OrbitClient(namespace=namespace, _transport=self._http)

    def _require_namespace(self) -> str:
        if not self._namespace:
            raise ValueError("this call needs a namespace: OrbitClient(..., namespace=...)")
        return self._namespace

    async def aclose(self) -> None:
        """Close the connection pool (if this client created it)."""
        if self._owns_transport:
            await self._http.aclose()

    async def __aenter__(self) -> OrbitClient:
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        await self.aclose()
