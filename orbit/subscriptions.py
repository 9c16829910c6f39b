"""Subscriptions: a filter over a namespace's result events, a start position and the limits
of its deliveries (``PUT``/``GET /v1/namespaces/{ns}/subscriptions/{name}``).

* **Configuration** (filter, ack timeout, attempt budget, in-flight cap) is revisioned: the
  revision is the ETag, ``If-Match`` makes an update conditional and ``If-None-Match: *``
  makes a PUT create-only. A PUT that changes nothing is a 200 no-op (revision unchanged).
* **Start** is applied once, at creation: ``"earliest"`` (position 0), ``"latest"`` (the
  last committed sequence number) or ``{"after_seq": n}``. It cannot change afterwards (409
  ``conflict``), because moving the position back or forth would either re-create
  deliveries that exist or silently skip events; omit it on updates.
* **Cursor** (``after_seq``, shown as ``position``) is owned by the hand-out
  (:mod:`orbit.delivery_pump`): every result event up to it has been handed out or did not
  match the filter. It is not part of the revision and no client writes it.

Changes apply going forward: a new filter selects among events not yet scanned, a new
``max_deliveries`` is the budget of deliveries created afterwards, a new ``ack_timeout_ms``
and ``max_in_flight`` apply from the next hand-out.
"""

from __future__ import annotations

from collections.abc import Callable
from datetime import datetime
from typing import Annotated, Any, Literal

import msgspec

from orbit import audit, resources
from orbit.audit import Actor
from orbit.errors import Conflict, Forbidden, InvalidRequest, NotFound, PreconditionFailed
from orbit.events import RESULT_EVENT_TYPES, ResultEvent, append_event, last_result_seq
from orbit.ids import id_hex, new_id, parse_id
from orbit.storage import Database, DuplicateKey, Tx
from orbit.store import deliveries as delivery_store
from orbit.store import delivery_ranges as range_store
from orbit.store import retention as retention_store
from orbit.store import subscriptions as store
from orbit.store.subscriptions import SubscriptionRow
from orbit.times import format_time
from orbit.types import NAME_JSON_SCHEMA, IdText, check_name

MANAGE = "subscriptions.manage"
CONSUME = "subscriptions.consume"
PUT_ACTION = "subscriptions.put"
DELETE_ACTION = "subscriptions.delete"

#: Defaults and bounds of the delivery limits (documented in docs/api/subscriptions.md).
DEFAULT_ACK_TIMEOUT_MS = 30_000
MIN_ACK_TIMEOUT_MS = 100
MAX_ACK_TIMEOUT_MS = 12 * 3600 * 1000
DEFAULT_MAX_DELIVERIES = 10
MAX_MAX_DELIVERIES = 1000
DEFAULT_MAX_IN_FLIGHT = 100
MAX_MAX_IN_FLIGHT = 10_000
MAX_FILTER_VALUES = 100

_JSON = msgspec.json.Encoder(order="sorted")

FilterText = Annotated[str, msgspec.Meta(min_length=1, max_length=255)]
# What validate_filter checks, stated for the OpenAPI document (the decoder ignores these).
_LIST_DOC = msgspec.Meta(extra_json_schema={"minItems": 1, "maxItems": MAX_FILTER_VALUES})
_NAME_DOC = msgspec.Meta(extra_json_schema=NAME_JSON_SCHEMA)
_STATE_DOC = msgspec.Meta(extra_json_schema={"enum": list(RESULT_EVENT_TYPES)})


def _range(low: int, high: int) -> msgspec.Meta:
    """The bounds :func:`_bounded` checks, for the OpenAPI document."""
    return msgspec.Meta(extra_json_schema={"minimum": low, "maximum": high})


class SubscriptionFilter(
    msgspec.Struct, frozen=True, kw_only=True, forbid_unknown_fields=True, omit_defaults=True
):
    """Which result events a subscription selects. Absent (or null) means "any"; every
    present field must match (AND), and a list matches any of its values (OR)."""

    queues: Annotated[list[Annotated[FilterText, _NAME_DOC]], _LIST_DOC] | None = None
    kinds: Annotated[list[FilterText], _LIST_DOC] | None = None
    states: Annotated[list[Annotated[str, _STATE_DOC]], _LIST_DOC] | None = None
    owner_id: IdText | None = None


#: Largest sequence number a request may name (the signed 64-bit range; stored unsigned).
MAX_SEQ = 2**63 - 1


class StartAfterSeq(msgspec.Struct, frozen=True, kw_only=True, forbid_unknown_fields=True):
    """``{"after_seq": n}``: deliver events with ``seq > n``."""

    after_seq: Annotated[int, msgspec.Meta(ge=0, le=MAX_SEQ)]


StartSpec = Literal["earliest", "latest"] | StartAfterSeq


class SubscriptionPut(msgspec.Struct, kw_only=True, forbid_unknown_fields=True):
    """``PUT /v1/namespaces/{ns}/subscriptions/{name}`` body. Omitted limits take their
    defaults on create and keep their value on update; ``start`` only applies on create."""

    filter: SubscriptionFilter | msgspec.UnsetType = msgspec.UNSET
    start: StartSpec | msgspec.UnsetType = msgspec.UNSET
    ack_timeout_ms: (
        Annotated[int, _range(MIN_ACK_TIMEOUT_MS, MAX_ACK_TIMEOUT_MS)] | msgspec.UnsetType
    ) = msgspec.UNSET
    max_deliveries: Annotated[int, _range(1, MAX_MAX_DELIVERIES)] | msgspec.UnsetType = (
        msgspec.UNSET
    )
    max_in_flight: Annotated[int, _range(1, MAX_MAX_IN_FLIGHT)] | msgspec.UnsetType = msgspec.UNSET


class Backlog(msgspec.Struct, frozen=True, kw_only=True):
    """Delivery counts of one subscription, by state, plus events not yet scanned."""

    pending: int  # PENDING: waiting for (re)delivery, possibly in backoff
    in_flight: int  # LEASED: handed out, not yet acked (including expired, not yet reclaimed)
    exhausted: int  # EXHAUSTED: budget spent; kept until an operator adds budget
    acked: int  # ACKED: done
    unscanned_events: int  # result events after the cursor, not yet handed out (any filter)
    last_seq: int  # the namespace's last committed result sequence number


class SubscriptionOut(msgspec.Struct, frozen=True, kw_only=True, omit_defaults=True):
    """A subscription as the API shows it; ``backlog`` only in GET."""

    id: str
    name: str
    filter: SubscriptionFilter
    start: Any
    ack_timeout_ms: int
    max_deliveries: int
    max_in_flight: int
    position: int
    revision: int
    created_at: str
    updated_at: str
    backlog: Backlog | None = None


class EventFilter:
    """The compiled filter the hand-out applies to each result event."""

    __slots__ = ("kinds", "owner_id", "queues", "states")

    def __init__(self, spec: SubscriptionFilter) -> None:
        self.queues = None if spec.queues is None else frozenset(spec.queues)
        self.kinds = None if spec.kinds is None else frozenset(spec.kinds)
        self.states = None if spec.states is None else frozenset(spec.states)
        self.owner_id = None if spec.owner_id is None else parse_id(spec.owner_id)

    def matches(self, event: ResultEvent) -> bool:
        """True when ``event`` passes every present field of the filter."""
        return (
            (self.queues is None or event.queue in self.queues)
            and (self.kinds is None or (event.kind is not None and event.kind in self.kinds))
            and (self.states is None or event.state in self.states)
            and (self.owner_id is None or event.owner_id == self.owner_id)
        )


def _check_list(values: list[str] | None, field: str) -> None:
    if values is None:
        return
    if not 1 <= len(values) <= MAX_FILTER_VALUES:
        raise InvalidRequest(
            f"filter lists hold 1 to {MAX_FILTER_VALUES} values (omit the field for any)",
            field=f"filter.{field}",
        )


def validate_filter(spec: SubscriptionFilter) -> SubscriptionFilter:
    """Check a filter; raise 400 naming the field. Lists are normalised (sorted, unique)."""
    _check_list(spec.queues, "queues")
    _check_list(spec.kinds, "kinds")
    _check_list(spec.states, "states")
    for q in spec.queues or ():
        check_name(q, "filter.queues")
    for s in spec.states or ():
        if s not in RESULT_EVENT_TYPES:
            raise InvalidRequest(
                f"states are {', '.join(RESULT_EVENT_TYPES)}", field="filter.states"
            )
    if spec.owner_id is not None and parse_id(spec.owner_id) is None:
        raise InvalidRequest("owner_id is 32 lowercase hex characters", field="filter.owner_id")

    def norm(values: list[str] | None) -> list[str] | None:
        return None if values is None else sorted(set(values))

    return SubscriptionFilter(
        queues=norm(spec.queues),
        kinds=norm(spec.kinds),
        states=norm(spec.states),
        owner_id=spec.owner_id,
    )


def _bounded(value: int, field: str, low: int, high: int) -> int:
    if isinstance(value, bool) or not low <= value <= high:
        raise InvalidRequest(f"{field} must be an integer from {low} to {high}", field=field)
    return value


def parse_filter(text: str) -> SubscriptionFilter:
    """The stored filter JSON as a Struct."""
    return msgspec.json.decode(text, type=SubscriptionFilter)


def compile_filter(row: SubscriptionRow) -> EventFilter:
    return EventFilter(parse_filter(row.filter))


def visible_to(row: SubscriptionRow, queues: frozenset[str] | None) -> bool:
    """May a key limited to ``queues`` (None: not limited) see and use this subscription?
    Only when its filter names queues and every one of them is allowed: a subscription over
    all queues (no queue filter) carries other queues' results."""
    if queues is None:
        return True
    named = parse_filter(row.filter).queues
    return named is not None and bool(named) and set(named) <= queues


def check_filter_queues(spec: SubscriptionFilter | None, queues: frozenset[str] | None) -> None:
    """403 unless a key limited to ``queues`` asks only for allowed queues, by name."""
    if queues is None:
        return
    if spec is None or not spec.queues:
        raise Forbidden(
            "this key is limited to some queues: the filter must name allowed queues",
            field="filter.queues",
        )
    denied = sorted(set(spec.queues) - queues)
    if denied:
        raise Forbidden(
            f"the key may not use queue {denied[0]!r}", field="filter.queues", queues=denied
        )


def _start_json(start: Any) -> str:
    return _JSON.encode(start).decode()


def subscription_out(row: SubscriptionRow, backlog: Backlog | None = None) -> SubscriptionOut:
    return SubscriptionOut(
        id=id_hex(row.id),
        name=row.name,
        filter=parse_filter(row.filter),
        start=msgspec.json.decode(row.start_spec),
        ack_timeout_ms=row.ack_timeout_ms,
        max_deliveries=row.max_deliveries,
        max_in_flight=row.max_in_flight,
        position=row.after_seq,
        revision=row.revision,
        created_at=format_time(row.created_at),
        updated_at=format_time(row.updated_at),
        backlog=backlog,
    )


def _limits(body: SubscriptionPut, current: SubscriptionRow | None) -> dict[str, int]:
    def pick(name: str, default: int) -> int:
        value = getattr(body, name)
        if value is msgspec.UNSET:
            return getattr(current, name) if current is not None else default
        return int(value)

    return {
        "ack_timeout_ms": _bounded(
            pick("ack_timeout_ms", DEFAULT_ACK_TIMEOUT_MS),
            "ack_timeout_ms",
            MIN_ACK_TIMEOUT_MS,
            MAX_ACK_TIMEOUT_MS,
        ),
        "max_deliveries": _bounded(
            pick("max_deliveries", DEFAULT_MAX_DELIVERIES), "max_deliveries", 1, MAX_MAX_DELIVERIES
        ),
        "max_in_flight": _bounded(
            pick("max_in_flight", DEFAULT_MAX_IN_FLIGHT), "max_in_flight", 1, MAX_MAX_IN_FLIGHT
        ),
    }


async def _start_position(tx: Tx, namespace_id: bytes, start: Any) -> int:
    """The start cursor, never before the result events the retention purge removed: the
    namespace's retention row is locked so a purge batch runs wholly before or after."""
    if start != "earliest" and not isinstance(start, StartAfterSeq):
        return await last_result_seq(tx, namespace_id)
    wanted = start.after_seq if isinstance(start, StartAfterSeq) else 0
    kept = await retention_store.retention_get(tx, namespace_id, for_update=True)
    return wanted if kept is None else max(wanted, kept.result_seq_purged)


async def put_subscription(
    db: Database,
    actor: Actor,
    namespace_id: bytes,
    name: str,
    body: SubscriptionPut,
    *,
    if_match: int | None = None,
    create_only: bool = False,
    precondition: Callable[[int | None], None] | None = None,
    request_id: str | None = None,
    now: datetime | None = None,
    allowed_queues: frozenset[str] | None = None,
) -> tuple[SubscriptionRow, bool, bool]:
    """Create or update a subscription; return (row, created, changed).

    ``allowed_queues`` (a key limited to some queues): the filter must name only allowed
    queues (403), and an existing subscription the key may not see is a 404.

    Preconditions are checked against the locked row, so check and write are atomic:
    ``precondition(current_revision or None)`` (the HTTP layer passes
    ``orbit.http.etag.Preconditions.check``) or, for direct callers, ``if_match`` /
    ``create_only``. Raises PreconditionFailed (412) when they fail; Conflict (409) when an
    update asks for another ``start``; InvalidRequest (400) for bad fields. Two concurrent
    creates of one name: the loser re-runs as an update of the winner's row.
    """
    check_name(name, "name")
    spec = validate_filter(body.filter) if body.filter is not msgspec.UNSET else None

    def check(current: int | None) -> None:
        if precondition is not None:
            precondition(current)
        if create_only and current is not None:
            raise PreconditionFailed(
                "the subscription already exists (If-None-Match: *)", current_revision=current
            )
        if if_match is not None and if_match != current:
            raise PreconditionFailed(
                "If-Match does not match the current revision", current_revision=current
            )

    async def run(tx: Tx) -> tuple[SubscriptionRow, bool, bool]:
        # A creation counts against the application's max_subscriptions: its resources row
        # is locked first (the lock order), so look before locking the subscription's row.
        absent = await store.subscription_get_by_name(tx, namespace_id, name) is None
        quota = await resources.lock_subscription_quota(tx, namespace_id) if absent else None
        row = await store.subscription_get_by_name(tx, namespace_id, name, for_update=True)
        if row is not None and not visible_to(row, allowed_queues):
            raise NotFound("subscription")
        check(None if row is None else row.revision)
        if row is None:
            check_filter_queues(spec, allowed_queues)
            if not absent:  # deleted since the look: rare, so the lock comes late
                quota = await resources.lock_subscription_quota(tx, namespace_id)
            await resources.check_subscription_quota(tx, quota)
            return await _create(tx, spec, body), True, True
        if spec is not None:
            check_filter_queues(spec, allowed_queues)
        if body.start is not msgspec.UNSET and _start_json(body.start) != _start_json(
            msgspec.json.decode(row.start_spec)
        ):
            raise Conflict(
                "start is fixed when the subscription is created; omit it on updates",
                kind="subscription_start",
                field="start",
            )
        limits = _limits(body, row)
        new_filter = _JSON.encode(spec if spec is not None else parse_filter(row.filter)).decode()
        if new_filter == _JSON.encode(parse_filter(row.filter)).decode() and all(
            getattr(row, k) == v for k, v in limits.items()
        ):
            return row, False, False
        ok = await store.subscription_update_if_revision(
            tx,
            {
                "namespace_id": namespace_id,
                "id": row.id,
                "revision": row.revision,
                "filter": new_filter,
                "now": now,
                **limits,
            },
        )
        if not ok:  # we hold the row lock: only a bug gets here; never last-write-wins
            raise Conflict("subscription changed concurrently", kind="cas")
        await _audit(tx, row.id, 200, row.revision + 1)
        updated = await store.subscription_get_by_name(tx, namespace_id, name)
        assert updated is not None
        return updated, False, True

    async def _create(
        tx: Tx, spec: SubscriptionFilter | None, body: SubscriptionPut
    ) -> SubscriptionRow:
        start = "latest" if body.start is msgspec.UNSET else body.start
        sub_id = new_id()
        await store.subscription_insert(
            tx,
            {
                "namespace_id": namespace_id,
                "id": sub_id,
                "name": name,
                "filter": _JSON.encode(spec or SubscriptionFilter()).decode(),
                "start_spec": _start_json(start),
                "after_seq": await _start_position(tx, namespace_id, start),
                "now": now,
                **_limits(body, None),
            },
        )
        await _audit(tx, sub_id, 201, 1)
        created = await store.subscription_get_by_name(tx, namespace_id, name)
        assert created is not None
        return created

    async def _audit(tx: Tx, sub_id: bytes, status: int, revision: int) -> None:
        await audit.record(
            tx,
            actor=actor,
            action=PUT_ACTION,
            resource_kind="subscription",
            resource_id=name,
            status_code=status,
            namespace_id=namespace_id,
            request_id=request_id,
            details={"id": id_hex(sub_id), "revision": revision},
            now=now,
        )

    try:
        return await db.transaction(run)
    except DuplicateKey as exc:
        if exc.key != store.NAME_CONSTRAINT:
            raise
        return await db.transaction(run)  # the other create won: this is now an update


async def delete_subscription(
    db: Database,
    actor: Actor,
    namespace_id: bytes,
    name: str,
    *,
    precondition: Callable[[int | None], None] | None = None,
    allowed_queues: frozenset[str] | None = None,
    request_id: str | None = None,
) -> None:
    """Delete subscription ``name``: nothing more is scanned or handed out for it, and its
    streams end (their next hand-out finds no subscription); its deliveries stay as history
    until retention removes them, and the name can be used again (a new subscription with
    its own start). NotFound (404) when absent or not visible to a key limited to
    ``allowed_queues`` (:func:`visible_to`); PreconditionFailed (412) from
    ``precondition(current_revision)``.

    Takes the subscription row lock first, like every pump, hand-out and lease expiry, so
    none of them is half-way when the row goes.
    """

    async def run(tx: Tx) -> None:
        row = await store.subscription_get_by_name(tx, namespace_id, name, for_update=True)
        if row is None or not visible_to(row, allowed_queues):
            raise NotFound("subscription")
        if precondition is not None:
            precondition(row.revision)
        ok = await store.subscription_delete_if_revision(tx, namespace_id, row.id, row.revision)
        assert ok, "the subscription row is locked"
        await append_event(
            tx, namespace_id, "subscription.deleted", "subscription", row.id,
            {"name": name, "revision": row.revision, "after_seq": row.after_seq}, request_id,
        )  # fmt: skip
        await audit.record(
            tx, actor=actor, action=DELETE_ACTION, resource_kind="subscription",
            resource_id=name, status_code=204, namespace_id=namespace_id,
            request_id=request_id,
            details={"id": id_hex(row.id), "revision": row.revision, "after_seq": row.after_seq},
        )  # fmt: skip

    await db.transaction(run)


async def get_subscription(
    db: Database, namespace_id: bytes, name: str, allowed_queues: frozenset[str] | None = None
) -> SubscriptionRow:
    """The subscription named ``name``; NotFound (404) when absent or not visible to a key
    limited to ``allowed_queues`` (:func:`visible_to`)."""

    async def run(tx: Tx) -> SubscriptionRow | None:
        return await store.subscription_get_by_name(tx, namespace_id, name)

    row = await db.read(run)
    if row is None or not visible_to(row, allowed_queues):
        raise NotFound("subscription")
    return row


async def check_delivery_visible(
    db: Database, namespace_id: bytes, delivery_id: bytes, allowed_queues: frozenset[str] | None
) -> None:
    """404 when a key limited to ``allowed_queues`` may not see the delivery's subscription
    (nothing is read for an unlimited key)."""
    if allowed_queues is None:
        return

    async def run(tx: Tx) -> SubscriptionRow | None:
        from orbit import delivery_slots  # a range slot, when the delivery has no row

        d = await delivery_store.delivery_get(tx, namespace_id, delivery_id)
        if d is not None:
            return await store.subscription_get(tx, namespace_id, d.subscription_id)
        slot = await delivery_slots.find_slot(tx, namespace_id, delivery_id)
        if slot is None:
            return None
        return await store.subscription_get(tx, namespace_id, slot[0].subscription_id)

    row = await db.read(run)
    if row is None or not visible_to(row, allowed_queues):
        raise NotFound("delivery")


async def read_backlog(tx: Tx, row: SubscriptionRow) -> Backlog:
    """Counts by state plus unscanned events, read in the caller's transaction."""
    counts, (open_slots, acked_slots), last = await tx.pipeline(
        delivery_store.delivery_count_by_state(tx, row.namespace_id, row.id),
        range_store.range_counts(tx, row.namespace_id, row.id),
        last_result_seq(tx, row.namespace_id),
    )
    return Backlog(
        pending=counts.get("PENDING", 0),
        in_flight=counts.get("LEASED", 0) + open_slots,
        exhausted=counts.get("EXHAUSTED", 0),
        acked=counts.get("ACKED", 0) + acked_slots,
        unscanned_events=max(0, last - row.after_seq),
        last_seq=last,
    )


async def get_subscription_with_backlog(
    db: Database, namespace_id: bytes, name: str, allowed_queues: frozenset[str] | None = None
) -> tuple[SubscriptionRow, Backlog]:
    """``GET .../subscriptions/{name}``: the row and its backlog, read together (404 as
    :func:`get_subscription`)."""

    async def run(tx: Tx) -> tuple[SubscriptionRow, Backlog] | None:
        row = await store.subscription_get_by_name(tx, namespace_id, name)
        if row is None or not visible_to(row, allowed_queues):
            return None
        return row, await read_backlog(tx, row)

    found = await db.read(run)
    if found is None:
        raise NotFound("subscription")
    return found
