"""Validation problems: each names the step (when there is one), the rule and the reason."""

from __future__ import annotations

from dataclasses import dataclass
from enum import StrEnum
from typing import Any


class Rule(StrEnum):
    """Which rule a definition broke (stable identifiers, also sent to clients)."""

    SCHEMA = "schema"  # a field is missing, of the wrong JSON type or out of range
    UNKNOWN_FIELD = "unknown_field"  # a field the step type does not have
    DUPLICATE_ID = "duplicate_id"  # two steps share an id
    INVALID_NAME = "invalid_name"  # a step id, queue or signal name breaks its naming rule
    DANGLING_REFERENCE = "dangling_reference"  # next/on_*/case/default names no step
    CROSS_SEQUENCE_JUMP = "cross_sequence_jump"  # a jump into or out of a parallel branch
    UNSTRUCTURED_JOIN = "unstructured_join"  # a join not closing exactly its parallel
    MISPLACED_STEP = "misplaced_step"  # e.g. succeed inside a parallel branch
    CYCLE = "cycle"  # a loop outside a poll step
    UNREACHABLE = "unreachable"  # no path from the start reaches the step
    NO_END = "no_end"  # no end is reachable from the step
    EXPRESSION = "expression"  # an expression or template is malformed
    TYPE_ERROR = "type_error"  # an expression is ill-typed
    UNAVAILABLE_OUTPUT = "unavailable_output"  # reads a step that has not surely completed
    LIMIT = "limit"  # too many steps, branches, or nesting levels


@dataclass(frozen=True)
class Problem:
    """One validation error. ``field`` is the JSON location, e.g. ``steps[2].payload.id``."""

    step: str | None
    reason: str
    rule: Rule
    field: str | None = None

    def to_json(self) -> dict[str, Any]:
        return {
            "step": self.step,
            "reason": self.reason,
            "rule": self.rule.value,
            "field": self.field,
        }
