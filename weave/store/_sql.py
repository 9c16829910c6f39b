"""Loading the engine's SQL files: ``{cols}`` in a query stands for the file's ``*_columns``
block (as in Pulse's stores), expanded once at import."""

from __future__ import annotations

from typing import Any, TypeVar

import msgspec

from orbit.storage import Queries, load_queries

T = TypeVar("T")


def queries(package_file: str, name: str, cols_block: str) -> Queries:
    """``sql/<name>.sql`` with ``{cols}`` replaced by the ``cols_block`` query's text."""
    raw = load_queries(package_file, name)
    cols = raw[cols_block]
    return Queries({k: v.replace("{cols}", cols) for k, v in raw.items() if k != cols_block})


def one(row: dict[str, Any] | None, type_: type[T]) -> T | None:
    """A row as its Struct, or None."""
    return None if row is None else msgspec.convert(row, type_)


def many(rows: list[dict[str, Any]], type_: type[T]) -> list[T]:
    return [msgspec.convert(r, type_) for r in rows]
