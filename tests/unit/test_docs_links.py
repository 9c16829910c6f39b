"""The documentation stands on its own: every relative link in the Markdown pages and every
``docs/<page>.md#<anchor>`` cited from code, tests or docs points at a file and heading that
exist, and nothing refers to material outside the repository."""

from __future__ import annotations

import re
from functools import cache
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
SKIP_DIRS = {".git", ".venv", ".orbit", "node_modules", "build", "__pycache__"}
#: Landed migrations are immutable (docs/migrations.md), even their comments.
IMMUTABLE = {"migrations"}
#: Benchmark output, written by the bench suite.
OTHER_REPORTS = {("reports", "bench"), ("reports", "profiles")}

_LINK = re.compile(r"(?<!!)\[[^\]]*\]\(([^)\s]+)\)")
_CITED = re.compile(r"(?<![\w/.-])(docs/[\w./-]+\.md)(?:#([\w-]+))?")
_HEADING = re.compile(r"^#{1,6}\s+(.*?)\s*#*\s*$")
_FENCE = re.compile(r"^\s*(```|~~~)")
#: Pieces joined at run time so this file does not match its own check.
_OUTSIDE = re.compile(
    "|".join(
        [
            re.escape("../" + "shared"),
            r"\bAPI" + r"\.md\b",
            r"\bSPEC" + r"(\.md|\s*§)",
            r"MYSQL" + "-NOTES",
            r"\bSTYLE" + r"\.md\b",
        ]
    )
)


def _files(*suffixes: str) -> list[Path]:
    out = []
    for path in ROOT.rglob("*"):
        rel = path.relative_to(ROOT)
        if set(rel.parts) & SKIP_DIRS or not path.is_file():
            continue
        if path.suffix in suffixes:
            out.append(path)
    return sorted(out)


def _slug(heading: str) -> str:
    """GitHub's anchor for a heading: lower case, punctuation dropped, spaces to hyphens."""
    text = re.sub(r"`([^`]*)`", r"\1", heading)
    text = re.sub(r"\[([^\]]*)\]\([^)]*\)", r"\1", text)
    text = text.strip().lower()
    text = re.sub(r"[^\w\- ]", "", text)
    return text.replace(" ", "-")


@cache
def _anchors(path: Path) -> frozenset[str]:
    seen: dict[str, int] = {}
    anchors: set[str] = set()
    fenced = False
    for line in path.read_text(encoding="utf-8").splitlines():
        if _FENCE.match(line):
            fenced = not fenced
            continue
        m = None if fenced else _HEADING.match(line)
        if m:
            slug = _slug(m.group(1))
            n = seen.get(slug, 0)
            seen[slug] = n + 1
            anchors.add(slug if n == 0 else f"{slug}-{n}")
        anchors.update(re.findall(r'<a (?:id|name)="([^"]+)"', line))
    return frozenset(anchors)


def _check(target: Path, anchor: str | None, where: str, problems: list[str]) -> None:
    if not target.exists():
        problems.append(f"{where}: {target.relative_to(ROOT)} does not exist")
    elif anchor and target.suffix == ".md" and anchor not in _anchors(target):
        problems.append(f"{where}: no heading #{anchor} in {target.relative_to(ROOT)}")


def test_relative_links_in_markdown_resolve() -> None:
    problems: list[str] = []
    for page in _files(".md"):
        rel = page.relative_to(ROOT)
        if rel.parts[0] == "reports" and len(rel.parts) > 2:
            continue  # generated run reports link to files of their own run
        fenced = False
        for no, line in enumerate(page.read_text(encoding="utf-8").splitlines(), 1):
            if _FENCE.match(line):
                fenced = not fenced
            if fenced:
                continue
            for href in _LINK.findall(line):
                if re.match(r"^[a-z][a-z0-9+.-]*:", href) or href.startswith("/"):
                    continue  # absolute URLs and server paths
                file, _, anchor = href.partition("#")
                target = (page.parent / file).resolve() if file else page
                _check(target, anchor or None, f"{rel}:{no}", problems)
    assert not problems, "\n".join(problems)


def test_cited_docs_pages_and_anchors_exist() -> None:
    problems: list[str] = []
    for path in _files(".py", ".md", ".sql", ".js", ".toml"):
        rel = path.relative_to(ROOT)
        if rel.parts[0] in IMMUTABLE or rel.parts[0] == "reports":
            continue
        for no, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1):
            for page, anchor in _CITED.findall(line):
                _check(ROOT / page, anchor or None, f"{rel}:{no}", problems)
    assert not problems, "\n".join(problems)


def test_nothing_refers_to_material_outside_the_repository() -> None:
    problems: list[str] = []
    for path in _files(".py", ".md", ".sql", ".js", ".html", ".toml", ".txt", ".json"):
        rel = path.relative_to(ROOT)
        if rel.parts[0] in IMMUTABLE | {"bench"} or rel.parts[:2] in OTHER_REPORTS:
            continue
        for no, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1):
            if _OUTSIDE.search(line):
                problems.append(f"{rel}:{no}: {line.strip()[:100]}")
    assert not problems, "\n".join(problems)
