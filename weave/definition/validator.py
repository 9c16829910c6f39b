"""Graph and type rules over a structurally valid draft (pure functions, no I/O).

Rules, in the order they are checked (later ones need the earlier ones to hold):

1. References: every ``next``/``on_failure``/``on_timeout``/``on_exhausted``/case/default names
   an existing step of the *same sequence* (no jumps into or out of a parallel branch), and no
   step jumps or falls through into a join.
2. Structure: a parallel is immediately followed by the one join that names it; a join
   immediately follows the parallel it names; ``succeed`` only at the top level.
3. No cycles (loops exist only inside a poll step).
4. Every step is reachable from the start (a join is reached only when every branch of its
   parallel can end), and an end is reachable from every step.
5. Expressions type-check, and a path ``$.steps.<id>...`` only reads a step that has completed
   on every path from the start to the reading step (after a join: every branch's steps that
   complete on every path through their branch).
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass, field

from weave.definition.expressions import (
    ExprError,
    Template,
    TypeEnv,
    expect_type,
    template_type,
    type_of,
)
from weave.definition.model import (
    ChoiceStep,
    EdgeKind,
    FailStep,
    JoinStep,
    ParallelStep,
    PollStep,
    SleepStep,
    Step,
    SucceedStep,
    TaskSpec,
    TaskStep,
    WaitSignalStep,
    step_edges,
)
from weave.definition.parser import Draft
from weave.definition.problems import Problem, Rule
from weave.definition.valuetypes import BOOL, JSON, Kind, VType

_END = "#end:"  # prefix of end-of-sequence nodes (step ids cannot contain '#')
_OK_EDGES = {EdgeKind.NEXT, EdgeKind.CASE, EdgeKind.DEFAULT, EdgeKind.BRANCH}


class UnavailableOutput(ExprError):
    """A path reads a step output that is not available at this point."""


def end_node(seq_key: str) -> str:
    return _END + seq_key


def document_order(d: Draft) -> list[str]:
    """Step ids depth first, a parallel before its branches' steps."""
    out: list[str] = []

    def walk(key: str) -> None:
        for sid in d.sequences[key].step_ids:
            out.append(sid)
            s = d.steps.get(sid)
            if isinstance(s, ParallelStep):
                for b in s.branches:
                    walk(b.ref.key)

    if d.root is not None:
        walk(d.root.ref.key)
    return out


def _refs(s: Step, loc: str, explicit_next: bool) -> Iterator[tuple[str, str, str]]:
    """(target, field location, what) of every explicit reference of a step."""
    if explicit_next and s.next is not None:
        yield s.next, f"{loc}.next", "next"
    if isinstance(s, TaskStep) and s.on_failure is not None:
        yield s.on_failure, f"{loc}.on_failure", "on_failure"
    if isinstance(s, WaitSignalStep) and s.on_timeout is not None:
        yield s.on_timeout, f"{loc}.on_timeout", "on_timeout"
    if isinstance(s, PollStep) and s.on_exhausted is not None:
        yield s.on_exhausted, f"{loc}.on_exhausted", "on_exhausted"
    if isinstance(s, ChoiceStep):
        for i, c in enumerate(s.cases):
            yield c.next, f"{loc}.cases[{i}].next", f"cases[{i}].next"
        if s.default is not None:
            yield s.default, f"{loc}.default", "default"


def check_references(d: Draft, problems: list[Problem]) -> None:
    """Rule 1."""
    for sid in document_order(d):
        s = d.steps[sid]
        loc = d.locations[sid]
        for target, where, what in _refs(s, loc, sid in d.explicit_next):
            t = d.steps.get(target)
            if t is None:
                problems.append(
                    Problem(
                        sid, f"{what} names no step: {target!r}", Rule.DANGLING_REFERENCE, where
                    )
                )
            elif t.seq != s.seq:
                problems.append(
                    Problem(
                        sid,
                        f"{what} jumps from the {s.seq} to {target!r} in the {t.seq}: "
                        "a step may only jump within its own sequence",
                        Rule.CROSS_SEQUENCE_JUMP,
                        where,
                    )
                )
            elif isinstance(t, JoinStep):
                problems.append(
                    Problem(
                        sid,
                        f"{what} jumps into join {target!r}: only its parallel enters a join",
                        Rule.UNSTRUCTURED_JOIN,
                        where,
                    )
                )
        if (
            sid not in d.explicit_next
            and s.next is not None
            and isinstance(d.steps.get(s.next), JoinStep)
        ):
            problems.append(
                Problem(
                    sid,
                    f"falls through into join {s.next!r}: only its parallel enters a join "
                    "(end the branch or jump elsewhere)",
                    Rule.UNSTRUCTURED_JOIN,
                    f"{loc}",
                )
            )


def check_structure(d: Draft, problems: list[Problem]) -> None:
    """Rule 2."""
    for sid in document_order(d):
        s = d.steps[sid]
        ids = d.sequences[s.seq.key].step_ids
        loc = d.locations[sid]
        if isinstance(s, ParallelStep):
            j = d.steps.get(ids[s.index + 1]) if s.index + 1 < len(ids) else None
            if not (isinstance(j, JoinStep) and j.parallel == sid):
                problems.append(
                    Problem(
                        sid,
                        "a parallel must be immediately followed by the join that closes it "
                        f'({{"type": "join", "parallel": "{sid}"}})',
                        Rule.UNSTRUCTURED_JOIN,
                        loc,
                    )
                )
        elif isinstance(s, JoinStep):
            p = d.steps.get(s.parallel)
            if p is None:
                problems.append(
                    Problem(
                        sid,
                        f"parallel names no step: {s.parallel!r}",
                        Rule.DANGLING_REFERENCE,
                        f"{loc}.parallel",
                    )
                )
            elif not isinstance(p, ParallelStep):
                problems.append(
                    Problem(
                        sid,
                        f"{s.parallel!r} is a {p.type.value} step, not a parallel",
                        Rule.UNSTRUCTURED_JOIN,
                        f"{loc}.parallel",
                    )
                )
            elif p.seq != s.seq or s.index == 0 or ids[s.index - 1] != s.parallel:
                problems.append(
                    Problem(
                        sid,
                        f"a join must immediately follow the parallel it closes ({s.parallel!r}) "
                        "in the same sequence, and each parallel has exactly one join",
                        Rule.UNSTRUCTURED_JOIN,
                        loc,
                    )
                )
        elif isinstance(s, SucceedStep) and s.seq.parallel is not None:
            problems.append(
                Problem(
                    sid,
                    "succeed ends the whole instance and is only allowed at the top level: "
                    "a branch ends when it reaches its last step",
                    Rule.MISPLACED_STEP,
                    loc,
                )
            )


@dataclass
class Graph:
    """Control-flow graph: step nodes plus one end node per sequence.

    Edges: each step's edges (a None target goes to its sequence's end node); a branch's end
    node → its parallel's join; and an ordering-only edge parallel → join.
    """

    d: Draft
    succ: dict[str, list[tuple[str, EdgeKind | None]]] = field(default_factory=dict)
    pred: dict[str, list[tuple[str, EdgeKind | None]]] = field(default_factory=dict)

    def __post_init__(self) -> None:
        d = self.d
        for key in d.sequences:
            self._node(end_node(key))
        for sid in document_order(d):
            self._node(sid)
        for sid in document_order(d):
            s = d.steps[sid]
            for kind, target in step_edges(s):
                self._edge(sid, target if target is not None else end_node(s.seq.key), kind)
            if isinstance(s, ParallelStep):
                for b in s.branches:
                    self._edge(end_node(b.ref.key), s.join, None)
                self._edge(sid, s.join, None)

    def _node(self, n: str) -> None:
        self.succ.setdefault(n, [])
        self.pred.setdefault(n, [])

    def _edge(self, a: str, b: str, kind: EdgeKind | None) -> None:
        self.succ[a].append((b, kind))
        self.pred[b].append((a, kind))

    def topo_order(self, problems: list[Problem]) -> list[str] | None:
        """Nodes in topological order, or None after reporting each cycle found (rule 3)."""
        WHITE, GREY, BLACK = 0, 1, 2
        color = dict.fromkeys(self.succ, WHITE)
        post: list[str] = []
        cyclic = False
        roots = [self.d.root.step_ids[0]] if self.d.root and self.d.root.step_ids else []
        roots += [n for n in self.succ if n not in roots]
        for root in roots:
            if color[root] != WHITE:
                continue
            stack: list[tuple[str, int]] = [(root, 0)]
            path: list[str] = [root]
            color[root] = GREY
            while stack:
                node, i = stack[-1]
                edges = self.succ[node]
                if i < len(edges):
                    stack[-1] = (node, i + 1)
                    nxt = edges[i][0]
                    if color[nxt] == WHITE:
                        color[nxt] = GREY
                        stack.append((nxt, 0))
                        path.append(nxt)
                    elif color[nxt] == GREY:
                        cyclic = True
                        loop = [*path[path.index(nxt) :], nxt]
                        shown = " -> ".join(n for n in loop if not n.startswith(_END))
                        src = node if not node.startswith(_END) else nxt
                        problems.append(
                            Problem(
                                src,
                                f"cycle {shown}: loops are only allowed inside a poll step",
                                Rule.CYCLE,
                                self.d.locations.get(src),
                            )
                        )
                else:
                    color[node] = BLACK
                    post.append(node)
                    stack.pop()
                    path.pop()
        if cyclic:
            return None
        return post[::-1]

    def reachability(self, order: list[str]) -> dict[str, bool]:
        """Rule 4, forward half: which nodes the start reaches (joins need every branch)."""
        d = self.d
        start = d.root.step_ids[0] if d.root and d.root.step_ids else None
        reach = dict.fromkeys(order, False)
        for n in order:
            s = d.steps.get(n)
            if n == start:
                reach[n] = True
            elif isinstance(s, JoinStep):
                p = d.steps[s.parallel]
                assert isinstance(p, ParallelStep)
                reach[n] = reach[p.id] and all(reach[end_node(b.ref.key)] for b in p.branches)
            else:
                reach[n] = any(reach[src] for src, kind in self.pred[n] if kind is not None)
        return reach

    def can_end(self, order: list[str]) -> dict[str, bool]:
        """Rule 4, backward half: from which nodes an end is reachable."""
        d = self.d
        ok: dict[str, bool] = {}
        for n in reversed(order):
            s = d.steps.get(n)
            if n.startswith(_END) or isinstance(s, SucceedStep | FailStep):
                ok[n] = True
            elif isinstance(s, ParallelStep):
                ok[n] = all(ok[b.step_ids[0]] for b in s.branches if b.step_ids)
            else:
                ok[n] = any(ok[t] for t, kind in self.succ[n] if kind is not None)
        return ok

    def availability(self, order: list[str], reach: dict[str, bool]) -> dict[str, dict[str, bool]]:
        """Rule 5's data flow: for each reachable node, the steps completed on every path to
        it, mapped to True when they surely succeeded (output non-null) or False when they
        may have ended another way (failure, timeout, exhaustion: output nullable)."""
        d = self.d
        avail: dict[str, dict[str, bool]] = {}
        for n in order:
            if not reach.get(n):
                continue
            s = d.steps.get(n)
            if isinstance(s, JoinStep):
                p = d.steps[s.parallel]
                assert isinstance(p, ParallelStep)
                merged = dict(avail[p.id])
                merged[p.id] = True
                for b in p.branches:
                    merged.update(avail.get(end_node(b.ref.key), {}))
                avail[n] = merged
                continue
            incoming: list[dict[str, bool]] = []
            for src, kind in self.pred[n]:
                if kind is None or not reach.get(src):
                    continue
                out = dict(avail[src])
                out[src] = kind in _OK_EDGES
                incoming.append(out)
            if not incoming:
                avail[n] = {}
                continue
            first, *rest = incoming
            avail[n] = {
                k: v and all(m.get(k, False) for m in rest)
                for k, v in first.items()
                if all(k in m for m in rest)
            }
        return avail


def _env(d: Draft, avail: dict[str, bool], result: VType | None = None) -> TypeEnv:
    def step_type(step_id: str, part: str) -> VType:
        s = d.steps.get(step_id)
        if s is None:
            raise UnavailableOutput(f"$.steps.{step_id}: no step {step_id!r}")
        if step_id not in avail:
            raise UnavailableOutput(
                f"$.steps.{step_id}: step {step_id!r} has not surely completed here "
                "(it is not on every path from the start to this step)"
            )
        if part == "error":
            return JSON
        t = s.output_type()
        if t is None:
            raise UnavailableOutput(
                f"$.steps.{step_id}.output: a {s.type.value} step has no output"
            )
        return t if avail[step_id] else t.as_nullable()

    return TypeEnv(input_type=d.input_type, step_type=step_type, result_type=result)


def _type_problem(sid: str, loc: str, name: str, exc: ExprError) -> Problem:
    rule = Rule.UNAVAILABLE_OUTPUT if isinstance(exc, UnavailableOutput) else Rule.TYPE_ERROR
    return Problem(sid, f"{name}: {exc.reason}", rule, f"{loc}.{name}{exc.where}")


def _check_task_spec(
    spec: TaskSpec, env: TypeEnv, sid: str, loc: str, problems: list[Problem]
) -> None:
    _check_template(spec.payload, env, sid, loc, "payload", problems)
    if spec.concurrency_key is not None:
        try:
            expect_type(spec.concurrency_key, env, (Kind.STRING,))
        except ExprError as exc:
            problems.append(_type_problem(sid, loc, "concurrency_key", exc))


def _check_template(
    t: Template | None, env: TypeEnv, sid: str, loc: str, name: str, problems: list[Problem]
) -> None:
    if t is None:
        return
    try:
        template_type(t, env)
    except ExprError as exc:
        problems.append(_type_problem(sid, loc, name, exc))


def check_types(d: Draft, avail: dict[str, dict[str, bool]], problems: list[Problem]) -> None:
    """Rule 5 on every expression site."""
    for sid in document_order(d):
        if sid not in avail:
            continue
        s = d.steps[sid]
        loc = d.locations[sid]
        env = _env(d, avail[sid])
        try:
            if isinstance(s, TaskStep):
                _check_task_spec(s.task, env, sid, loc, problems)
            elif isinstance(s, PollStep):
                _check_task_spec(s.task, env, sid, f"{loc}.task", problems)
                try:
                    expect_type(s.until, _env(d, avail[sid], s.task.output_type), BOOL)
                except ExprError as exc:
                    problems.append(_type_problem(sid, loc, "until", exc))
            elif isinstance(s, WaitSignalStep) and s.correlation_key is not None:
                try:
                    expect_type(s.correlation_key, env, (Kind.STRING,))
                except ExprError as exc:
                    problems.append(_type_problem(sid, loc, "correlation_key", exc))
            elif isinstance(s, SleepStep) and s.until is not None:
                try:
                    expect_type(s.until, env, (Kind.STRING,))
                except ExprError as exc:
                    problems.append(_type_problem(sid, loc, "until", exc))
            elif isinstance(s, ChoiceStep):
                for i, c in enumerate(s.cases):
                    try:
                        expect_type(c.when, env, BOOL)
                    except ExprError as exc:
                        problems.append(_type_problem(sid, loc, f"cases[{i}].when", exc))
            elif isinstance(s, SucceedStep):
                _check_template(s.output, env, sid, loc, "output", problems)
            elif isinstance(s, FailStep):
                _check_template(s.message, env, sid, loc, "message", problems)
        except ExprError as exc:  # pragma: no cover - every site catches its own
            problems.append(_type_problem(sid, loc, "expression", exc))


def validate_draft(d: Draft) -> tuple[list[Problem], dict[str, frozenset[str]]]:
    """Run rules 1–5; return the problems (document order) and, when there are none, each
    step's available outputs."""
    problems: list[Problem] = []
    check_references(d, problems)
    check_structure(d, problems)
    if problems:
        return problems, {}
    g = Graph(d)
    order = g.topo_order(problems)
    if order is None:
        return problems, {}
    reach = g.reachability(order)
    for sid in document_order(d):
        if not reach[sid]:
            problems.append(
                Problem(sid, _unreachable_reason(d, sid, reach), Rule.UNREACHABLE, d.locations[sid])
            )
    ends = g.can_end(order)
    for sid in document_order(d):
        if reach[sid] and not ends[sid]:  # pragma: no cover - impossible without cycles
            problems.append(
                Problem(sid, "no end is reachable from this step", Rule.NO_END, d.locations[sid])
            )
    if problems:
        return problems, {}
    avail = g.availability(order, reach)
    check_types(d, avail, problems)
    return problems, {sid: frozenset(avail.get(sid, {})) for sid in d.steps}


def _unreachable_reason(d: Draft, sid: str, reach: dict[str, bool]) -> str:
    s = d.steps[sid]
    if isinstance(s, JoinStep):
        p = d.steps[s.parallel]
        assert isinstance(p, ParallelStep)
        if reach[p.id]:
            stuck = [str(b.ref.branch) for b in p.branches if not reach[end_node(b.ref.key)]]
            return (
                f"join never runs: branch {', '.join(stuck)} of {p.id!r} never ends "
                "(every path through it ends in fail)"
            )
    return "unreachable: no path from the start reaches this step"


# Keep type_of importable from here for callers that check single expressions.
__all__ = [
    "Graph",
    "UnavailableOutput",
    "check_types",
    "document_order",
    "type_of",
    "validate_draft",
]
