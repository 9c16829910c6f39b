"""DST policy of cron schedules (pulse.cron), checked by example and against an independent
brute-force reference built on croniter's wall-clock iteration.

Policy: a wall-clock time that happens twice fires once, at its first instance; a wall-clock
time that does not exist fires once, at the first valid instant after the gap.
"""

from __future__ import annotations

import importlib.resources
import itertools
import struct
from datetime import UTC, datetime, timedelta

import pytest
from croniter import croniter
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from pulse import cron as cron_mod
from pulse.cron import CronExpr, CronTiming, load_zone, local_text, zone_names

PROPS = settings(max_examples=80, deadline=None, suppress_health_check=[HealthCheck.too_slow])


def fires_local(expr: str, zone: str, a: datetime, b: datetime) -> list[str]:
    timing = CronTiming(CronExpr.parse(expr), load_zone(zone))
    return [local_text(timing.zone, f) for f in timing.fires(a, b)]


def fires_utc(expr: str, zone: str, a: datetime, b: datetime) -> list[datetime]:
    return CronTiming(CronExpr.parse(expr), load_zone(zone)).fires(a, b)


# ---------------------------------------------------------------------------- examples


def test_berlin_spring_forward_gap_fires_once_at_three() -> None:
    # 2026-03-29: 02:00 CET → 03:00 CEST (01:00 UTC). 02:30 does not exist.
    assert fires_local("30 2 * * *", "Europe/Berlin", datetime(2026, 3, 27), datetime(2026, 3, 31)) == [
        "2026-03-27T02:30:00+01:00", "2026-03-28T02:30:00+01:00",
        "2026-03-29T03:00:00+02:00", "2026-03-30T02:30:00+02:00",
    ]  # fmt: skip
    # Every gap time and 03:00 itself collapse into the one transition instant.
    got = fires_utc(
        "*/15 2,3 * * *", "Europe/Berlin", datetime(2026, 3, 29), datetime(2026, 3, 29, 2)
    )
    assert got == [datetime(2026, 3, 29, 1, 0), datetime(2026, 3, 29, 1, 15),
                   datetime(2026, 3, 29, 1, 30), datetime(2026, 3, 29, 1, 45)]  # fmt: skip


def test_berlin_fall_back_repeated_hour_fires_once_at_first_instance() -> None:
    # 2026-10-25: 03:00 CEST → 02:00 CET. 02:30 happens at 00:30 UTC and at 01:30 UTC.
    assert fires_local("30 2 * * *", "Europe/Berlin", datetime(2026, 10, 24), datetime(2026, 10, 26)) == [
        "2026-10-24T02:30:00+02:00", "2026-10-25T02:30:00+02:00",
    ]  # fmt: skip
    # A sub-hourly schedule does not fire during the repetition (second instance).
    got = fires_local(
        "*/20 * * * *",
        "Europe/Berlin",
        datetime(2026, 10, 25, 0, 30),
        datetime(2026, 10, 25, 2, 30),
    )
    assert got == [
        "2026-10-25T02:40:00+02:00", "2026-10-25T03:00:00+01:00", "2026-10-25T03:20:00+01:00",
    ]  # fmt: skip


def test_new_york_gap_and_repeat() -> None:
    # 2026-03-08 02:00 EST → 03:00 EDT; 2026-11-01 02:00 EDT → 01:00 EST.
    assert fires_local("30 2 * * *", "America/New_York", datetime(2026, 3, 7, 12), datetime(2026, 3, 9, 12)) == [
        "2026-03-08T03:00:00-04:00", "2026-03-09T02:30:00-04:00",
    ]  # fmt: skip
    assert fires_local("30 1 * * *", "America/New_York", datetime(2026, 10, 31, 12), datetime(2026, 11, 2, 12)) == [
        "2026-11-01T01:30:00-04:00", "2026-11-02T01:30:00-05:00",
    ]  # fmt: skip


def test_adelaide_half_hour_zone_with_dst() -> None:
    # ACST +09:30 / ACDT +10:30. 2026-04-05 03:00 ACDT → 02:00 ACST (02:xx repeats);
    # 2026-10-04 02:00 ACST → 03:00 ACDT (02:xx does not exist).
    assert fires_local("15 2 * * *", "Australia/Adelaide", datetime(2026, 4, 3, 12), datetime(2026, 4, 5, 12)) == [
        "2026-04-04T02:15:00+10:30", "2026-04-05T02:15:00+10:30",
    ]  # fmt: skip
    got = fires_utc(
        "15 2 * * *", "Australia/Adelaide", datetime(2026, 10, 2, 12), datetime(2026, 10, 4, 12)
    )
    assert got == [datetime(2026, 10, 2, 16, 45), datetime(2026, 10, 3, 16, 30)]
    assert local_text(load_zone("Australia/Adelaide"), got[1]) == "2026-10-04T03:00:00+10:30"


def test_lord_howe_thirty_minute_shift() -> None:
    # +10:30 standard / +11:00 summer. 2026-04-05 02:00 → 01:30 (01:30–02:00 repeats);
    # 2026-10-04 02:00 → 02:30 (02:00–02:30 does not exist).
    assert fires_local("45 1 * * *", "Australia/Lord_Howe", datetime(2026, 4, 3, 12), datetime(2026, 4, 5, 12)) == [
        "2026-04-04T01:45:00+11:00", "2026-04-05T01:45:00+11:00",
    ]  # fmt: skip
    assert fires_local("10 2 * * *", "Australia/Lord_Howe", datetime(2026, 10, 2, 12), datetime(2026, 10, 4, 12)) == [
        "2026-10-03T02:10:00+10:30", "2026-10-04T02:30:00+11:00",
    ]  # fmt: skip
    timing = CronTiming(CronExpr.parse("*/10 * * * *"), load_zone("Australia/Lord_Howe"))
    window = (datetime(2026, 4, 4, 14, 0), datetime(2026, 4, 4, 16, 0))
    fires = timing.fires(*window)
    assert timing.count(*window) == len(fires) == 12 - 3  # 01:30, 01:40, 01:50 repeat: once


def test_apia_day_that_never_happened() -> None:
    # Samoa skipped 2011-12-30 entirely (UTC-10 → UTC+14 at 2011-12-30 10:00 UTC).
    got = fires_local(
        "0 12 * * *", "Pacific/Apia", datetime(2011, 12, 28), datetime(2011, 12, 31, 12)
    )
    assert got == [
        "2011-12-28T12:00:00-10:00", "2011-12-29T12:00:00-10:00",
        "2011-12-31T00:00:00+14:00", "2011-12-31T12:00:00+14:00",
    ]  # fmt: skip


def test_next_fire_from_inside_the_repeated_hour() -> None:
    timing = CronTiming(CronExpr.parse("*/15 * * * *"), load_zone("Europe/Berlin"))
    # 01:10 UTC is 02:10 CET, inside the second instance: the next fire is 03:00 CET.
    assert timing.next_fire(datetime(2026, 10, 25, 1, 10)) == datetime(2026, 10, 25, 2, 0)
    # Exactly at the spring-forward instant the gap times are due at that very instant.
    timing = CronTiming(CronExpr.parse("30 2 * * *"), load_zone("Europe/Berlin"))
    assert timing.next_fire(datetime(2026, 3, 29, 1, 0)) == datetime(2026, 3, 29, 1, 0)
    assert timing.next_fire(datetime(2026, 3, 29, 1, 0, 0, 1)) == datetime(2026, 3, 30, 0, 30)


# ---------------------------------------------------------------------------- reference


def _exists(zone: object, local: datetime) -> bool:
    u = local.replace(tzinfo=zone).astimezone(UTC)  # type: ignore[arg-type]
    return u.astimezone(zone).replace(tzinfo=None) == local  # type: ignore[arg-type]


def reference_to_utc(zone: object, local: datetime) -> datetime:
    """Brute force: the earliest instant showing ``local``; in a gap, the instant of the
    first wall-clock time after it that exists."""
    cands = []
    for fold in (0, 1):
        u = local.replace(tzinfo=zone, fold=fold).astimezone(UTC)  # type: ignore[arg-type]
        if u.astimezone(zone).replace(tzinfo=None) == local:  # type: ignore[arg-type]
            cands.append(u.replace(tzinfo=None))
    if cands:
        return min(cands)
    m = local.replace(second=0) + timedelta(minutes=1)
    while not _exists(zone, m):
        m += timedelta(minutes=1)
    while m - timedelta(seconds=1) > local and _exists(zone, m - timedelta(seconds=1)):
        m -= timedelta(seconds=1)
    return m.replace(tzinfo=zone).astimezone(UTC).replace(tzinfo=None)  # type: ignore[arg-type]


def reference_fires(
    expr: str, zone_name: str, a: datetime, b: datetime, limit: int
) -> list[datetime]:
    """croniter's wall-clock iteration mapped by the brute-force policy, unique, in [a, b)."""
    zone = load_zone(zone_name)
    local_a = a.replace(tzinfo=UTC).astimezone(zone).replace(tzinfo=None) - timedelta(hours=3)
    it = croniter(expr, local_a - timedelta(seconds=1))
    out: list[datetime] = []
    while len(out) < limit:
        u = reference_to_utc(zone, it.get_next(datetime))
        if u >= b:
            break
        if u >= a and (not out or u != out[-1]):
            out.append(u)
    return out


ZONES = [
    "Europe/Berlin", "America/New_York", "Australia/Adelaide", "Australia/Lord_Howe",
    "Asia/Kolkata", "America/Sao_Paulo", "Europe/London", "Pacific/Chatham", "UTC",
    "America/St_Johns", "Asia/Tehran",
]  # fmt: skip
DENSE = [
    "* * * * *", "*/7 * * * *", "0,30 * * * *", "15 */2 * * *", "30 2 * * *",
    "*/20 1-3 * * *", "0 0,1,2,3 * * *", "45 1 * * 0", "0 3 * * *", "*/10 * * * * */20",
    "5 2 * * * 30", "59 1,2 * * *",
]  # fmt: skip


@st.composite
def windows(draw: st.DrawFn) -> tuple[datetime, datetime, str]:
    """Windows of up to two days, most of them around a DST transition."""
    zone = draw(st.sampled_from(ZONES))
    year = draw(st.integers(1995, 2045))
    transitions = cron_mod._transitions(
        load_zone(zone), datetime(year, 1, 1), datetime(year + 1, 1, 1)
    )
    if transitions and draw(st.integers(0, 4)):
        center = draw(st.sampled_from(transitions))[0]
    else:
        center = datetime(year, 1, 1) + timedelta(days=draw(st.integers(0, 364)))
    a = center - timedelta(seconds=draw(st.integers(0, 86_400)))
    b = center + timedelta(seconds=draw(st.integers(0, 86_400)))
    return a.replace(microsecond=0), b.replace(microsecond=0), zone


@PROPS
@given(expr=st.sampled_from(DENSE), window=windows())
def test_fire_times_equal_croniter_wall_clock_mapped_by_the_policy(
    expr: str, window: tuple[datetime, datetime, str]
) -> None:
    a, b, zone = window
    timing = CronTiming(CronExpr.parse(expr), load_zone(zone))
    got = timing.fires(a, b, limit=400)
    assert got == reference_fires(expr, zone, a, b, 400), (expr, zone, a, b)
    assert all(x < y for x, y in itertools.pairwise(got))  # unique, ordered
    if len(got) < 400:
        assert timing.count(a, b) == len(got)


@PROPS
@given(
    expr=st.sampled_from([*DENSE, "0 12 * * *", "0 0 L * *", "30 1 * * 1#1", "0 2 * 3,10 *"]),
    zone=st.sampled_from(ZONES),
    year=st.integers(1990, 2060),
    days=st.integers(1, 800),
)
def test_count_equals_iteration_over_long_windows(
    expr: str, zone: str, year: int, days: int
) -> None:
    timing = CronTiming(CronExpr.parse(expr), load_zone(zone))
    a = datetime(year, 2, 1, 7, 13, 5)
    b = a + timedelta(days=days, seconds=days * 37)
    n = timing.count(a, b)
    if n <= 5000:
        assert n == len(timing.fires(a, b))
    else:  # too many to iterate: check additivity of the count instead
        mid = a + (b - a) / 3
        assert n == timing.count(a, mid) + timing.count(mid, b)


# ---------------------------------------------------------------------------- assumptions


def _tzif_offset_changes(name: str) -> list[int]:
    data = importlib.resources.files("tzdata").joinpath("zoneinfo", *name.split("/")).read_bytes()
    assert data[:4] == b"TZif" and data[4] >= ord("2")
    isut, isstd, leap, timecnt, typecnt, charcnt = struct.unpack(">6l", data[20:44])
    v2 = data[44 + timecnt * 5 + typecnt * 6 + charcnt + leap * 8 + isstd + isut :]
    isut, isstd, leap, timecnt, typecnt, charcnt = struct.unpack(">6l", v2[20:44])
    times = struct.unpack(f">{timecnt}q", v2[44 : 44 + 8 * timecnt])
    idx = v2[44 + 8 * timecnt : 44 + 9 * timecnt]
    base = 44 + 9 * timecnt
    offs = [struct.unpack(">lBB", v2[base + 6 * i : base + 6 * i + 6])[0] for i in range(typecnt)]
    changes, prev = [], None
    for t, i in zip(times, idx, strict=True):
        if prev is not None and offs[i] != prev:
            changes.append(t)
        prev = offs[i]
    return changes


def test_offset_transitions_are_far_more_than_the_scan_step_apart() -> None:
    """pulse.cron finds transitions by scanning every 6 hours: no zone in the installed
    tzdata changes its offset twice within that (checked on the TZif files themselves)."""
    step = int(cron_mod._SCAN_STEP.total_seconds())
    closest = min(
        (b - a, name)
        for name in zone_names()
        for a, b in zip(*(lambda c: (c, c[1:]))(_tzif_offset_changes(name)), strict=False)
        if a >= -2_208_988_800  # since 1900
    )
    assert closest[0] > 4 * step, closest


@pytest.mark.parametrize("zone", ["Europe/Berlin", "Australia/Lord_Howe", "America/New_York"])
def test_transition_scan_finds_every_tzif_transition(zone: str) -> None:
    """The scan finds exactly the TZif file's explicit transitions (later ones come from the
    file's POSIX rule, which zoneinfo applies)."""
    changes = [t for t in _tzif_offset_changes(zone) if t >= 0]
    expected = [datetime(1970, 1, 1) + timedelta(seconds=t) for t in changes]
    found = [
        when
        for when, _, _ in cron_mod._transitions(
            load_zone(zone),
            datetime(1970, 1, 1),
            expected[-1] + timedelta(seconds=1),
        )
    ]
    assert found == expected
