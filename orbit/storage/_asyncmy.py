"""The ``asyncmy`` driver (optional, ``pip install asyncmy``): the MySQL protocol in Cython.

Same session contract as ``_aiomysql`` (see :mod:`orbit.storage.drivers`). Differences
handled here:

- ``binary_prefix=True``: asyncmy sends ``bytes`` as a plain string literal by default;
  the BINARY(16) ids go as ``_binary'...'`` like PyMySQL sends them (MariaDB 10.11 stores
  either form byte for byte; MySQL 8 warns 1300 about a utf8mb4 literal that is not UTF-8).
- ``db`` → ``database``; ``cursorclass`` → ``cursor_cls``.
- the text protocol only (``stmt_cache_size=0``, asyncmy's default): server-side prepared
  statements would not take the multi-statement batches and change how values are decoded.
- errors: ``asyncmy.errors.*`` become the PyMySQL class PyMySQL itself would raise for the
  same error number (``pymysql.err.error_map``), else the class of the same name, with the
  same ``(errno, message)`` args.
"""

from __future__ import annotations

from typing import Any

import asyncmy
import asyncmy.errors
import pymysql.err
from asyncmy.constants import CLIENT
from asyncmy.cursors import DictCursor

from orbit.storage.drivers import Driver, PoolOptions


async def create_pool(opts: PoolOptions) -> Any:
    kw = dict(opts.connect_kwargs)
    if "db" in kw:
        kw["database"] = kw.pop("db")
    return await asyncmy.create_pool(
        minsize=opts.minsize,
        maxsize=opts.maxsize,
        pool_recycle=opts.pool_recycle,
        autocommit=opts.autocommit,
        client_flag=CLIENT.FOUND_ROWS | CLIENT.MULTI_STATEMENTS,
        charset="utf8mb4",
        connect_timeout=max(1, round(opts.connect_timeout)),
        cursor_cls=DictCursor,
        binary_prefix=True,
        **kw,
    )


def translate(exc: BaseException) -> BaseException:
    if not isinstance(exc, asyncmy.errors.MySQLError):
        return exc
    args = exc.args
    code = args[0] if args and isinstance(args[0], int) else None
    cls: type[pymysql.err.MySQLError] | None = None
    if code is not None and code >= 1000:
        cls = pymysql.err.error_map.get(code)
    if cls is None:
        cls = getattr(pymysql.err, type(exc).__name__, None)
        if not (isinstance(cls, type) and issubclass(cls, pymysql.err.MySQLError)):
            cls = pymysql.err.OperationalError
    out = cls(*args)
    out.__cause__ = exc
    return out


DRIVER = Driver(name="asyncmy", create_pool=create_pool, translate=translate)
