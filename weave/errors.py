"""Weave's errors. Every one is an OrbitError with a stable ``code`` and HTTP ``status``.

OrbitError
 ├── InvalidRequest (400 invalid_request)
 │    └── InvalidDefinition            400 invalid_request  (details: step, reason, rule, field, errors)
 ├── NotFound (404 not_found)
 │    ├── WorkflowNotFound             404 not_found        (no workflow with that name)
 │    ├── VersionNotFound              404 not_found        (no such version of the workflow)
 │    └── InstanceNotFound             404 not_found        (no such instance in the namespace)
 └── Conflict (409 conflict)
      ├── InstanceStateConflict        409 conflict         (not allowed in the instance's state)
      └── SignalIdReused               409 conflict         (same signal_id, different signal)

``WeaveError`` is a marker mixin so ``except WeaveError`` catches every Weave error while each
class keeps the platform status and code its HTTP mapping needs.
"""

from __future__ import annotations

from typing import Any

from orbit.errors import Conflict, InvalidRequest, NotFound, OrbitError
from weave.definition.problems import Problem


class WeaveError(OrbitError):
    """Base of Weave's errors (a 500 when raised bare)."""


class InvalidDefinition(WeaveError, InvalidRequest):
    """A definition broke validation. ``details`` carry the first problem's ``step``,
    ``reason``, ``rule`` and ``field`` (prefixed ``definition.``) and ``errors``: every problem."""

    code = "invalid_request"
    status = 400

    def __init__(self, problems: list[Problem]) -> None:
        first = problems[0]
        where = f"step {first.step!r}: " if first.step else ""
        errors: list[dict[str, Any]] = [_wire(p) for p in problems]
        InvalidRequest.__init__(
            self,
            f"invalid workflow definition: {where}{first.reason}",
            field=errors[0]["field"],
            step=first.step,
            reason=first.reason,
            rule=first.rule.value,
            errors=errors,
        )
        if first.step is None:
            self.details["step"] = None
        self.problems = problems


def _wire(p: Problem) -> dict[str, Any]:
    out = p.to_json()
    out["field"] = "definition" if not p.field else f"definition.{p.field}"
    return out


class WorkflowNotFound(WeaveError, NotFound):
    def __init__(self) -> None:
        NotFound.__init__(self, "workflow")


class VersionNotFound(WeaveError, NotFound):
    def __init__(self) -> None:
        NotFound.__init__(self, "workflow version")


class InstanceNotFound(WeaveError, NotFound):
    def __init__(self) -> None:
        NotFound.__init__(self, "workflow instance")


class InstanceStateConflict(WeaveError, Conflict):
    """The operation is not allowed in the instance's state (e.g. pause a FAILED instance).
    ``details.state`` is the instance's current state."""

    def __init__(self, message: str, state: str) -> None:
        Conflict.__init__(self, message, kind="instance_state", state=state)
        self.state = state


class SignalIdReused(WeaveError, Conflict):
    """A signal with this ``signal_id`` was already accepted with another name, correlation
    key or payload."""

    def __init__(self, signal_id: str) -> None:
        Conflict.__init__(
            self,
            "this signal_id was already used for a different signal",
            kind="signal_id_reused",
            signal_id=signal_id,
        )
