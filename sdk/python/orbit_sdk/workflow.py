"""Build Weave workflow definitions in Python; emits exactly the JSON the server validates.

Example (docs/workflows.md has the language reference)::

    from orbit_sdk.workflow import T, Workflow, input, output, when

    wf = Workflow(input_schema=T.object(order_id=T.string, amount=T.number))
    wf.task("charge", queue="payments", kind="charge",
            payload={"order": input("order_id"), "cents": input("amount") * 100},
            output_schema=T.object(status=T.string), on_failure="cancel_order")
    wf.choice("paid", [when(output("charge", "status") == "ok", "ship")], default="cancel_order")
    wf.wait_signal("ship", signal="shipped", correlation_key=input("order_id"),
                   timeout_ms=86_400_000, on_timeout="refund")
    wf.succeed("done", output={"tracking": output("ship", "tracking")})
    wf.task("refund", queue="payments", kind="refund", payload={"order": input("order_id")},
            next="cancel_order")
    wf.fail("cancel_order", error="order_cancelled")

    body = {"definition": wf.to_dict()}     # POST /v1/namespaces/{ns}/workflows/{name}/versions

Expressions are Python operators on paths: ``==  !=  <  <=  >  >=`` compare, ``&  |  ~`` are
and/or/not (use parentheses: ``(a > 1) & (b == "x")``), ``+ - * / %`` are arithmetic.
Put an expression anywhere in a payload/output and it becomes a ``{"$": ...}`` hole.
This module imports nothing from the server.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from orbit_sdk.workflow_expr import (
    Expr,
    ExprLike,
    Path,
    _step_id,
    concat,
    error,
    expr_json,
    input,
    lit,
    output,
    path,
    result,
    template_json,
)

__all__ = [
    "Expr",
    "Parallel",
    "Path",
    "Retry",
    "Sequence",
    "T",
    "Workflow",
    "concat",
    "error",
    "input",
    "lit",
    "output",
    "path",
    "result",
    "when",
]


# ----------------------------------------------------------------------------- types


class T:
    """Type specs for ``input_schema`` and ``output_schema``."""

    null = "null"
    bool = "bool"
    number = "number"
    string = "string"
    json = "json"

    @staticmethod
    def array(items: Any) -> dict[str, Any]:
        return {"array": items}

    @staticmethod
    def object(fields: Mapping[str, Any] | None = None, **more: Any) -> dict[str, Any]:
        """Listed fields must be present with these types; other fields may exist."""
        return {"object": {**(fields or {}), **more}}

    @staticmethod
    def nullable(inner: Any) -> dict[str, Any]:
        return {"nullable": inner}


# ----------------------------------------------------------------------------- steps


@dataclass(frozen=True)
class Retry:
    """Per-task retry options; unset fields use the queue's defaults."""

    max_attempts: int | None = None
    backoff_initial_ms: int | None = None
    backoff_max_ms: int | None = None
    backoff_multiplier: float | None = None

    def to_dict(self) -> dict[str, Any]:
        return {k: v for k, v in self.__dict__.items() if v is not None}


@dataclass(frozen=True)
class _Case:
    when: Expr
    next: str


def when(condition: Expr, next: str) -> _Case:
    """A choice case: go to ``next`` when ``condition`` holds."""
    return _Case(condition, next)


def _flow(
    step: dict[str, Any], next: str | None, end: bool, description: str | None
) -> dict[str, Any]:
    if next is not None and end:
        raise ValueError("a step has either next or end=True, not both")
    if next is not None:
        step["next"] = next
    if end:
        step["end"] = True
    if description is not None:
        step["description"] = description
    return step


def _task_fields(
    queue: str,
    kind: str,
    payload: Any,
    pipeline_version: str | None,
    priority: int | None,
    retry: Retry | Mapping[str, Any] | None,
    retry_safe: bool | None,
    deadline_ms: int | None,
    concurrency_key: ExprLike,
    output_schema: Any,
) -> dict[str, Any]:
    out: dict[str, Any] = {"queue": queue, "kind": kind}
    if pipeline_version is not None:
        out["pipeline_version"] = pipeline_version
    if payload is not None:
        out["payload"] = template_json(payload)
    if priority is not None:
        out["priority"] = priority
    if retry is not None:
        out["retry"] = retry.to_dict() if isinstance(retry, Retry) else dict(retry)
    if retry_safe is not None:
        out["retry_safe"] = retry_safe
    if deadline_ms is not None:
        out["deadline_ms"] = deadline_ms
    if concurrency_key is not None:
        out["concurrency_key"] = expr_json(concurrency_key)
    if output_schema is not None:
        out["output_schema"] = output_schema
    return out


class Sequence:
    """An ordered list of steps: the workflow's top level or one parallel branch.

    Every method appends one step and returns the sequence (``parallel`` returns the
    :class:`Parallel` so branches can be filled). A step without ``next``/``end`` continues
    with the step added after it.
    """

    def __init__(self, name: str | None = None) -> None:
        self.name = name
        self._steps: list[dict[str, Any] | Parallel] = []

    def add(self, step: Mapping[str, Any]) -> Sequence:
        """Append a raw step object (for options this builder does not know)."""
        self._steps.append(dict(step))
        return self

    def task(
        self,
        id: str,
        *,
        queue: str,
        kind: str,
        payload: Any = None,
        pipeline_version: str | None = None,
        priority: int | None = None,
        retry: Retry | Mapping[str, Any] | None = None,
        retry_safe: bool | None = None,
        deadline_ms: int | None = None,
        concurrency_key: ExprLike = None,
        output_schema: Any = None,
        on_failure: str | None = None,
        next: str | None = None,
        end: bool = False,
        description: str | None = None,
    ) -> Sequence:
        """Run one task; its result is ``output(id)``. ``on_failure`` catches a failed task."""
        step: dict[str, Any] = {"id": _step_id(id), "type": "task"}
        step.update(
            _task_fields(queue, kind, payload, pipeline_version, priority, retry, retry_safe,
                         deadline_ms, concurrency_key, output_schema)
        )  # fmt: skip
        if on_failure is not None:
            step["on_failure"] = on_failure
        self._steps.append(_flow(step, next, end, description))
        return self

    def wait_signal(
        self,
        id: str,
        *,
        signal: str,
        correlation_key: ExprLike = None,
        timeout_ms: int | None = None,
        on_timeout: str | None = None,
        output_schema: Any = None,
        next: str | None = None,
        end: bool = False,
        description: str | None = None,
    ) -> Sequence:
        """Wait for signal ``signal``; its payload is ``output(id)``."""
        step: dict[str, Any] = {"id": _step_id(id), "type": "wait_signal", "signal": signal}
        if correlation_key is not None:
            step["correlation_key"] = expr_json(correlation_key)
        if timeout_ms is not None:
            step["timeout_ms"] = timeout_ms
        if on_timeout is not None:
            step["on_timeout"] = on_timeout
        if output_schema is not None:
            step["output_schema"] = output_schema
        self._steps.append(_flow(step, next, end, description))
        return self

    def sleep(
        self,
        id: str,
        *,
        duration_ms: int | None = None,
        until: ExprLike = None,
        next: str | None = None,
        end: bool = False,
        description: str | None = None,
    ) -> Sequence:
        """A durable timer: ``duration_ms``, or ``until`` an RFC 3339 time (expression)."""
        if (duration_ms is None) == (until is None):
            raise ValueError("sleep takes exactly one of duration_ms or until")
        step: dict[str, Any] = {"id": _step_id(id), "type": "sleep"}
        if duration_ms is not None:
            step["duration_ms"] = duration_ms
        else:
            step["until"] = expr_json(until)
        self._steps.append(_flow(step, next, end, description))
        return self

    def poll(
        self,
        id: str,
        *,
        queue: str,
        kind: str,
        until: Expr,
        max_rounds: int,
        payload: Any = None,
        max_attempts: int | None = None,
        interval_ms: int | None = None,
        deadline_ms: int | None = None,
        on_exhausted: str | None = None,
        pipeline_version: str | None = None,
        priority: int | None = None,
        backoff: Retry | Mapping[str, Any] | None = None,
        retry_safe: bool | None = None,
        task_deadline_ms: int | None = None,
        concurrency_key: ExprLike = None,
        output_schema: Any = None,
        next: str | None = None,
        end: bool = False,
        description: str | None = None,
    ) -> Sequence:
        """Run a task in rounds until ``until`` (over ``result()``) holds.

        ``max_attempts`` is the per-round attempt budget; ``backoff`` the retry delays
        inside a round (a :class:`Retry` without ``max_attempts``).
        """
        task = _task_fields(queue, kind, payload, pipeline_version, priority, backoff,
                            retry_safe, task_deadline_ms, concurrency_key, output_schema)  # fmt: skip
        step: dict[str, Any] = {
            "id": _step_id(id),
            "type": "poll",
            "task": task,
            "until": expr_json(until),
            "max_rounds": max_rounds,
        }
        if max_attempts is not None:
            step["max_attempts"] = max_attempts
        if interval_ms is not None:
            step["interval_ms"] = interval_ms
        if deadline_ms is not None:
            step["deadline_ms"] = deadline_ms
        if on_exhausted is not None:
            step["on_exhausted"] = on_exhausted
        self._steps.append(_flow(step, next, end, description))
        return self

    def parallel(
        self, id: str, *, join: str | None = None, description: str | None = None
    ) -> Parallel:
        """Start branches together; the join step (``join``, default ``<id>_join``) is added
        right after. Fill branches with ``.branch()``; steps added to this sequence later
        come after the join."""
        p = Parallel(_step_id(id), join or f"{id}_join", description)
        self._steps.append(p)
        return p

    def join(
        self, id: str, *, parallel: str, next: str | None = None, end: bool = False
    ) -> Sequence:
        """An explicit join (only needed for raw parallels added with :meth:`add`)."""
        step = {"id": _step_id(id), "type": "join", "parallel": parallel}
        self._steps.append(_flow(step, next, end, None))
        return self

    def choice(
        self,
        id: str,
        cases: Iterable[_Case],
        *,
        default: str | None = None,
        description: str | None = None,
    ) -> Sequence:
        """Go to the first case whose condition holds, else ``default``."""
        step: dict[str, Any] = {
            "id": _step_id(id),
            "type": "choice",
            "cases": [{"when": expr_json(c.when), "next": c.next} for c in cases],
        }
        if default is not None:
            step["default"] = default
        if description is not None:
            step["description"] = description
        self._steps.append(step)
        return self

    def succeed(self, id: str, *, output: Any = None, description: str | None = None) -> Sequence:
        """End the instance successfully (top level only)."""
        step: dict[str, Any] = {"id": _step_id(id), "type": "succeed"}
        if output is not None:
            step["output"] = template_json(output)
        if description is not None:
            step["description"] = description
        self._steps.append(step)
        return self

    def fail(
        self, id: str, *, error: str, message: Any = None, description: str | None = None
    ) -> Sequence:
        """End the instance as FAILED with error code ``error``."""
        step: dict[str, Any] = {"id": _step_id(id), "type": "fail", "error": error}
        if message is not None:
            step["message"] = template_json(message)
        if description is not None:
            step["description"] = description
        self._steps.append(step)
        return self

    def steps_json(self) -> list[dict[str, Any]]:
        out: list[dict[str, Any]] = []
        for s in self._steps:
            if isinstance(s, Parallel):
                out.extend(s.to_json())
            else:
                out.append(s)
        return out


class Parallel:
    """A parallel step being built; ``branch()`` adds and returns a branch sequence."""

    def __init__(self, id: str, join: str, description: str | None) -> None:
        self.id = id
        self.join_id = join
        self.description = description
        self.join_next: str | None = None
        self.join_end = False
        self._branches: list[Sequence] = []

    def branch(self, name: str | None = None) -> Sequence:
        seq = Sequence(name)
        self._branches.append(seq)
        return seq

    def then(self, next: str | None = None, *, end: bool = False) -> Parallel:
        """Set where the join continues (default: the step added after the parallel)."""
        self.join_next, self.join_end = next, end
        return self

    def __enter__(self) -> Parallel:
        return self

    def __exit__(self, *exc: object) -> None:
        return None

    def to_json(self) -> list[dict[str, Any]]:
        branches = []
        for b in self._branches:
            item: dict[str, Any] = {}
            if b.name is not None:
                item["name"] = b.name
            item["steps"] = b.steps_json()
            branches.append(item)
        step: dict[str, Any] = {"id": self.id, "type": "parallel", "branches": branches}
        if self.description is not None:
            step["description"] = self.description
        join = _flow(
            {"id": self.join_id, "type": "join", "parallel": self.id},
            self.join_next,
            self.join_end,
            None,
        )
        return [step, join]


class Workflow(Sequence):
    """A whole definition: the top-level sequence plus ``input_schema`` and ``description``."""

    def __init__(self, *, description: str | None = None, input_schema: Any = None) -> None:
        super().__init__()
        self.description = description
        self.input_schema = input_schema

    def to_dict(self) -> dict[str, Any]:
        """The definition JSON object (the ``definition`` of a publish request)."""
        out: dict[str, Any] = {}
        if self.description is not None:
            out["description"] = self.description
        if self.input_schema is not None:
            out["input_schema"] = self.input_schema
        out["steps"] = self.steps_json()
        return out

    def to_json(self) -> str:
        """The definition as JSON text."""
        return json.dumps(self.to_dict(), separators=(",", ":"))
