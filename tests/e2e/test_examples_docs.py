"""The documentation map and the examples hang together: docs/index.md lists every page,
relative links resolve, every example has a README and a test that runs it."""

from __future__ import annotations

import re
from pathlib import Path

from platform_fixtures import ROOT

DOCS = ROOT / "docs"
LINK = re.compile(r"\]\(([^)#\s]+)(?:#[^)]*)?\)")
TASK_STATES = ("WAITING", "LEASED", "RUNNING", "SUCCEEDED", "FAILED", "CANCELLED", "NEEDS_REVIEW")


def pages() -> list[Path]:
    return sorted([*DOCS.glob("*.md"), *DOCS.glob("*.json"), *(DOCS / "api").glob("*.md")])


def test_index_lists_every_page() -> None:
    index = (DOCS / "index.md").read_text()
    linked = {m.group(1) for m in LINK.finditer(index)}
    missing = [
        str(p.relative_to(DOCS)) for p in pages()
        if p.name != "index.md" and str(p.relative_to(DOCS)) not in linked
    ]  # fmt: skip
    assert missing == [], "add these to docs/index.md"


def test_relative_links_resolve() -> None:
    files = [*pages(), *DOCS.glob("examples/*/README.md")]
    broken = []
    for f in files:
        if f.suffix != ".md":
            continue
        for m in LINK.finditer(f.read_text()):
            target = m.group(1)
            if re.match(r"^[a-z]+:", target):
                continue  # http(s), mailto
            if not (f.parent / target).exists():
                broken.append(f"{f.relative_to(ROOT)} -> {target}")
    assert broken == []


def test_every_example_has_a_readme_and_a_test() -> None:
    tests = "\n".join(p.read_text() for p in (ROOT / "tests" / "e2e").glob("test_*.py"))
    for example in sorted(p for p in (DOCS / "examples").iterdir() if p.is_dir()):
        assert (example / "README.md").is_file(), example
        assert f'"{example.name}"' in tests or f"examples/{example.name}" in tests, example


def test_concepts_draws_the_task_state_machine() -> None:
    text = (DOCS / "concepts.md").read_text()
    blocks = re.findall(r"```mermaid\n(.*?)```", text, re.S)
    machine = next(b for b in blocks if "NEEDS_REVIEW --> " in b)
    assert all(state in machine for state in TASK_STATES)
    assert len(blocks) >= 5
