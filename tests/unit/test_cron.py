"""pulse.cron against croniter: parsing, wall-clock matches, counting, every_ms alignment.

The cron engine computes matches from croniter's expanded fields (so it can count millions of
skipped fire times without iterating them); these properties check that it produces exactly
croniter's own iteration.
"""

from __future__ import annotations

import itertools
from datetime import datetime, timedelta

import pytest
from croniter import croniter
from croniter.croniter import CroniterBadDateError
from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st

from pulse.cron import (
    EPOCH,
    CronError,
    CronExpr,
    CronTiming,
    IntervalTiming,
    Timeline,
    load_zone,
    local_text,
    make_timing,
    tzdata_version,
)

UTC_ZONE = load_zone("UTC")
FAST = settings(max_examples=80, deadline=None, suppress_health_check=[HealthCheck.too_slow])

# ---------------------------------------------------------------------------- generators


def _element(lo: int, hi: int, names: list[str] | None = None) -> st.SearchStrategy[str]:
    def value(v: int) -> str:
        return names[v - lo] if names else str(v)

    single = st.integers(lo, hi).map(value)
    rng = st.tuples(st.integers(lo, hi), st.integers(lo, hi)).map(
        lambda ab: f"{value(min(ab))}-{value(max(ab))}"
    )
    step = st.integers(1, max(1, (hi - lo) // 2 + 1))
    return st.one_of(
        st.just("*"),
        single,
        rng,
        step.map(lambda n: f"*/{n}"),
        st.tuples(rng, step).map(lambda rs: f"{rs[0]}/{rs[1]}"),
    )


def _field(lo: int, hi: int, names: list[str] | None = None) -> st.SearchStrategy[str]:
    return st.lists(_element(lo, hi, names), min_size=1, max_size=3).map(
        lambda xs: "*" if "*" in xs else ",".join(xs)
    )


_MONTH_NAMES = ["jan", "feb", "mar", "apr", "may", "jun", "jul", "aug", "sep", "oct", "nov", "dec"]
_DAY_NAMES = ["sun", "mon", "tue", "wed", "thu", "fri", "sat"]

minute_f = _field(0, 59)
hour_f = _field(0, 23)
second_f = _field(0, 59)
month_f = st.one_of(_field(1, 12), _field(1, 12, _MONTH_NAMES))
dom_f = st.one_of(_field(1, 31), st.just("L"), _field(1, 28).map(lambda f: f"{f},L"))
dow_plain = st.one_of(_field(0, 6), _field(0, 6, _DAY_NAMES), st.just("7"))
dow_nth = st.lists(
    st.tuples(st.integers(0, 6), st.integers(1, 5)).map(lambda wn: f"{wn[0]}#{wn[1]}"),
    min_size=1,
    max_size=2,
).map(",".join)


@st.composite
def cron_exprs(draw: st.DrawFn, *, dense: bool = False) -> str:
    """Random cron expressions in the supported grammar (5 or 6 fields)."""
    minute = draw(minute_f)
    hour = draw(hour_f)
    if draw(st.booleans()):
        dom, dow = draw(dom_f), draw(dow_plain)
    else:
        dom, dow = "*", draw(st.one_of(dow_nth, dow_plain))
    month = draw(month_f)
    fields = [minute, hour, dom, month, dow]
    if draw(st.booleans()):
        fields.append(draw(second_f))
    if dense:  # keep every day possible so windows of a few days have fires
        fields[2], fields[3], fields[4] = "*", "*", "*"
    return " ".join(fields)


starts = st.datetimes(min_value=datetime(1990, 1, 1), max_value=datetime(2060, 1, 1)).map(
    lambda d: d.replace(microsecond=0)
)


def croniter_from(expr: str, start: datetime, n: int) -> list[datetime]:
    """croniter's first ``n`` matches ≥ ``start`` (a whole second)."""
    it = croniter(expr, start - timedelta(seconds=1))
    return [it.get_next(datetime) for _ in range(n)]


def parse_or_never(expr: str) -> CronExpr | None:
    """The parsed expression, or None when it never fires (croniter must agree)."""
    try:
        return CronExpr.parse(expr)
    except CronError as exc:
        assert "never fires" in str(exc), (expr, exc)
        with pytest.raises(CroniterBadDateError):
            croniter(expr, datetime(2000, 1, 1)).get_next(datetime)
        return None


# ---------------------------------------------------------------------------- parsing


@pytest.mark.parametrize(
    "expr",
    [
        "H * * * *",
        "R * * * *",
        "0 0 15W * *",
        "0 0 * * 5L",
        "0 0 ? * *",
        "0 0 1 1 * 0 2030",
        "0 0 1 * 5#2",
        "0 0 * * 1#2,3",
        "0 0 30 2 *",
        "@reboot",
        "",
        "61 * * * *",
        "* 24 * * *",
        "0 0 0 * *",
        "x y z",
    ],
)
def test_unsupported_or_invalid_expressions_are_refused(expr: str) -> None:
    with pytest.raises(CronError) as err:
        CronExpr.parse(expr)
    assert err.value.field == "cron"


@pytest.mark.parametrize(
    ("alias", "plain"),
    [("@hourly", "0 * * * *"), ("@daily", "0 0 * * *"), ("@weekly", "0 0 * * 0"),
     ("@monthly", "0 0 1 * *"), ("@yearly", "0 0 1 1 *"), ("@midnight", "0 0 * * *")],
)  # fmt: skip
def test_aliases_equal_their_expansion(alias: str, plain: str) -> None:
    a, b = CronExpr.parse(alias), CronExpr.parse(plain)
    start = datetime(2026, 5, 17, 13, 7)
    assert a.next_local(start) == b.next_local(start) == croniter_from(plain, start, 1)[0]


def test_sixth_field_is_seconds_like_croniter() -> None:
    expr = CronExpr.parse("*/10 * * * * 30")
    start = datetime(2026, 1, 1, 0, 0, 0)
    got = [expr.next_local(start)]
    while len(got) < 4:
        nxt = expr.next_local(got[-1] + timedelta(seconds=1))
        assert nxt is not None
        got.append(nxt)
    assert got == croniter_from("*/10 * * * * 30", start, 4)
    assert got[0] == datetime(2026, 1, 1, 0, 0, 30)


def test_unknown_zone_is_refused_and_tzdata_version_is_named() -> None:
    with pytest.raises(CronError) as err:
        load_zone("Mars/Olympus_Mons")
    assert err.value.field == "timezone"
    for bad in ("../etc/passwd", "/etc/localtime", "Europe/../UTC", "localtime"):
        with pytest.raises(CronError):
            load_zone(bad)
    assert load_zone("Europe/Berlin").key == "Europe/Berlin"
    version = tzdata_version()
    assert "tzdata" in version and len(version) <= 32


# ---------------------------------------------------------------------------- properties


@FAST
@given(expr=cron_exprs(), start=starts)
def test_wall_clock_matches_equal_croniter(expr: str, start: datetime) -> None:
    parsed = parse_or_never(expr)
    assume(parsed is not None)
    assert parsed is not None
    expected = croniter_from(expr, start, 12)
    got: list[datetime] = []
    t = start
    while len(got) < 12:
        nxt = parsed.next_local(t)
        assert nxt is not None
        got.append(nxt)
        t = nxt + timedelta(seconds=1)
    assert got == expected, expr


@FAST
@given(expr=cron_exprs(), start=starts, n=st.integers(0, 40), tail=st.integers(0, 3600))
def test_count_local_equals_croniter_iteration(
    expr: str, start: datetime, n: int, tail: int
) -> None:
    parsed = parse_or_never(expr)
    assume(parsed is not None)
    assert parsed is not None
    matches = croniter_from(expr, start, n + 1)
    end = matches[n] - timedelta(seconds=1) + timedelta(microseconds=tail)
    expected = sum(1 for m in matches if start <= m < end)
    assert parsed.count_local(start, end) == expected, expr


@FAST
@given(expr=cron_exprs(dense=True), start=starts, n=st.integers(1, 30))
def test_utc_fire_times_equal_croniter(expr: str, start: datetime, n: int) -> None:
    """In UTC (no DST) the fire times are croniter's iteration, and counts agree."""
    timing = CronTiming(CronExpr.parse(expr), UTC_ZONE)
    expected = croniter_from(expr, start, n)
    end = expected[-1] + timedelta(microseconds=1)
    assert timing.fires(start, end) == expected
    assert timing.count(start, end) == n


@FAST
@given(
    every_ms=st.integers(1000, 10 * 86_400_000),
    anchor=st.one_of(st.none(), starts.map(lambda d: d + timedelta(microseconds=123))),
    t=starts,
    n=st.integers(0, 300),
    jitter_ms=st.integers(0, 999),
)
def test_every_ms_fire_times_are_multiples_from_the_anchor(
    every_ms: int, anchor: datetime | None, t: datetime, n: int, jitter_ms: int
) -> None:
    timing = IntervalTiming(every_ms, UTC_ZONE, start_at=anchor)
    base = anchor or EPOCH
    step = timedelta(milliseconds=every_ms)
    f = timing.next_fire(t)
    assert f is not None
    assert f >= t and f >= base
    k, rem = divmod(f - base, step)
    assert rem == timedelta(0) and k >= 0
    assert f - step < max(t, base)  # the first one at or after t
    end = t + timedelta(milliseconds=n * every_ms + jitter_ms)
    fires = timing.fires(t, end)
    assert timing.count(t, end) == len(fires)
    assert all(b - a == step for a, b in itertools.pairwise(fires))


def test_every_ms_examples() -> None:
    utc = UTC_ZONE
    every_hour = IntervalTiming(3_600_000, utc)
    assert every_hour.next_fire(datetime(2026, 3, 1, 10, 0, 0, 1)) == datetime(2026, 3, 1, 11)
    assert every_hour.next_fire(datetime(2026, 3, 1, 10)) == datetime(2026, 3, 1, 10)
    anchored = IntervalTiming(90_000, utc, start_at=datetime(2026, 3, 1, 10, 0, 10))
    assert anchored.next_fire(datetime(2020, 1, 1)) == datetime(2026, 3, 1, 10, 0, 10)
    assert anchored.next_fire(datetime(2026, 3, 1, 10, 0, 11)) == datetime(2026, 3, 1, 10, 1, 40)
    bounded = IntervalTiming(
        60_000, utc, start_at=datetime(2026, 1, 1), end_at=datetime(2026, 1, 1, 0, 3)
    )
    assert bounded.fires(datetime(2025, 1, 1), datetime(2027, 1, 1)) == [
        datetime(2026, 1, 1, 0, 0), datetime(2026, 1, 1, 0, 1), datetime(2026, 1, 1, 0, 2),
    ]  # fmt: skip
    assert bounded.count(datetime(2025, 1, 1), datetime(2027, 1, 1)) == 3
    # every_ms ignores the zone: a Berlin every-hour schedule keeps a one-hour spacing
    # across DST; only the local text shows the wall-clock jump.
    berlin = IntervalTiming(3_600_000, load_zone("Europe/Berlin"))
    fires = berlin.fires(datetime(2026, 3, 29, 0), datetime(2026, 3, 29, 3))
    assert [local_text(berlin.zone, f) for f in fires] == [
        "2026-03-29T01:00:00+01:00", "2026-03-29T03:00:00+02:00", "2026-03-29T04:00:00+02:00",
    ]  # fmt: skip


def test_start_and_end_bound_cron_fire_times() -> None:
    timing = make_timing(
        cron="0 * * * *", every_ms=None, timezone="UTC",
        start_at=datetime(2026, 1, 1, 10, 30), end_at=datetime(2026, 1, 1, 13),
    )  # fmt: skip
    assert timing.fires(datetime(2026, 1, 1), datetime(2026, 1, 2)) == [
        datetime(2026, 1, 1, 11), datetime(2026, 1, 1, 12),
    ]  # fmt: skip
    assert timing.count(datetime(2026, 1, 1), datetime(2026, 1, 2)) == 2
    assert timing.next_fire(datetime(2026, 1, 1, 12, 0, 0, 1)) is None
    with pytest.raises(CronError) as err:
        make_timing(cron="0 * * * *", every_ms=None, timezone="UTC",
                    start_at=datetime(2026, 1, 2), end_at=datetime(2026, 1, 1))  # fmt: skip
    assert err.value.field == "end_at"
    with pytest.raises(CronError):
        make_timing(cron="0 * * * *", every_ms=1000, timezone="UTC")
    with pytest.raises(CronError):
        make_timing(cron=None, every_ms=None, timezone="UTC")
    with pytest.raises(CronError) as err:
        make_timing(cron=None, every_ms=999, timezone="UTC")
    assert err.value.field == "every_ms"


def test_counting_a_decade_of_every_second_is_fast() -> None:
    """A long outage is counted, not iterated (one skipped-range row with its count)."""
    import time

    timing = CronTiming(CronExpr.parse("* * * * * *"), load_zone("Europe/Berlin"))
    a, b = datetime(2020, 1, 1), datetime(2030, 1, 1)
    began = time.perf_counter()
    n = timing.count(a, b)
    assert time.perf_counter() - began < 2.0
    # Every UTC second fires except the repeated hour's second instance each autumn (the
    # spring-forward hour's wall-clock times collapse into the transition instant, which is
    # a second that fires anyway).
    seconds = int((b - a).total_seconds())
    assert n == seconds - 10 * 3600


def test_timeline_switches_versions_at_publish_time() -> None:
    hourly = CronTiming(CronExpr.parse("0 * * * *"), UTC_ZONE)
    halfhourly = CronTiming(CronExpr.parse("30 * * * *"), UTC_ZONE)
    p1, p2 = datetime(2026, 1, 1, 0, 0), datetime(2026, 1, 1, 2, 10)
    line = Timeline.of([(1, p1, hourly), (2, p2, halfhourly)])
    got = []
    t = datetime(2025, 12, 31)
    while len(got) < 5:
        nxt = line.next_fire(t)
        assert nxt is not None
        got.append((nxt[0], nxt[1].version))
        t = nxt[0] + timedelta(microseconds=1)
    assert got == [
        (datetime(2026, 1, 1, 0, 0), 1), (datetime(2026, 1, 1, 1, 0), 1),
        (datetime(2026, 1, 1, 2, 0), 1), (datetime(2026, 1, 1, 2, 30), 2),
        (datetime(2026, 1, 1, 3, 30), 2),
    ]  # fmt: skip
    spans = [(s.version, lo, hi) for s, lo, hi in line.segments_between(p1, datetime(2026, 1, 2))]
    assert spans == [(1, p1, p2), (2, p2, datetime(2026, 1, 2))]
