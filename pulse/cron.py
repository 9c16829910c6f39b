"""Fire-time computation for schedules: pure functions, no database, no clock.

Two kinds of timing, both working on **naive UTC datetimes** (the database's ``DATETIME(6)``):

* :class:`CronTiming` — a cron expression (parsed and validated by croniter, 5 or 6 fields,
  croniter's convention: the optional 6th field is *seconds*) evaluated on the wall clock of
  an IANA time zone. Matching local wall-clock times are computed here from croniter's
  expanded fields (fast enough to count millions of skipped fire times without iterating
  them); ``tests/unit/test_cron*.py`` checks them against croniter's own iteration.
* :class:`IntervalTiming` — ``every_ms``: the instants ``anchor + k × every_ms`` (k ≥ 0),
  anchor = ``start_at`` or the Unix epoch. Time zones play no part (only in the local text).

Both honour ``start_at`` (no fire time before it) and ``end_at`` (none at or after it).

**DST policy** (a cron expression is a set of *local* wall-clock times, mapped to UTC):

* a local time that happens twice (fall back) fires **once, at its first instance** (the
  earlier UTC instant, ``fold=0``); the repeated wall-clock hour does not fire again;
* a local time that does not exist (spring forward) fires **once, at the first valid instant
  after the gap** (the transition instant itself, e.g. 03:00 CEST for 02:30 in Berlin).
  Several gap times (``*/15 2 * * *``) and the first time after the gap all map to that one
  instant; an occurrence is unique per UTC fire time, so it fires once.

**Time zone data.** Zones are read from the ``tzdata`` package (never the operating system's
``/usr/share/zoneinfo``, which ``zoneinfo`` would otherwise prefer), so every node computes
with the same rules and :func:`tzdata_version` names them exactly. Each schedule version
freezes that name; the running node always computes with its installed ``tzdata``.
"""

from __future__ import annotations

import functools
import importlib.metadata
import importlib.resources
import re
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Protocol
from zoneinfo import ZoneInfo

from pulse.cron_expr import EPOCH, ONE_S, ONE_US, CronError, CronExpr

#: Latest instant considered (``datetime.max`` minus a margin for zone offsets).
_FAR = datetime(9999, 12, 1)
#: Step of the scan that finds offset transitions while counting (transitions are far
#: more than six hours apart in every zone of the tz database: tests/unit/test_cron_dst.py).
_SCAN_STEP = timedelta(hours=6)
_DAY = timedelta(days=1)
_ZONE_NAME = re.compile(r"^[A-Za-z0-9_+\-]+(?:/[A-Za-z0-9_+\-]+)*$")


# ------------------------------------------------------------------------------ time zones


@functools.cache
def tzdata_version() -> str:
    """The tz database release this process computes with: ``"<IANA> (tzdata <package>)"``,
    e.g. ``"2026f (tzdata 2026.6)"``. Frozen into every schedule version at publish."""
    try:
        import tzdata

        iana = str(getattr(tzdata, "IANA_VERSION", "?"))
        return f"{iana} (tzdata {importlib.metadata.version('tzdata')})"[:32]
    except (ImportError, importlib.metadata.PackageNotFoundError):  # pragma: no cover
        return "system"


@functools.cache
def zone_names() -> frozenset[str]:
    """Every zone name the installed ``tzdata`` package provides."""
    text = importlib.resources.files("tzdata").joinpath("zones").read_text(encoding="utf-8")
    return frozenset(text.split())


@functools.cache
def load_zone(name: str) -> ZoneInfo:
    """The IANA zone ``name`` read from the ``tzdata`` package (CronError when unknown)."""
    if not _ZONE_NAME.match(name) or name not in zone_names():
        raise CronError(f"unknown IANA time zone {name!r}", field="timezone")
    res = importlib.resources.files("tzdata").joinpath("zoneinfo", *name.split("/"))
    with res.open("rb") as f:
        return ZoneInfo.from_file(f, key=name)


def _aware_utc(t: datetime) -> datetime:
    return t.replace(tzinfo=UTC)


def _naive_utc(t: datetime) -> datetime:
    return t.astimezone(UTC).replace(tzinfo=None)


def _offset(zone: ZoneInfo, t: datetime) -> timedelta:
    """UTC offset of ``zone`` at the UTC instant ``t`` (naive)."""
    off = _aware_utc(t).astimezone(zone).utcoffset()
    assert off is not None
    return off


def _first_with_offset(zone: ZoneInfo, lo: datetime, hi: datetime, off: timedelta) -> datetime:
    """Smallest whole-second UTC instant in ``(lo, hi]`` whose offset is ``off``, given that
    ``hi`` has it and the offset changes once in between (tz transitions are whole seconds)."""
    a = (lo - EPOCH) // ONE_S  # floor: still has the other offset
    b = -((EPOCH - hi) // ONE_S)  # ceil: has ``off``
    while b - a > 1:
        mid = (a + b) // 2
        if _offset(zone, EPOCH + timedelta(seconds=mid)) == off:
            b = mid
        else:
            a = mid
    return EPOCH + timedelta(seconds=b)


def _fixed_zone(zone: ZoneInfo) -> bool:
    """Zones known to have one offset forever (UTC and the Etc/ family)."""
    key = zone.key or ""
    return key in ("UTC", "GMT", "UCT", "Zulu", "Universal", "Greenwich") or key.startswith("Etc/")


def local_text(zone: ZoneInfo, t: datetime) -> str:
    """ISO 8601 text of the UTC instant ``t`` on ``zone``'s wall clock, with its offset,
    e.g. ``2026-03-29T03:00:00+02:00`` (microseconds only when non-zero)."""
    return _aware_utc(t).astimezone(zone).isoformat()



# ------------------------------------------------------------------------------ timings


class Timing(Protocol):
    """Fire times of one schedule version (naive UTC datetimes)."""

    zone: ZoneInfo
    start_at: datetime | None
    end_at: datetime | None

    def next_fire(self, t: datetime) -> datetime | None:
        """The first fire time ≥ ``t`` (None: no more)."""
        ...

    def count(self, a: datetime, b: datetime) -> int:
        """How many fire times lie in ``[a, b)``."""
        ...


def _bounds(
    t_lo: datetime, t_hi: datetime | None, start_at: datetime | None, end_at: datetime | None
) -> tuple[datetime, datetime | None]:
    lo = max(t_lo, start_at) if start_at is not None else t_lo
    hi = t_hi
    if end_at is not None:
        hi = end_at if hi is None else min(hi, end_at)
    return lo, hi


class CronTiming:
    """Cron fire times on ``zone``'s wall clock, mapped to UTC by the DST policy above."""

    def __init__(
        self,
        expr: CronExpr,
        zone: ZoneInfo,
        start_at: datetime | None = None,
        end_at: datetime | None = None,
    ) -> None:
        self.expr = expr
        self.zone = zone
        self.start_at = start_at
        self.end_at = end_at

    # -- mapping ---------------------------------------------------------------------------

    def to_utc(self, local: datetime) -> datetime:
        """The UTC fire instant of the wall-clock time ``local`` (naive): its first instance
        when it happens twice, the end of the gap when it does not exist."""
        u0 = local.replace(tzinfo=self.zone).astimezone(UTC)  # fold=0: first instance
        if u0.astimezone(self.zone).replace(tzinfo=None) == local:
            return u0.replace(tzinfo=None)
        # In a gap: fold=0 used the offset before the transition (an instant after it),
        # fold=1 the offset after (an instant before it). The transition lies between.
        after = _naive_utc(u0)
        before = _naive_utc(local.replace(tzinfo=self.zone, fold=1))
        return _first_with_offset(self.zone, before, after, _offset(self.zone, after))

    def _local_start(self, t: datetime) -> datetime:
        """The earliest wall-clock time whose fire instant can be ≥ ``t``."""
        aware = _aware_utc(t).astimezone(self.zone)
        local = aware.replace(tzinfo=None)
        now_off = aware.utcoffset()
        assert now_off is not None
        before_off = _offset(self.zone, t - ONE_US)
        if before_off < now_off:
            # ``t`` is (within 1 µs of) a spring-forward transition: the gap's wall-clock
            # times fire at the transition instant, so they count from here too.
            return local - (now_off - before_off)
        return local

    def _raw_next(self, t: datetime) -> datetime | None:
        if t >= _FAR:
            return None
        start = self._local_start(t)
        for _ in range(1000):
            m = self.expr.next_local(start)
            if m is None or m >= _FAR:
                return None
            u = self.to_utc(m)
            if u >= t:
                return u
            # ``m`` is a repeated wall-clock time whose first instance is before ``t``
            # (``t`` is inside the second instance): jump past the repeated stretch.
            start = max(self._fold_end(t), m + ONE_S)
        raise RuntimeError("cron iteration did not converge")  # pragma: no cover

    def _fold_end(self, t: datetime) -> datetime:
        """For ``t`` inside the second instance of a repeated stretch: the wall-clock time
        where the repetition ends (otherwise ``t``'s own wall-clock time)."""
        aware = _aware_utc(t).astimezone(self.zone)
        local = aware.replace(tzinfo=None)
        off1 = aware.utcoffset()
        off0 = local.replace(tzinfo=self.zone, fold=0).utcoffset()
        assert off0 is not None and off1 is not None
        if off0 <= off1:
            return local
        transition = _first_with_offset(self.zone, t - (off0 - off1), t, off1)
        return transition + off0

    def next_fire(self, t: datetime) -> datetime | None:
        lo, hi = _bounds(t, None, self.start_at, self.end_at)
        f = self._raw_next(lo)
        if f is None or (hi is not None and f >= hi):
            return None
        return f

    def fires(self, a: datetime, b: datetime, limit: int = 1_000_000) -> list[datetime]:
        """Fire times in ``[a, b)`` in order, at most ``limit``."""
        out: list[datetime] = []
        f = self.next_fire(a)
        while f is not None and f < b and len(out) < limit:
            out.append(f)
            f = self.next_fire(f + ONE_US)
        return out

    # -- counting --------------------------------------------------------------------------

    def count(self, a: datetime, b: datetime) -> int:
        """How many fire times lie in ``[a, b)``, without iterating them: between offset
        transitions the count is a plain shift of the wall clock (day arithmetic); at a
        fall-back the second instance of the repeated stretch adds nothing; at a spring-forward
        the transition instant adds one when only gap times (not the time after the gap)
        match."""
        lo, hi = _bounds(a, b, self.start_at, self.end_at)
        assert hi is not None
        if lo >= hi:
            return 0
        total = 0
        cursor = lo
        transitions = [] if _fixed_zone(self.zone) else _transitions(self.zone, lo - _DAY, hi)
        for when, before, after in transitions:
            if before > after:  # fall back: [when, when + d) are second instances
                if when < hi:
                    if cursor < when:
                        total += self._stable_count(cursor, when)
                    cursor = max(cursor, min(hi, when + (before - after)))
            elif lo <= when < hi:  # spring forward
                if cursor < when:
                    total += self._stable_count(cursor, when)
                    cursor = when
                gap_lo, gap_hi = when + before, when + after
                if self.expr.count_local(gap_lo, gap_hi) and not self.expr.count_local(
                    gap_hi, gap_hi + ONE_S
                ):
                    total += 1  # gap times fire once, at the transition instant
        if cursor < hi:
            total += self._stable_count(cursor, hi)
        return total

    def _stable_count(self, a: datetime, b: datetime) -> int:
        """Fire times in ``[a, b)`` when the offset is constant there and no repeated or
        skipped wall-clock time is involved: a plain shift of the wall clock."""
        off = _offset(self.zone, a)
        return self.expr.count_local(a + off, b + off)


@functools.lru_cache(maxsize=4096)
def _year_transitions(
    zone: ZoneInfo, year: int
) -> tuple[tuple[datetime, timedelta, timedelta], ...]:
    """Offset changes of ``zone`` during UTC year ``year``: (instant, before, after)."""
    out = []
    t = datetime(year, 1, 1)
    end = datetime(year + 1, 1, 1) if year < 9999 else _FAR
    off = _offset(zone, t - ONE_US)
    if off != _offset(zone, t):
        new = _offset(zone, t)
        out.append((t, off, new))
        off = new
    while t < end:
        nxt = min(t + _SCAN_STEP, end)
        new = _offset(zone, nxt - ONE_US)
        if new != off:
            out.append((_first_with_offset(zone, t - ONE_US, nxt - ONE_US, new), off, new))
            off = new
        t = nxt
    return tuple(out)


def _transitions(
    zone: ZoneInfo, a: datetime, b: datetime
) -> list[tuple[datetime, timedelta, timedelta]]:
    """Offset changes of ``zone`` with instants in ``[a, b)``, in order."""
    out: list[tuple[datetime, timedelta, timedelta]] = []
    for year in range(a.year, min(b.year, 9998) + 1):
        out.extend(x for x in _year_transitions(zone, year) if a <= x[0] < b)
    return out


class IntervalTiming:
    """``every_ms`` fire times: ``anchor + k × every_ms`` for k ≥ 0 (anchor = ``start_at``,
    else the Unix epoch), below ``end_at``."""

    def __init__(
        self,
        every_ms: int,
        zone: ZoneInfo,
        start_at: datetime | None = None,
        end_at: datetime | None = None,
    ) -> None:
        if every_ms < 1000:
            raise CronError("every_ms must be at least 1000", field="every_ms")
        self.every_ms = every_ms
        self.zone = zone
        self.start_at = start_at
        self.end_at = end_at
        self.anchor = start_at if start_at is not None else EPOCH
        self._step = every_ms * 1000  # µs

    def _k_ceil(self, t: datetime) -> int:
        """The smallest k with anchor + k × step ≥ t."""
        us = (t - self.anchor) // ONE_US
        return max(0, -(-us // self._step))

    def _at(self, k: int) -> datetime | None:
        try:
            value = self.anchor + timedelta(microseconds=k * self._step)
        except OverflowError:
            return None
        return value if value < _FAR else None

    def next_fire(self, t: datetime) -> datetime | None:
        lo, hi = _bounds(t, None, self.start_at, self.end_at)
        f = self._at(self._k_ceil(lo))
        if f is None or (hi is not None and f >= hi):
            return None
        return f

    def count(self, a: datetime, b: datetime) -> int:
        lo, hi = _bounds(a, b, self.start_at, self.end_at)
        assert hi is not None
        if lo >= hi:
            return 0
        return max(0, self._k_ceil(hi) - self._k_ceil(lo))

    def fires(self, a: datetime, b: datetime, limit: int = 1_000_000) -> list[datetime]:
        out: list[datetime] = []
        f = self.next_fire(a)
        while f is not None and f < b and len(out) < limit:
            out.append(f)
            f = self.next_fire(f + ONE_US)
        return out


def make_timing(
    *,
    cron: str | None,
    every_ms: int | None,
    timezone: str,
    start_at: datetime | None = None,
    end_at: datetime | None = None,
) -> CronTiming | IntervalTiming:
    """The timing of one schedule version (exactly one of ``cron`` / ``every_ms``)."""
    if (cron is None) == (every_ms is None):
        raise CronError("give exactly one of cron and every_ms", field="cron")
    if start_at is not None and end_at is not None and end_at <= start_at:
        raise CronError("end_at must be after start_at", field="end_at")
    zone = load_zone(timezone)
    if cron is not None:
        return CronTiming(CronExpr.parse(cron), zone, start_at, end_at)
    assert every_ms is not None
    return IntervalTiming(every_ms, zone, start_at, end_at)


# ------------------------------------------------------------------------------ versions


@dataclass(frozen=True)
class Segment:
    """The part of a schedule's time line one version governs: fire times in
    ``[start, end)`` (``end`` None: open) come from ``timing``."""

    version: int
    start: datetime
    end: datetime | None
    timing: CronTiming | IntervalTiming


class Timeline:
    """Fire times across versions: version *v* (published at ``P_v``) governs fire times in
    ``[P_v, P_{v+1})``. Fire times before a publish keep their old version; nothing fires
    before the first version's publish time."""

    def __init__(self, segments: Sequence[Segment]) -> None:
        self.segments = list(segments)

    @classmethod
    def of(cls, versions: Sequence[tuple[int, datetime, CronTiming | IntervalTiming]]) -> Timeline:
        """``versions`` = (version, publish time, timing), ordered by version."""
        segs = []
        for i, (v, start, timing) in enumerate(versions):
            end = versions[i + 1][1] if i + 1 < len(versions) else None
            segs.append(Segment(v, start, end, timing))
        return cls(segs)

    def segments_between(
        self, a: datetime, b: datetime
    ) -> Iterator[tuple[Segment, datetime, datetime]]:
        """(segment, lo, hi) for every non-empty overlap of a segment with ``[a, b)``."""
        for s in self.segments:
            lo = max(a, s.start)
            hi = b if s.end is None else min(b, s.end)
            if lo < hi:
                yield s, lo, hi

    def next_fire(self, t: datetime) -> tuple[datetime, Segment] | None:
        """The first fire time ≥ ``t`` on the time line and the segment it belongs to."""
        for s in self.segments:
            if s.end is not None and s.end <= t:
                continue
            f = s.timing.next_fire(max(t, s.start))
            if f is not None and (s.end is None or f < s.end):
                return f, s
        return None


__all__ = [
    "EPOCH",
    "ONE_US",
    "CronError",
    "CronExpr",
    "CronTiming",
    "IntervalTiming",
    "Segment",
    "Timeline",
    "Timing",
    "load_zone",
    "local_text",
    "make_timing",
    "tzdata_version",
    "zone_names",
]
