"""Where a run's files go, and what they may contain.

* An unpublished run writes ``<stamp>-<name>.*`` under ``.orbit/bench/`` (ignored by git).
* ``--publish`` writes the latest report of each benchmark under its own name
  (``reports/bench/<name>.json`` / ``.md`` / ``-*.png``, profiles under
  ``reports/profiles/``) and appends one line of its figures to
  ``reports/bench/history.jsonl`` (append-only: one JSON object a run).
* Nothing written carries a machine path: :func:`scrub` turns absolute paths into paths
  relative to the repository or to the Python library they are in.
"""

from __future__ import annotations

import json
import re
import subprocess
from pathlib import Path
from typing import Any

from bench.env import ROOT

#: Roots of machine paths (where a checkout, a virtualenv, a home or a temp dir can be).
_ABS = re.compile(
    r"(?<![.:/-])/(?:work|root|home|tmp|usr|opt|var|etc|run|srv|mnt|proc|private|Users)"
    r"(?:/[\w.+@~-]+)+/?"
)
_LIB = re.compile(r"/(?:site-packages|dist-packages|lib/python3\.\d+)(?=/)")


def _relative(path: str, root: str) -> str:
    libs = list(_LIB.finditer(path))
    if libs:
        return path[libs[-1].end() + 1 :]
    if path in (root, root + "/"):
        return "."
    if path.startswith(root + "/"):
        return path[len(root) + 1 :]
    return path.rstrip("/").rsplit("/", 1)[-1]


def scrub(text: str, root: Path | str = ROOT) -> str:
    """``text`` with every absolute machine path replaced: inside ``root`` → relative to it;
    inside a Python library folder → relative to that folder; elsewhere → its last part."""
    base = str(root).rstrip("/")
    return _ABS.sub(lambda m: _relative(m.group(0), base), text)


def scrub_obj(obj: Any, root: Path | str = ROOT) -> Any:
    """:func:`scrub` on every string of a JSON-like value."""
    if isinstance(obj, str):
        return scrub(obj, root)
    if isinstance(obj, dict):
        return {k: scrub_obj(v, root) for k, v in obj.items()}
    if isinstance(obj, list | tuple):
        return [scrub_obj(v, root) for v in obj]
    return obj


def scrub_file(path: Path) -> None:
    """Rewrite a text file (a py-spy flame graph, a summary) without machine paths."""
    if path.exists():
        text = path.read_text(encoding="utf-8", errors="replace")
        path.write_text(scrub(text), encoding="utf-8")


def run_name(mode: str, only: list[str] | None) -> str:
    """What a run measures, as its published name: ``suite`` (full), ``quick``, or the
    steps of ``--only`` (``s1-s5``)."""
    if only:
        return "-".join(sorted(x.lower() for x in only))
    return "suite" if mode == "full" else mode


def commit(tree: Path | None = None) -> str | None:
    """The short commit id of ``tree`` (this checkout by default), ``+`` when it has changes."""
    where = str(tree or ROOT)
    try:
        rev = subprocess.run(["git", "-C", where, "rev-parse", "--short", "HEAD"],
                             capture_output=True, text=True, timeout=10)  # fmt: skip
        if rev.returncode != 0:
            return None
        dirty = subprocess.run(["git", "-C", where, "status", "--porcelain", "--untracked-files=no"],
                               capture_output=True, text=True, timeout=10)  # fmt: skip
        return rev.stdout.strip() + ("+" if dirty.stdout.strip() else "")
    except (OSError, subprocess.TimeoutExpired):
        return None


#: The figures a history line keeps besides the ratios (path in ``raw`` -> name).
HISTORY_FIGURES = {
    ("s1", "tasks_per_s"): "s1_per_s",
    ("s1", "completed_per_s"): "s1_completed_per_s",
    ("s1_baseline", "tasks_per_s"): "s1_baseline_per_s",
    ("peers", "pgqueuer", "throughput", "per_s"): "pgqueuer_per_s",
    ("db_limit", "batched", "per_s"): "db_batched_per_s",
    ("s3", "single", "per_s"): "s3_single_per_s",
    ("s3", "batch", "per_s"): "s3_batch_per_s",
    ("s5", "owners_1", "tasks_per_s"): "s5_1_owner_per_s",
    ("s5", "owners_100", "tasks_per_s"): "s5_100_owners_per_s",
}


def _get(d: Any, path: tuple[str, ...]) -> Any:
    for p in path:
        if not isinstance(d, dict):
            return None
        d = d.get(p)
    return d


def history_line(out: dict[str, Any], name: str) -> dict[str, Any]:
    """One run as a history line: when, what, on which code and machine state, its ratios
    and its key figures (numbers only; None where not measured)."""
    raw = out.get("raw") or {}
    machine = out.get("machine") or {}
    figures = {key: _get(raw, path) for path, key in HISTORY_FIGURES.items()}
    return {
        "at": out.get("started_at"),
        "name": name,
        "mode": out.get("mode"),
        "commit": out.get("commit"),
        "database": (out.get("database") or {}).get("kind"),
        "load": [
            (machine.get("load_avg") or [None])[0],
            (machine.get("load_avg_end") or [None])[0],
        ],
        "ratios": out.get("ratios") or {},
        "figures": {k: v for k, v in figures.items() if v is not None},
    }


def append_history(path: Path, line: dict[str, Any]) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("a", encoding="utf-8") as f:
        f.write(json.dumps(line, sort_keys=False, default=str) + "\n")
