"""The ``aiomysql`` driver (default): PyMySQL's protocol in pure Python on asyncio."""

from __future__ import annotations

from typing import Any

import aiomysql
from pymysql.constants import CLIENT

from orbit.storage.drivers import Driver, PoolOptions


async def create_pool(opts: PoolOptions) -> Any:
    return await aiomysql.create_pool(
        minsize=opts.minsize,
        maxsize=opts.maxsize,
        autocommit=opts.autocommit,
        client_flag=CLIENT.FOUND_ROWS | CLIENT.MULTI_STATEMENTS,
        charset="utf8mb4",
        connect_timeout=opts.connect_timeout,
        pool_recycle=opts.pool_recycle,
        cursorclass=aiomysql.DictCursor,
        **opts.connect_kwargs,
    )


#: aiomysql raises PyMySQL's exceptions already: nothing to translate.
DRIVER = Driver(name="aiomysql", create_pool=create_pool)
