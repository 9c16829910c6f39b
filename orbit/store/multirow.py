"""One multi-row INSERT from a one-row INSERT whose VALUES tuple holds expressions.

The drivers' ``executemany`` sends ONE multi-row INSERT only when every value of the VALUES
tuple is a bare placeholder; a tuple with an expression (``COALESCE(%(now)s,
UTC_TIMESTAMP(6))``) silently becomes one statement per row. :func:`multi_row` repeats the
tuple per row instead, for :meth:`~orbit.storage.Tx.execute`.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from typing import Any

_VALUES = re.compile(r"\bVALUES\s*(\(.*\))\s*;?\s*\Z", re.S | re.I)
_NAMED = re.compile(r"%\((\w+)\)s")


def multi_row(sql: str, rows: Sequence[Mapping[str, Any]]) -> tuple[str, list[Any]]:
    """``sql`` (one ``INSERT … VALUES (…)`` with ``%(name)s`` placeholders, the tuple last)
    for every row of ``rows`` (never empty: callers check): the statement and its
    positional arguments."""
    m = _VALUES.search(sql)
    if m is None or not rows:
        raise ValueError("multi_row needs an INSERT ending in its VALUES tuple, and rows")
    one = m.group(1)
    names = _NAMED.findall(one)
    values = ", ".join([_NAMED.sub("%s", one)] * len(rows))
    return sql[: m.start(1)] + values, [row[n] for row in rows for n in names]
