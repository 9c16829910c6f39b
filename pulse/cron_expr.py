"""Cron expressions: the grammar (5 or 6 fields, croniter's convention: the optional 6th
field is *seconds*), validation by croniter, and the parsed value lists per field with the
day rule (:class:`CronExpr`). Pure: no clock, no time zone; :mod:`pulse.cron` maps the
matching local wall-clock times to UTC instants."""

from __future__ import annotations

import bisect
import calendar
import re
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from datetime import date, datetime, timedelta

from croniter import croniter
from croniter.croniter import CroniterError

#: The Unix epoch as a naive UTC datetime (anchor of ``every_ms`` without ``start_at``).
EPOCH = datetime(1970, 1, 1)
ONE_US = timedelta(microseconds=1)
ONE_S = timedelta(seconds=1)
#: Local days searched for the next matching day. The Gregorian calendar repeats every 400
#: years, so an expression without a match in that span never fires.
_DAY_HORIZON = 400 * 366

_ALIASES = {
    "@yearly": "0 0 1 1 *",
    "@annually": "0 0 1 1 *",
    "@monthly": "0 0 1 * *",
    "@weekly": "0 0 * * 0",
    "@daily": "0 0 * * *",
    "@midnight": "0 0 * * *",
    "@hourly": "0 * * * *",
}
_MONTHS = "jan|feb|mar|apr|may|jun|jul|aug|sep|oct|nov|dec"
_DAYS = "sun|mon|tue|wed|thu|fri|sat"
_NUM = r"\d{1,2}"
# One list element of a field: '*', a value or a range, with an optional '/step'.
_ELEM = r"(?:\*|{v}(?:-{v})?)(?:/\d{{1,2}})?"
_FIELD_RES = {
    "minute": re.compile(rf"^{_ELEM.format(v=_NUM)}(?:,{_ELEM.format(v=_NUM)})*$"),
    "hour": re.compile(rf"^{_ELEM.format(v=_NUM)}(?:,{_ELEM.format(v=_NUM)})*$"),
    "day_of_month": re.compile(
        rf"^(?:L|{_ELEM.format(v=_NUM)})(?:,(?:L|{_ELEM.format(v=_NUM)}))*$", re.I
    ),
    "month": re.compile(
        rf"^{_ELEM.format(v=f'(?:{_NUM}|{_MONTHS})')}(?:,{_ELEM.format(v=f'(?:{_NUM}|{_MONTHS})')})*$",
        re.I,
    ),
    "day_of_week": re.compile(
        rf"^(?:(?:{_NUM}|{_DAYS})#\d|{_ELEM.format(v=f'(?:{_NUM}|{_DAYS})')})"
        rf"(?:,(?:(?:{_NUM}|{_DAYS})#\d|{_ELEM.format(v=f'(?:{_NUM}|{_DAYS})')}))*$",
        re.I,
    ),
    "second": re.compile(rf"^{_ELEM.format(v=_NUM)}(?:,{_ELEM.format(v=_NUM)})*$"),
}
_FIELD_ORDER = ("minute", "hour", "day_of_month", "month", "day_of_week", "second")


class CronError(ValueError):
    """An expression, interval or time zone that cannot be used; ``field`` names the input."""

    def __init__(self, message: str, field: str = "cron") -> None:
        super().__init__(message)
        self.field = field



def _ceil_second(t: datetime) -> datetime:
    return t if t.microsecond == 0 else t.replace(microsecond=0) + ONE_S


@dataclass(frozen=True)
class CronExpr:
    """A parsed cron expression: sorted value lists per time field plus the day rule.

    Day rule (croniter's, with ``day_or=True`` like Vixie cron): when both day-of-month and
    day-of-week are restricted a day matches either; when one is ``*`` only the other counts.
    ``L`` in day-of-month is the last day of the month; ``d#n`` in day-of-week the n-th such
    weekday of the month.
    """

    text: str
    seconds: tuple[int, ...]
    minutes: tuple[int, ...]
    hours: tuple[int, ...]
    months: frozenset[int]
    dom: frozenset[int]
    dom_last: bool
    dom_star: bool
    dow: frozenset[int]
    dow_star: bool
    nth: tuple[tuple[int, frozenset[int]], ...]

    # -- parsing ---------------------------------------------------------------------------

    @classmethod
    def parse(cls, text: str) -> CronExpr:
        """Parse and validate ``text``; raise :class:`CronError` (field ``cron``).

        Accepted: 5 fields (minute hour day-of-month month day-of-week) or 6 (…, second
        last, croniter's convention); ``*``, values, ranges, steps, lists, month and day
        names, ``L`` in day-of-month, ``d#n`` in day-of-week; ``@hourly`` … ``@yearly``.
        Refused: ``H`` (hashed), ``R`` (random), ``W``, ``?``, ``L`` in day-of-week, a 7th
        (year) field, ``d#n`` mixed with plain weekdays or with a restricted day-of-month,
        and expressions that never fire.
        """
        raw = " ".join(text.split())
        if not raw or len(raw) > 255:
            raise CronError("cron must be 1-255 characters")
        expanded_text = _ALIASES.get(raw.lower(), raw)
        if expanded_text.startswith("@"):
            raise CronError(f"unknown cron alias {raw!r}")
        fields = expanded_text.split(" ")
        if len(fields) not in (5, 6):
            raise CronError(
                "cron needs 5 fields (minute hour day-of-month month day-of-week) "
                "or 6 (the 6th is seconds)"
            )
        for name, value in zip(_FIELD_ORDER, fields, strict=False):
            if not _FIELD_RES[name].match(value):
                raise CronError(f"unsupported {name.replace('_', '-')} field {value!r}")
        try:
            it = croniter(expanded_text, datetime(2000, 1, 1))
        except (CroniterError, ValueError, KeyError, TypeError) as exc:
            raise CronError(f"invalid cron expression: {exc}") from None
        # croniter's stubs say list[list[str]]; the fields hold ints, "*" and "l".
        expanded: Sequence[Sequence[object]] = it.expanded
        nth_raw: dict[object, set[object]] = {
            key: set(values) for key, values in it.nth_weekday_of_month.items()
        }
        if getattr(it, "nearest_weekday", None):
            raise CronError("W (nearest weekday) is not supported")

        def ints(values: Sequence[object], lo: int, hi: int) -> tuple[int, ...]:
            if "*" in values:
                return tuple(range(lo, hi + 1))
            return tuple(sorted({int(v) for v in values if isinstance(v, int)}))

        minutes = ints(expanded[0], 0, 59)
        hours = ints(expanded[1], 0, 23)
        seconds = ints(expanded[5], 0, 59) if len(expanded) > 5 else (0,)
        months = frozenset(ints(expanded[3], 1, 12))
        dom_star = "*" in expanded[2]  # '*' anywhere in a list makes the field '*'
        dom_last = "l" in expanded[2]
        dom = frozenset(v for v in expanded[2] if isinstance(v, int))
        dow_star = "*" in expanded[4]
        dow = frozenset(int(v) % 7 for v in expanded[4] if isinstance(v, int))
        nth: dict[int, frozenset[int]] = {}
        for key, values in nth_raw.items():
            if not isinstance(key, int) or any(not isinstance(n, int) for n in values):
                raise CronError("only d#n (n-th weekday) is supported in day-of-week")
            nth[key % 7] = frozenset(int(n) for n in values if isinstance(n, int))
        if nth:
            if dow_star:
                raise CronError("d#n cannot be mixed with * in day-of-week")
            if not dom_star:
                raise CronError("d#n in day-of-week needs day-of-month *")
            if dow - set(nth):
                raise CronError("d#n cannot be mixed with plain weekdays")
        expr = cls(
            text=raw,
            seconds=seconds,
            minutes=minutes,
            hours=hours,
            months=months,
            dom=dom,
            dom_last=dom_last,
            dom_star=dom_star,
            dow=dow,
            dow_star=dow_star,
            nth=tuple(sorted(nth.items())),
        )
        if not seconds or not minutes or not hours or not months:
            raise CronError("cron expression has an empty field")
        if expr.next_day(date(2000, 1, 1)) is None:
            raise CronError("cron expression never fires")
        return expr

    # -- days ------------------------------------------------------------------------------

    @property
    def per_day(self) -> int:
        """Matching times of day on a matching day."""
        return len(self.hours) * len(self.minutes) * len(self.seconds)

    def day_matches(self, d: date) -> bool:
        """True when ``d`` is a day the expression fires on (any time of day)."""
        if d.month not in self.months:
            return False
        weekday = d.isoweekday() % 7  # 0 = Sunday, like cron
        if self.nth:
            rank = (d.day - 1) // 7 + 1
            dow_ok = any(w == weekday and rank in ranks for w, ranks in self.nth)
            return dow_ok  # nth needs day-of-month '*' (checked at parse)
        if self.dom_star and self.dow_star:
            return True
        dom_ok = d.day in self.dom or (
            self.dom_last and d.day == calendar.monthrange(d.year, d.month)[1]
        )
        if self.dow_star:
            return dom_ok
        dow_ok = weekday in self.dow
        if self.dom_star:
            return dow_ok
        return dom_ok or dow_ok

    def next_day(self, d: date) -> date | None:
        """The first matching day on or after ``d`` (None: none within 400 years)."""
        checked = 0
        while checked < _DAY_HORIZON:
            if d.month not in self.months:
                nxt = date(d.year + (d.month == 12), d.month % 12 + 1, 1) if d.year < 9999 else None
                if nxt is None:
                    return None
                checked += (nxt - d).days
                d = nxt
                continue
            if self.day_matches(d):
                return d
            if d >= date(9999, 12, 30):
                return None
            d += timedelta(days=1)
            checked += 1
        return None

    def iter_days(self, first: date, last: date) -> Iterator[date]:
        """Matching days in ``[first, last)``."""
        d: date | None = self.next_day(first)
        while d is not None and d < last:
            yield d
            d = self.next_day(d + timedelta(days=1)) if d < date(9999, 12, 30) else None

    # -- times of day ----------------------------------------------------------------------

    def _next_tod(self, h: int, m: int, s: int) -> tuple[int, int, int] | None:
        """The first matching time of day ≥ (h, m, s)."""
        hs, ms, ss = self.hours, self.minutes, self.seconds
        i = bisect.bisect_left(hs, h)
        if i < len(hs) and hs[i] == h:
            j = bisect.bisect_left(ms, m)
            if j < len(ms) and ms[j] == m:
                k = bisect.bisect_left(ss, s)
                if k < len(ss):
                    return (h, m, ss[k])
                j += 1
            if j < len(ms):
                return (h, ms[j], ss[0])
            i += 1
        if i < len(hs):
            return (hs[i], ms[0], ss[0])
        return None

    def _tods_before(self, h: int, m: int, s: int) -> int:
        """How many matching times of day are < (h, m, s)."""
        hs, ms, ss = self.hours, self.minutes, self.seconds
        n = bisect.bisect_left(hs, h) * len(ms) * len(ss)
        if h in hs:
            n += bisect.bisect_left(ms, m) * len(ss)
            if m in ms:
                n += bisect.bisect_left(ss, s)
        return n

    def next_local(self, t: datetime) -> datetime | None:
        """The first matching wall-clock time ≥ ``t`` (naive, no time zone involved)."""
        t = _ceil_second(t)
        d = t.date()
        if self.day_matches(d):
            tod = self._next_tod(t.hour, t.minute, t.second)
            if tod is not None:
                return datetime(d.year, d.month, d.day, *tod)
        if d >= date(9999, 12, 30):
            return None
        nd = self.next_day(d + timedelta(days=1))
        if nd is None:
            return None
        return datetime(nd.year, nd.month, nd.day, self.hours[0], self.minutes[0], self.seconds[0])

    def count_local(self, a: datetime, b: datetime) -> int:
        """How many matching wall-clock times lie in ``[a, b)`` (naive)."""
        a, b = _ceil_second(a), _ceil_second(b)
        if a >= b:
            return 0
        da, db = a.date(), b.date()
        if da == db:
            if not self.day_matches(da):
                return 0
            return self._tods_before(b.hour, b.minute, b.second) - self._tods_before(
                a.hour, a.minute, a.second
            )
        total = 0
        if self.day_matches(da):
            total += self.per_day - self._tods_before(a.hour, a.minute, a.second)
        if self.day_matches(db):
            total += self._tods_before(b.hour, b.minute, b.second)
        total += self.per_day * sum(1 for _ in self.iter_days(da + timedelta(days=1), db))
        return total
