"""A query name means one statement in its package: two ``-- name:`` blocks of the same name
in two SQL files of a package drift apart (one copy of an OFFERED → RELEASED update lost its
revision guard that way), so every name is defined once per package."""

from __future__ import annotations

from pathlib import Path

import pytest

from orbit.storage.sqlfile import parse_queries

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.parametrize("package", ["orbit", "pulse", "weave"])
def test_query_names_are_defined_once_per_package(package: str) -> None:
    where: dict[str, list[str]] = {}
    for path in sorted((ROOT / package / "sql").glob("*.sql")):
        for name in parse_queries(path.read_text(), str(path)):
            where.setdefault(name, []).append(path.name)
    twice = {name: files for name, files in where.items() if len(files) > 1}
    assert not twice, f"query names defined in more than one file of {package}/sql: {twice}"


def test_the_offer_release_is_guarded_by_its_revision() -> None:
    sql = parse_queries((ROOT / "pulse" / "sql" / "attempts.sql").read_text())
    assert "revision = %(revision)s" in sql.attempt_release_if_offered
