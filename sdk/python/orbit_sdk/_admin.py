"""``client.admin``: applications, namespaces, credentials and resource quotas.

Needs a key with the ``admin`` action (creating applications needs a global admin key).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from datetime import datetime
from typing import Any

from ._http import HttpTransport, seg
from ._tasks import idempotency_headers
from .types import Application, CreatedCredential, Namespace

__all__ = ["AdminAPI"]


class AdminAPI:
    """Administration calls (not bound to a namespace)."""

    def __init__(self, http: HttpTransport) -> None:
        self._http = http

    async def create_application(
        self, name: str, *, idempotency_key: str | None = None
    ) -> Application:
        """Create an application (tenant)."""
        return await self._http.call(
            "POST",
            "/v1/applications",
            Application,
            body={"name": name},
            headers=idempotency_headers(idempotency_key),
        )

    async def create_namespace(
        self, application_id: str, name: str, *, idempotency_key: str | None = None
    ) -> Namespace:
        """Create a namespace in an application."""
        return await self._http.call(
            "POST",
            f"/v1/applications/{seg(application_id)}/namespaces",
            Namespace,
            body={"name": name},
            headers=idempotency_headers(idempotency_key),
        )

    async def create_credential(
        self,
        application_id: str,
        name: str,
        *,
        namespaces: Sequence[str],
        actions: Sequence[str],
        queues: Sequence[str] | None = None,
        expires_at: datetime | None = None,
        idempotency_key: str | None = None,
    ) -> CreatedCredential:
        """Create an API key; its clear value is in ``.key`` and is shown only this once."""
        body: dict[str, Any] = {
            "name": name,
            "namespaces": list(namespaces),
            "actions": list(actions),
        }
        if queues is not None:
            body["queues"] = list(queues)
        if expires_at is not None:
            body["expires_at"] = expires_at
        return await self._http.call(
            "POST",
            f"/v1/applications/{seg(application_id)}/credentials",
            CreatedCredential,
            body=body,
            headers=idempotency_headers(idempotency_key),
        )

    async def revoke_credential(self, credential_id: str) -> None:
        """Revoke an API key (later requests with it get 401)."""
        await self._http.request("DELETE", f"/v1/credentials/{seg(credential_id)}")

    async def get_resources(self, application_id: str) -> dict[str, Any]:
        """The application's quotas and live usage, as plain JSON values."""
        return await self._http.call(
            "GET", f"/v1/applications/{seg(application_id)}/resources", dict[str, Any]
        )

    async def put_resources(
        self, application_id: str, limits: Mapping[str, int | None]
    ) -> dict[str, Any]:
        """Set quotas (``max_unfinished_tasks``, ``max_active_attempts``,
        ``max_starts_per_second``; None = unlimited). Returns the server's answer."""
        return await self._http.call(
            "PUT",
            f"/v1/applications/{seg(application_id)}/resources",
            dict[str, Any],
            body=dict(limits),
        )
