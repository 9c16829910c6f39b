"""The driver seam: which asyncio MySQL driver the pool uses (``ORBIT_DB_DRIVER``).

:class:`~orbit.storage.db.Database` and :class:`~orbit.storage.db.Tx` are the same whatever
the driver; each driver module (``_aiomysql.py``, ``_asyncmy.py``) only opens a pool with the
session contract Orbit relies on:

- ``autocommit`` off (every statement runs in the caller's transaction), except in the pool
  :meth:`Database.read` uses (``PoolOptions.autocommit``): there each statement is its own
  transaction, so a read ends without a ROLLBACK;
- ``CLIENT.FOUND_ROWS``: an UPDATE reports *matched* rows, which :meth:`Tx.cas` and every
  guarded UPDATE's affected-row check rely on;
- ``CLIENT.MULTI_STATEMENTS`` for :meth:`Tx.execute_batch` (one round trip);
- ``utf8mb4``, dict rows, client-side parameter binding (``%s``) with ``bytes`` sent as
  ``_binary'...'`` (BINARY(16) ids), DATETIME(6) round trips with microseconds;
- errors as the driver's ``(errno, message)`` exceptions.

A driver's exceptions are first read as PyMySQL's classes (:func:`as_pymysql`), then leave
the storage layer as the project's own errors (:mod:`orbit.storage.errors`: check violation,
duplicate key, lock conflict, connection lost or refused…), whatever the driver: no code
above ``orbit/storage`` imports or catches a driver's exception.

``aiomysql`` (pure-Python PyMySQL protocol) is the default; ``asyncmy`` (Cython) is optional:
``pip install asyncmy`` and ``ORBIT_DB_DRIVER=asyncmy``. See docs/performance.md
"Driver trial" for the measurements.
"""

from __future__ import annotations

import importlib
import os
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

DRIVER_ENV = "ORBIT_DB_DRIVER"
DEFAULT_DRIVER = "aiomysql"
#: Driver name → module that defines ``DRIVER``.
DRIVER_MODULES = {
    "aiomysql": "orbit.storage._aiomysql",
    "asyncmy": "orbit.storage._asyncmy",
}


@dataclass(frozen=True, slots=True)
class PoolOptions:
    """What :class:`Database` asks of a driver's pool."""

    minsize: int
    maxsize: int
    connect_timeout: float
    #: user/password/host/port/unix_socket/db, from :meth:`DSN.connect_kwargs`.
    connect_kwargs: Mapping[str, object] = field(default_factory=dict)
    pool_recycle: int = 3600
    #: On for the read pool only: a statement commits itself (no transaction left open).
    autocommit: bool = False


@dataclass(frozen=True, slots=True)
class Driver:
    """One driver: a pool factory and the reading of its errors as PyMySQL's classes (which
    :mod:`orbit.storage.errors` then translates into Orbit's own).

    The pool it returns must offer ``acquire()`` (awaitable), ``release(conn)``,
    ``close()``, ``wait_closed()``, ``size``/``freesize``/``maxsize``; its connections
    ``cursor()`` (async context manager of a dict cursor with ``execute``/``executemany``/
    ``mogrify``/``nextset``/``fetchone``/``fetchall``/``rowcount``/``lastrowid``),
    ``commit()``, ``rollback()`` and ``close()``.
    """

    name: str
    create_pool: Callable[[PoolOptions], Awaitable[Any]]
    #: The driver's own exception -> the PyMySQL exception to raise instead (identity for
    #: aiomysql, whose errors *are* PyMySQL's).
    translate: Callable[[BaseException], BaseException] = lambda exc: exc


_loaded: dict[str, Driver] = {}
_translators: list[Callable[[BaseException], BaseException]] = []


def driver_name(explicit: str | None = None) -> str:
    """The explicit name, else ``$ORBIT_DB_DRIVER``, else ``aiomysql``; ValueError if unknown."""
    name = (explicit or os.environ.get(DRIVER_ENV) or DEFAULT_DRIVER).strip().lower()
    if name not in DRIVER_MODULES:
        raise ValueError(
            f"unknown database driver {name!r} ({DRIVER_ENV}): expected one of "
            f"{', '.join(DRIVER_MODULES)}"
        )
    return name


def load_driver(name: str | None = None) -> Driver:
    """The :class:`Driver` called ``name`` (see :func:`driver_name`), imported on first use."""
    name = driver_name(name)
    drv = _loaded.get(name)
    if drv is None:
        try:
            module = importlib.import_module(DRIVER_MODULES[name])
        except ImportError as exc:
            raise RuntimeError(
                f"database driver {name!r} is not installed ({exc}); "
                f"pip install {name}, or unset {DRIVER_ENV}"
            ) from exc
        drv = module.DRIVER
        _loaded[name] = drv
        if drv.name != DEFAULT_DRIVER:
            _translators.append(drv.translate)
    return drv


def available(name: str) -> bool:
    """True when driver ``name`` can be imported (tests skip the others)."""
    try:
        load_driver(name)
    except RuntimeError:
        return False
    return True


def as_pymysql(exc: BaseException) -> BaseException:
    """``exc`` as PyMySQL would have raised it (the same object when it already is one, or
    when it is not a driver error at all)."""
    for translate in _translators:
        out = translate(exc)
        if out is not exc:
            return out
    return exc
