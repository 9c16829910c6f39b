"""The documentation keeps up with the code: every migration is described in the schema
page, only the roadmap says something is not built yet, and no page repeats a heading (a
repeated heading is usually a paste, and its second anchor is not the one readers expect)."""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
DOCS = [*sorted((ROOT / "docs").rglob("*.md")), ROOT / "README.md", ROOT / "CONTRIBUTING.md"]
_FENCE = re.compile(r"^\s*(```|~~~)")
_HEADING = re.compile(r"^#{1,6}\s+(.*?)\s*#*\s*$")
#: Words by which a page says a feature is missing; that belongs on the roadmap.
_NOT_BUILT = re.compile(r"\bnot (?:implemented|served|supported) yet\b|\bnot yet implemented\b")


def _prose(path: Path) -> str:
    """The page's text outside code fences, with line breaks as spaces."""
    lines, fenced = [], False
    for line in path.read_text(encoding="utf-8").splitlines():
        if _FENCE.match(line):
            fenced = not fenced
        elif not fenced:
            lines.append(line.strip())
    return " ".join(lines)


def test_the_schema_page_names_every_migration() -> None:
    schema = (ROOT / "docs" / "schema.md").read_text(encoding="utf-8")
    missing = [m.name for m in sorted((ROOT / "migrations").glob("*.sql")) if m.name not in schema]
    assert not missing, f"docs/schema.md does not describe {missing}"


def test_only_the_roadmap_says_a_feature_is_not_built_yet() -> None:
    allowed = {ROOT / "docs" / "roadmap.md", ROOT / "docs" / "api" / "conventions.md"}
    found = [
        f"{path.relative_to(ROOT)}: …{m.group(0)}…"
        for path in DOCS
        if path not in allowed
        for m in _NOT_BUILT.finditer(_prose(path))
    ]
    assert not found, found


def test_no_page_repeats_a_heading() -> None:
    repeated = []
    for path in DOCS:
        seen: set[str] = set()
        fenced = False
        for line in path.read_text(encoding="utf-8").splitlines():
            if _FENCE.match(line):
                fenced = not fenced
                continue
            m = None if fenced else _HEADING.match(line)
            if m:
                key = m.group(1).strip().lower()
                if key in seen:
                    repeated.append(f"{path.relative_to(ROOT)}: {m.group(1)}")
                seen.add(key)
    assert not repeated, repeated
