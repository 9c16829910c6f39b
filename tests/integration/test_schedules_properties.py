"""Property: across simulated restarts (the scheduler run at random clock points, with random
batch sizes, possibly a new version published in the middle of the backlog), the fire times
written as occurrences are exactly the time line's — croniter's wall-clock iteration under
the DST policy, version by version — with no duplicate and no gap, when the catch-up window
covers the downtime."""

from __future__ import annotations

from collections.abc import AsyncIterator, Iterator
from datetime import datetime, timedelta
from typing import Any

import pytest
from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st
from pulse_fixtures import Tenant
from schedule_support import isolated_dsn, name, occurrences, put, quiesce, schedule_tasks, tenant

from orbit.storage import DSN, Database
from pulse import cron as cron_mod
from pulse.cron import ONE_US, CronExpr, CronTiming, IntervalTiming, load_zone
from pulse.scheduler import Scheduler

TEN_YEARS_MS = 10 * 365 * 86_400_000
ZONES = ["UTC", "Europe/Berlin", "America/New_York", "Australia/Adelaide", "Australia/Lord_Howe"]

minutes = st.sampled_from(["*/7", "0,30", "15", "*/20", "5-10", "59", "*/13", "0"])
hours = st.sampled_from(["*", "*/3", "1-3", "2", "0-4,22", "*/5"])
seconds = st.sampled_from(["", " 0,30", " */20", " 45"])
exprs = st.builds(lambda m, h, s: f"{m} {h} * * *{s}", minutes, hours, seconds)


@pytest.fixture(scope="module")
def sched_dsn() -> Iterator[DSN]:
    yield from isolated_dsn()


@pytest.fixture(scope="module")
async def sdb(sched_dsn: DSN) -> AsyncIterator[Database]:
    database = await Database.connect(sched_dsn, maxsize=4)
    try:
        yield database
    finally:
        await database.close()


_TENANTS: dict[str, Tenant] = {}


async def one_tenant(db: Database) -> Tenant:
    if "t" not in _TENANTS:
        _TENANTS["t"] = await tenant(db)
    return _TENANTS["t"]


@st.composite
def starts(draw: st.DrawFn, zone: str) -> datetime:
    """A creation time, most often close before a DST transition of ``zone``."""
    year = draw(st.integers(2001, 2059))
    trans = cron_mod._transitions(load_zone(zone), datetime(year, 1, 1), datetime(year + 1, 1, 1))
    if trans and draw(st.booleans()):
        base = draw(st.sampled_from(trans))[0]
    else:
        base = datetime(year, 1, 1) + timedelta(days=draw(st.integers(0, 360)))
    back = timedelta(
        seconds=draw(st.integers(0, 36 * 3600)), microseconds=draw(st.integers(0, 999_999))
    )
    return base - back


def _timing(
    kind: str, spec: Any, zone: str, start_at: datetime | None = None
) -> CronTiming | IntervalTiming:
    if kind == "cron":
        return CronTiming(CronExpr.parse(spec), load_zone(zone))
    return IntervalTiming(spec, load_zone(zone), start_at=start_at)


def _fields(kind: str, spec: Any, zone: str) -> dict[str, Any]:
    base: dict[str, Any] = {"timezone": zone, "catchup_window_ms": TEN_YEARS_MS, "grace_ms": 0}
    return {**base, "cron": spec} if kind == "cron" else {**base, "every_ms": spec}


@settings(
    max_examples=30,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
@given(data=st.data())
async def test_restarts_fire_exactly_the_time_line(
    sdb: Database, sched_dsn: DSN, data: st.DataObject
) -> None:
    t = await one_tenant(sdb)
    zone = data.draw(st.sampled_from(ZONES), "zone")
    kind = data.draw(st.sampled_from(["cron", "cron", "every"]), "kind")
    spec = data.draw(exprs if kind == "cron" else st.integers(1000, 3 * 3_600_000), "spec")
    created = data.draw(starts(zone), "created")
    first = _timing(kind, spec, zone).fires(created, created + timedelta(days=4), limit=40)
    assume(len(first) >= 2)
    k = data.draw(st.integers(1, len(first) - 1), "k")
    end = first[k] - timedelta(microseconds=data.draw(st.integers(1, 10**6), "jitter"))
    end = max(end, first[k - 1])
    switch = data.draw(st.booleans(), "switch")

    quiesce(sched_dsn)  # whatever an earlier (failed) example left behind
    try:
        s = name()
        await put(sdb, t, s, now=created, **_fields(kind, spec, zone))
        points = sorted(
            data.draw(
                st.lists(st.datetimes(min_value=created, max_value=end), max_size=5), "restarts"
            )
        )
        published: datetime | None = None
        kind2, spec2 = "cron", data.draw(exprs, "spec2")
        for p in [*points, end]:
            batch = data.draw(st.integers(1, 8), "batch")
            assert (await Scheduler(sdb, now=p, batch=batch).run_once()).errors == 0
            if switch and published is None and data.draw(st.booleans(), "publish_now"):
                view = await put(sdb, t, s, now=p, **_fields(kind2, spec2, zone))
                if view["version"] == 2:  # (an identical version is a no-op)
                    published = datetime.fromisoformat(view["published_at"].replace("Z", ""))
        assert (await Scheduler(sdb, now=end).run_once()).errors == 0

        v1 = _timing(kind, spec, zone)
        upto = end + ONE_US
        if published is None:
            expected = [(f, 1) for f in v1.fires(created, upto)]
        else:
            v2 = _timing(kind2, spec2, zone)
            expected = [(f, 1) for f in v1.fires(created, min(published, upto))]
            expected += [(f, 2) for f in v2.fires(published, upto)]
        occ = await occurrences(sdb, t, s)
        assert [(o["fire_at"], o["version"]) for o in occ] == expected
        assert all(o["outcome"] == "created" and o["task_id"] is not None for o in occ)
        tasks = {x["source_id"]: x for x in await schedule_tasks(sdb, t)}
        assert all(tasks[o["id"]]["id"] == o["task_id"] for o in occ)
    finally:
        quiesce(sched_dsn)
