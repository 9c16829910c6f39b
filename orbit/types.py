"""Platform constants and validators shared by services, HTTP handlers and other packages."""

from __future__ import annotations

import re
from datetime import datetime
from enum import StrEnum
from typing import Annotated

import msgspec

from orbit.errors import InvalidRequest
from orbit.times import Time

#: The namespace id used for rows that belong to no namespace (application-level admin
#: operations in ``orbit_idempotency_keys`` and ``orbit_audit_events``).
ZERO_ID = bytes(16)

#: Names (docs/api/conventions.md#names): 1–63 letters, digits, ``_``, ``-``, ``.``; case-sensitive;
#: ``.`` and ``..`` are not names (they break paths). Use with ``fullmatch``.
NAME_RE = re.compile(r"(?!\.\.?\Z)[A-Za-z0-9_.\-]{1,63}")
#: The same rule as a msgspec pattern.
NAME_PATTERN = r"^(?!\.\.?$)[A-Za-z0-9_.\-]{1,63}$"


class Action(StrEnum):
    """Permissions a credential can hold (docs/api/conventions.md#actions)."""

    ADMIN = "admin"  # administer the credential's own application (namespaces, keys, quotas)
    TASKS_SUBMIT = "tasks.submit"  # submit tasks
    TASKS_READ = "tasks.read"  # read tasks and attempts
    TASKS_CANCEL = "tasks.cancel"  # cancel tasks
    TASKS_RESOLVE = "tasks.resolve"  # resolve NEEDS_REVIEW tasks
    QUEUES_MANAGE = "queues.manage"  # create/update queues, pause/resume gates
    WORKERS_CONNECT = "workers.connect"  # open worker sessions
    SCHEDULES_MANAGE = "schedules.manage"  # publish, pause, resume schedules
    WORKFLOWS_MANAGE = "workflows.manage"  # publish definitions, start/pause/cancel instances
    WORKFLOWS_SIGNAL = "workflows.signal"  # send signals to instances
    SUBSCRIPTIONS_MANAGE = "subscriptions.manage"  # create/update subscriptions, add budget
    SUBSCRIPTIONS_CONSUME = "subscriptions.consume"  # stream/pull/ack/nack deliveries
    EVENTS_READ = "events.read"  # read the namespace's result events


ACTIONS: frozenset[str] = frozenset(a.value for a in Action)
ALL_ACTIONS: tuple[str, ...] = tuple(a.value for a in Action)

#: Credential namespaces entry meaning "every namespace of the application, present and future".
ALL_NAMESPACES = "*"


def is_name(value: str) -> bool:
    """True when ``value`` follows the names rule (docs/api/conventions.md#names)."""
    return NAME_RE.fullmatch(value) is not None


def check_name(value: str, field: str) -> str:
    """Return ``value`` or raise 400 naming ``field``."""
    if not is_name(value):
        raise InvalidRequest(
            "names are 1-63 characters of letters, digits, '_', '-' and '.', other than '.' "
            "and '..'",
            field=field,
        )
    return value


# ---------------------------------------------------------------------------------------------
# Stored rows (what store modules return). Ids are bytes, times naive UTC datetimes.
# ---------------------------------------------------------------------------------------------


class ApplicationRow(msgspec.Struct, frozen=True, kw_only=True):
    """A row of ``orbit_applications``."""

    id: bytes
    name: str
    status: str
    revision: int
    created_at: datetime
    updated_at: datetime


class NamespaceRow(msgspec.Struct, frozen=True, kw_only=True):
    """A row of ``orbit_namespaces``."""

    id: bytes
    application_id: bytes
    name: str
    revision: int
    created_at: datetime


class ResourcesRow(msgspec.Struct, frozen=True, kw_only=True):
    """A row of ``orbit_application_resources``: quotas (None = unlimited) and usage."""

    application_id: bytes
    max_unfinished_tasks: int | None
    max_active_attempts: int | None
    max_reservations: int | None
    max_starts_per_second: int | None
    max_subscriptions: int | None
    revision: int
    unfinished_tasks: int
    active_attempts: int
    reservations: int
    window_start: datetime | None
    window_starts: int
    created_at: datetime
    updated_at: datetime


class CredentialRow(msgspec.Struct, frozen=True, kw_only=True):
    """A row of ``orbit_credentials`` without the digest. ``namespaces`` holds 32-hex ids or
    ``"*"``; ``queues`` None means every queue."""

    id: bytes
    application_id: bytes
    name: str
    namespaces: list[str]
    actions: list[str]
    queues: list[str] | None
    global_admin: bool
    expires_at: datetime | None
    revoked_at: datetime | None
    revision: int
    created_at: datetime


class AuthRow(msgspec.Struct, frozen=True, kw_only=True):
    """What authentication reads in one query: the credential, its application's status and
    the id of the requested namespace name in that application (None when absent)."""

    id: bytes
    application_id: bytes
    secret_digest: bytes
    namespaces: list[str]
    actions: list[str]
    queues: list[str] | None
    global_admin: bool
    revision: int
    revoked: bool
    expired: bool
    application_status: str
    namespace_id: bytes | None


# ---------------------------------------------------------------------------------------------
# Wire types of the admin API (request bodies reject unknown fields; see docs/api/admin.md).
# ---------------------------------------------------------------------------------------------

Name = Annotated[str, msgspec.Meta(pattern=NAME_PATTERN, min_length=1, max_length=63)]
#: A name a service checks itself (:func:`check_name`, 400 naming the field): plain text to
#: the decoder, the name pattern in the OpenAPI document.
NAME_JSON_SCHEMA: dict[str, object] = msgspec.json.schema(Name)
NameText = Annotated[str, msgspec.Meta(extra_json_schema=NAME_JSON_SCHEMA)]
#: An id a service checks itself (:func:`orbit.ids.parse_id`): 32 lowercase hex characters.
ID_JSON_SCHEMA: dict[str, object] = {"pattern": "^[0-9a-f]{32}$"}
IdText = Annotated[str, msgspec.Meta(extra_json_schema=ID_JSON_SCHEMA)]
Limit = Annotated[int, msgspec.Meta(ge=0, le=2**62)]


class ApplicationCreate(msgspec.Struct, forbid_unknown_fields=True, kw_only=True):
    """``POST /v1/applications``."""

    name: Name


class NamespaceCreate(msgspec.Struct, forbid_unknown_fields=True, kw_only=True):
    """``POST /v1/applications/{app_id}/namespaces``."""

    name: Name


class CredentialCreate(msgspec.Struct, forbid_unknown_fields=True, kw_only=True):
    """``POST /v1/applications/{app_id}/credentials``.

    ``namespaces`` are names of the application's namespaces, or ``["*"]`` for all of them
    (present and future). ``queues`` omitted or null: every queue. ``global_admin`` may only
    be granted by a global admin.
    """

    name: Annotated[str, msgspec.Meta(min_length=1, max_length=128)]
    #: Checked by the credential service: names of the application's namespaces, or ``["*"]``.
    namespaces: Annotated[
        list[
            Annotated[
                str, msgspec.Meta(extra_json_schema={"anyOf": [NAME_JSON_SCHEMA, {"const": "*"}]})
            ]
        ],
        msgspec.Meta(extra_json_schema={"minItems": 1}),
    ]
    #: Checked by the credential service (400 naming ``actions[i]``); the schema lists them.
    actions: Annotated[
        list[Annotated[str, msgspec.Meta(extra_json_schema={"enum": list(ALL_ACTIONS)})]],
        msgspec.Meta(extra_json_schema={"minItems": 1}),
    ]
    queues: list[Name] | None = None
    expires_at: Time | None = None
    global_admin: bool = False


class ResourcesPut(msgspec.Struct, forbid_unknown_fields=True, kw_only=True):
    """``PUT /v1/applications/{app_id}/resources``: an omitted field keeps its value,
    ``null`` means unlimited."""

    max_unfinished_tasks: Limit | msgspec.UnsetType | None = msgspec.UNSET
    max_active_attempts: Limit | msgspec.UnsetType | None = msgspec.UNSET
    max_reservations: Limit | msgspec.UnsetType | None = msgspec.UNSET
    max_starts_per_second: Limit | msgspec.UnsetType | None = msgspec.UNSET
    max_subscriptions: Limit | msgspec.UnsetType | None = msgspec.UNSET


class ApplicationOut(msgspec.Struct, frozen=True, kw_only=True):
    """An application as the API shows it."""

    id: str
    name: str
    status: str
    revision: int
    created_at: str
    updated_at: str


class NamespaceOut(msgspec.Struct, frozen=True, kw_only=True):
    """A namespace as the API shows it."""

    id: str
    application_id: str
    name: str
    revision: int
    created_at: str


class CredentialOut(msgspec.Struct, frozen=True, kw_only=True):
    """A credential as the API shows it (never the key or its digest).

    ``key`` is set only in the 201 answer of its creation; an ``Idempotency-Key`` replay of
    that answer has ``key: null`` and ``key_redacted: true`` (the secret is never stored).
    """

    id: str
    application_id: str
    name: str
    namespaces: list[str]
    actions: list[str]
    queues: list[str] | None
    global_admin: bool
    expires_at: str | None
    revoked_at: str | None
    revision: int
    created_at: str
    key: str | None = None
    key_redacted: bool = False


class ResourcesUsage(msgspec.Struct, frozen=True, kw_only=True):
    """Live usage counters (never part of the config revision)."""

    unfinished_tasks: int
    active_attempts: int
    reservations: int
    window_start: str | None
    window_starts: int


class ResourcesOut(msgspec.Struct, frozen=True, kw_only=True):
    """``GET/PUT /v1/applications/{app_id}/resources``."""

    application_id: str
    max_unfinished_tasks: int | None
    max_active_attempts: int | None
    max_reservations: int | None
    max_starts_per_second: int | None
    max_subscriptions: int | None
    revision: int
    usage: ResourcesUsage
    updated_at: str


class Whoami(msgspec.Struct, frozen=True, kw_only=True):
    """``GET /v1/whoami``: what the presented key may do."""

    application_id: str
    credential_id: str
    namespaces: list[str]
    actions: list[str]
    queues: list[str] | None
    global_admin: bool
    #: What ``admin`` lets the key administer, whatever namespaces and queues it lists:
    #: ``"application"`` (its whole application), ``"all_applications"`` (a global admin),
    #: or None (the key does not hold ``admin``).
    admin_scope: str | None = None
