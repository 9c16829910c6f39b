"""Reading one JSON object of a workflow definition: typed field accessors that record a
:class:`~weave.definition.problems.Problem` for each bad field instead of raising, so one
pass reports every problem of a document (used by :mod:`weave.definition.parser`)."""

from __future__ import annotations

import re
from decimal import Decimal
from typing import Any

from weave.definition.expressions import Expr, ExprError, Template, parse_expr, parse_template
from weave.definition.problems import Problem, Rule
from weave.definition.valuetypes import JSON, TypeSpecError, VType, parse_type

#: Durations are bounded to ten years so time arithmetic in the database never overflows.
MAX_DURATION_MS = 10 * 365 * 24 * 3600 * 1000
#: Most steps in a definition (and the default bound of a list field).
MAX_STEPS = 1000


class Fields:
    """Reads one JSON object's fields, recording problems instead of raising."""

    def __init__(self, obj: dict[str, Any], step: str | None, loc: str, problems: list[Problem]):
        self.obj = obj
        self.step = step
        self.loc = loc
        self.problems = problems
        self.ok = True

    def fail(self, name: str | None, reason: str, rule: Rule = Rule.SCHEMA) -> None:
        self.ok = False
        where = self.loc if name is None else (f"{self.loc}.{name}" if self.loc else name)
        self.problems.append(Problem(self.step, reason, rule, where))

    def only(self, allowed: set[str]) -> None:
        for k in self.obj:
            if k not in allowed:
                self.fail(
                    k,
                    f"unknown field {k!r} (allowed: {', '.join(sorted(allowed))})",
                    Rule.UNKNOWN_FIELD,
                )

    def has(self, name: str) -> bool:
        return name in self.obj

    def string(
        self,
        name: str,
        *,
        required: bool = False,
        pattern: re.Pattern[str] | None = None,
        max_len: int = 255,
        rule: Rule = Rule.SCHEMA,
        what: str = "",
    ) -> str | None:
        if name not in self.obj:
            if required:
                self.fail(name, f"{name} is required")
            return None
        v = self.obj[name]
        if not isinstance(v, str):
            self.fail(name, f"{name} must be a string")
            return None
        if pattern is not None and pattern.fullmatch(v) is None:
            self.fail(name, f"{name} {v!r} is not a valid {what or name}", rule)
            return None
        if pattern is None and not 1 <= len(v) <= max_len:
            self.fail(name, f"{name} must be 1 to {max_len} characters")
            return None
        return v

    def integer(
        self, name: str, *, required: bool = False, lo: int = 0, hi: int = MAX_DURATION_MS
    ) -> int | None:
        if name not in self.obj:
            if required:
                self.fail(name, f"{name} is required")
            return None
        v = self.obj[name]
        if isinstance(v, bool) or not isinstance(v, int):
            self.fail(name, f"{name} must be an integer")
            return None
        if not lo <= v <= hi:
            self.fail(name, f"{name} must be between {lo} and {hi}")
            return None
        return v

    def boolean(self, name: str) -> bool | None:
        if name not in self.obj:
            return None
        v = self.obj[name]
        if not isinstance(v, bool):
            self.fail(name, f"{name} must be true or false")
            return None
        return v

    def number(self, name: str, *, lo: float, hi: float) -> float | None:
        if name not in self.obj:
            return None
        v = self.obj[name]
        if isinstance(v, bool) or not isinstance(v, int | float | Decimal):
            self.fail(name, f"{name} must be a number")
            return None
        if not lo <= v <= hi:
            self.fail(name, f"{name} must be between {lo} and {hi}")
            return None
        return float(v)

    def ref(self, name: str) -> str | None:
        """A reference to another step (checked by the validator)."""
        if name not in self.obj:
            return None
        v = self.obj[name]
        if not isinstance(v, str) or not v:
            self.fail(name, f"{name} must be a step id")
            return None
        return v

    def expr(self, name: str, *, required: bool = False) -> Expr | None:
        if name not in self.obj:
            if required:
                self.fail(name, f"{name} is required")
            return None
        try:
            return parse_expr(self.obj[name])
        except ExprError as exc:
            self.fail(f"{name}{exc.where}", f"{name}: {exc.reason}", Rule.EXPRESSION)
            return None

    def template(self, name: str) -> Template | None:
        if name not in self.obj:
            return None
        try:
            return parse_template(self.obj[name])
        except ExprError as exc:
            self.fail(f"{name}{exc.where}", f"{name}: {exc.reason}", Rule.EXPRESSION)
            return None

    def vtype(self, name: str) -> VType:
        if name not in self.obj:
            return JSON
        try:
            return parse_type(self.obj[name])
        except TypeSpecError as exc:
            self.fail(f"{name}{exc.where}", f"{name}: {exc.reason}")
            return JSON

    def obj_field(self, name: str, *, required: bool = False) -> dict[str, Any] | None:
        if name not in self.obj:
            if required:
                self.fail(name, f"{name} is required")
            return None
        v = self.obj[name]
        if not isinstance(v, dict):
            self.fail(name, f"{name} must be an object")
            return None
        return v

    def list_field(
        self, name: str, *, required: bool = False, lo: int = 1, hi: int = MAX_STEPS
    ) -> list[Any] | None:
        if name not in self.obj:
            if required:
                self.fail(name, f"{name} is required")
            return None
        v = self.obj[name]
        if not isinstance(v, list):
            self.fail(name, f"{name} must be an array")
            return None
        if not lo <= len(v) <= hi:
            self.fail(name, f"{name} must have {lo} to {hi} items")
            return None
        return v
