"""Migration files: where the folder is, which files count, their checksums and statements.

A migration file is named ``NNNN_name.sql`` (digits, underscore, letters/digits/``_.-``) and
applied in numeric order. Other ``*.sql`` files (a schema snapshot, say) are ignored, but a
``.sql`` file that starts with a digit and does not match the pattern is an error, as are two
files with the same number: both are accidents that silently skipping would hide.

The default folder, first match wins:

1. ``$ORBIT_MIGRATIONS_DIR``;
2. the source tree's ``migrations/`` (a checkout or an editable install: the folder beside
   the ``orbit`` package, next to ``pyproject.toml``);
3. the installed copy ``<prefix>/share/orbit-server/migrations`` (``pyproject.toml`` ships
   ``migrations/*.sql`` there as data files), for ``sys.prefix`` and the user scheme.
"""

from __future__ import annotations

import hashlib
import os
import re
import sysconfig
from dataclasses import dataclass
from functools import cached_property
from pathlib import Path

from orbit.migrate.errors import MigrationsDirError
from orbit.migrate.sqlsplit import SqlSplitError, split_statements

ENV_MIGRATIONS_DIR = "ORBIT_MIGRATIONS_DIR"
INSTALLED_SUBDIR = Path("share") / "orbit-server" / "migrations"
NAME_RE = re.compile(r"^(\d+)_[A-Za-z0-9][A-Za-z0-9_.-]*\.sql$")
MAX_NAME = 255  # orbit_schema_migrations.name is VARCHAR(255)

_SOURCE_ROOT = Path(__file__).resolve().parent.parent.parent


def migrations_dir_candidates() -> list[Path]:
    """Where the default migrations folder is looked for, in order (see the module doc)."""
    out: list[Path] = []
    env = os.environ.get(ENV_MIGRATIONS_DIR)
    if env:
        out.append(Path(env))
    if (_SOURCE_ROOT / "pyproject.toml").is_file():
        out.append(_SOURCE_ROOT / "migrations")
    for scheme in (sysconfig.get_default_scheme(), sysconfig.get_preferred_scheme("user")):
        try:
            data = Path(sysconfig.get_path("data", scheme))
        except KeyError:  # pragma: no cover - exotic interpreter layouts
            continue
        if data / INSTALLED_SUBDIR not in out:
            out.append(data / INSTALLED_SUBDIR)
    return out


def default_migrations_dir() -> Path:
    """The first existing folder of :func:`migrations_dir_candidates`.

    Raises :class:`MigrationsDirError` listing every place tried when none exists.
    """
    candidates = migrations_dir_candidates()
    env = os.environ.get(ENV_MIGRATIONS_DIR)
    if env and not Path(env).is_dir():
        raise MigrationsDirError(f"${ENV_MIGRATIONS_DIR} is not a folder: {env}")
    for path in candidates:
        if path.is_dir():
            return path
    raise MigrationsDirError(
        "no migrations folder found; tried "
        + ", ".join(str(p) for p in candidates)
        + f" (pass --migrations-dir or set ${ENV_MIGRATIONS_DIR})"
    )


@dataclass(frozen=True)
class MigrationFile:
    """One migration file. ``checksum`` is the SHA-256 of its exact bytes."""

    name: str
    number: int
    path: Path
    data: bytes

    @cached_property
    def checksum(self) -> bytes:
        return hashlib.sha256(self.data).digest()

    @cached_property
    def statements(self) -> list[str]:
        """The file's statements (raises :class:`MigrationsDirError` on bad text)."""
        try:
            text = self.data.decode("utf-8")
        except UnicodeDecodeError as exc:
            raise MigrationsDirError(f"{self.name} is not UTF-8: {exc}") from None
        try:
            return split_statements(text)
        except SqlSplitError as exc:
            raise MigrationsDirError(f"{self.name}: {exc}") from None

    @cached_property
    def prefix_checksums(self) -> list[bytes]:
        """``prefix_checksums[k - 1]``: SHA-256 over the statements before statement ``k``.

        Each statement is hashed length-prefixed. Recorded with the progress/dirty mark so
        ``repair --resume`` can prove that the statements already applied are still the ones
        in the file.
        """
        h = hashlib.sha256()
        out = [h.digest()]
        for stmt in self.statements:
            raw = stmt.encode("utf-8")
            h.update(len(raw).to_bytes(8, "big"))
            h.update(raw)
            out.append(h.digest())
        return out

    def prefix_checksum(self, statement: int) -> bytes:
        """SHA-256 over the statements before ``statement`` (1-based; see above)."""
        return self.prefix_checksums[statement - 1]


def load_migrations(directory: Path) -> list[MigrationFile]:
    """The migration files of ``directory`` in apply order (by number).

    Raises :class:`MigrationsDirError` when the folder is missing, a digit-led ``.sql`` name
    is malformed or too long, or two files share a number.
    """
    if not directory.is_dir():
        raise MigrationsDirError(f"migrations folder not found: {directory}")
    files: list[MigrationFile] = []
    by_number: dict[int, str] = {}
    for path in sorted(directory.iterdir()):
        if path.suffix != ".sql" or not path.is_file() or not path.name[:1].isdigit():
            continue
        m = NAME_RE.match(path.name)
        if not m or len(path.name) > MAX_NAME:
            raise MigrationsDirError(
                f"bad migration file name {path.name!r}: expected NNNN_name.sql "
                f"(letters, digits, _ . -; at most {MAX_NAME} characters)"
            )
        number = int(m.group(1))
        if number in by_number:
            raise MigrationsDirError(
                f"two migration files share number {number}: {by_number[number]}, {path.name}"
            )
        by_number[number] = path.name
        files.append(MigrationFile(path.name, number, path, path.read_bytes()))
    files.sort(key=lambda f: (f.number, f.name))
    return files


def sort_key(name: str) -> tuple[int, str] | None:
    """The apply-order key of a migration file name, or None when it is not one."""
    m = NAME_RE.match(name)
    return (int(m.group(1)), name) if m else None
