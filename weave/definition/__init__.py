"""The workflow definition language: parse, validate, compile to the model the engine walks.

    from weave.definition import compile_definition, validate_definition

    d = compile_definition(raw_json_bytes)      # Definition, or raises DefinitionError
    problems = validate_definition(doc)         # [] when valid

See docs/workflows.md for the language and :mod:`weave.definition.model` for the model.
"""

from __future__ import annotations

from typing import Any

import msgspec

from orbit.ids import digest
from weave.definition import jsonvalue
from weave.definition.model import LANGUAGE_VERSION, Definition
from weave.definition.parser import Draft, parse_definition
from weave.definition.problems import Problem, Rule
from weave.definition.validator import document_order, validate_draft


class DefinitionError(ValueError):
    """The definition broke at least one rule; ``problems`` lists every one found."""

    def __init__(self, problems: list[Problem]) -> None:
        first = problems[0]
        where = f"step {first.step!r}: " if first.step else ""
        super().__init__(f"{where}{first.reason}")
        self.problems = problems


def _decode(source: bytes | str | Any) -> Any:
    if isinstance(source, bytes | bytearray | memoryview | str):
        try:
            return jsonvalue.decode(bytes(source) if not isinstance(source, str) else source)
        except (msgspec.DecodeError, RecursionError) as exc:
            raise DefinitionError(
                [Problem(None, f"not valid JSON: {exc}", Rule.SCHEMA, None)]
            ) from None
    return source


def check(source: bytes | str | Any) -> tuple[Draft, list[Problem], dict[str, frozenset[str]]]:
    """Parse and validate; return the draft, every problem, and the available outputs."""
    doc = _decode(source)
    draft = parse_definition(doc)
    if draft.problems or draft.root is None:
        return draft, draft.problems, {}
    problems, available = validate_draft(draft)
    return draft, problems, available


def validate_definition(source: bytes | str | Any) -> list[Problem]:
    """Every problem of a definition (JSON text or decoded value); [] when it is valid."""
    try:
        return check(source)[1]
    except DefinitionError as exc:
        return exc.problems


def compile_definition(source: bytes | str | Any) -> Definition:
    """Parse and validate a definition into the immutable :class:`Definition`.

    Raises :class:`DefinitionError` with every problem found. Compiling the stored text of a
    published version always succeeds (versions are validated before they are stored), so
    the engine may cache the result per (namespace, definition, version).
    """
    draft, problems, available = check(source)
    if problems:
        raise DefinitionError(problems)
    assert draft.root is not None
    order = document_order(draft)
    return Definition(
        root=draft.root,
        steps={sid: draft.steps[sid] for sid in order},
        sequences=dict(draft.sequences),
        input_type=draft.input_type,
        description=draft.description,
        language_version=LANGUAGE_VERSION,
        available=available,
    )


def definition_digest(source: bytes | str | Any) -> bytes:
    """SHA-256 of the canonical JSON form (keys sorted, compact, numbers as written)."""
    return digest(jsonvalue.canonical(_decode(source)))


__all__ = [
    "LANGUAGE_VERSION",
    "Definition",
    "DefinitionError",
    "Problem",
    "Rule",
    "check",
    "compile_definition",
    "definition_digest",
    "validate_definition",
]
