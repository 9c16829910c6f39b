"""Pure logic of the platform: metrics exposition, JSON depth, field names of decode errors,
cursors, preconditions, key format, time format, the SQL guard's checker."""

from __future__ import annotations

import time
from datetime import UTC, datetime, timedelta, timezone

import msgspec
import pytest
import sql_guard
from hypothesis import given
from hypothesis import strategies as st

from orbit.credentials import format_key, parse_key
from orbit.errors import InvalidRequest, PreconditionFailed
from orbit.http.body import decode, json_depth
from orbit.metrics import Registry
from orbit.pagination import decode_cursor, encode_cursor, parse_limit
from orbit.preconditions import Preconditions, parse_tags
from orbit.times import format_time, parse_time
from orbit.types import CredentialCreate, ResourcesPut


def test_metrics_text_exposition() -> None:
    reg = Registry()
    c = reg.counter("x_total", "Things", ("kind",))
    c.inc(kind='a"b\\c')
    c.inc(2, kind="z")
    g = reg.gauge("y", "Level")
    g.set(1.5)
    h = reg.histogram("d_seconds", "Durations", ("route",), buckets=(0.1, 1.0))
    h.observe(0.05, route="/r")
    h.observe(5, route="/r")
    assert reg.counter("x_total", "Things", ("kind",)) is c
    with pytest.raises(ValueError):
        reg.gauge("x_total", "Things", ("kind",))
    with pytest.raises(ValueError):
        c.inc(kind="a", extra="b")
    text = reg.render()
    assert "# TYPE x_total counter" in text
    assert 'x_total{kind="a\\"b\\\\c"} 1' in text and 'x_total{kind="z"} 2' in text
    assert "y 1.5" in text
    assert 'd_seconds_bucket{route="/r",le="0.1"} 1' in text
    assert 'd_seconds_bucket{route="/r",le="1"} 1' in text
    assert 'd_seconds_bucket{route="/r",le="+Inf"} 2' in text
    assert 'd_seconds_count{route="/r"} 2' in text and 'd_seconds_sum{route="/r"} 5.05' in text


def brute_depth(value: object) -> int:
    if isinstance(value, dict):
        return 1 + max((brute_depth(v) for v in value.values()), default=0)
    if isinstance(value, list):
        return 1 + max((brute_depth(v) for v in value), default=0)
    return 0


json_docs = st.recursive(
    st.none() | st.integers() | st.text(alphabet='ab[]{}"\\', max_size=5),
    lambda c: (
        st.lists(c, max_size=3)
        | st.dictionaries(st.text(alphabet='k[{"\\', max_size=3), c, max_size=3)
    ),
    max_leaves=20,
)


@given(json_docs)
def test_json_depth_matches_the_parsed_structure(value: object) -> None:
    assert json_depth(msgspec.json.encode(value)) == brute_depth(value)


@given(json_docs, st.integers(min_value=0, max_value=200))
def test_json_depth_of_a_cut_document_is_at_most_its_open_brackets(value: object, cut: int) -> None:
    # A body cut anywhere (an unterminated string, a lone trailing backslash) still gets an
    # answer, never above the number of opening brackets in it.
    body = msgspec.json.encode(value)[:cut]
    assert 0 <= json_depth(body) <= body.count(b"[") + body.count(b"{")


@pytest.mark.parametrize(
    "body",
    [
        b'{"a": "' + b'\\"[' * 350_000,
        b'{"a": "' + b'\\"[' * 350_000 + b"\\",
        b'"' * 1_048_576,
        b"[" * 1_048_576,
        b'["' + b'a",["' * 200_000,
    ],
    ids=["escaped-quotes", "trailing-backslash", "quotes", "open-brackets", "many-strings"],
)
def test_json_depth_is_linear_on_hostile_megabytes(body: bytes) -> None:
    # Linear: tens of milliseconds for 1 MiB. The quadratic string skip took minutes here,
    # so the bound only separates the two shapes; it is not a speed measurement.
    start = time.perf_counter()
    json_depth(body)
    assert time.perf_counter() - start < 3.0


@pytest.mark.parametrize(
    ("body", "type_", "field"),
    [
        (b'{"name": 1, "namespaces": [], "actions": []}', CredentialCreate, "name"),
        (
            b'{"name": "k", "namespaces": ["a", 2], "actions": []}',
            CredentialCreate,
            "namespaces[1]",
        ),
        (b'{"name": "k", "namespaces": [], "actions": [], "bogus": 1}', CredentialCreate, "bogus"),
        (b'{"name": "k", "actions": []}', CredentialCreate, "namespaces"),
        (b'{"max_active_attempts": -1}', ResourcesPut, "max_active_attempts"),
        (b'{"max_active_attempts": 1.5}', ResourcesPut, "max_active_attempts"),
    ],
)
def test_decode_names_the_field(body: bytes, type_: type, field: str) -> None:
    with pytest.raises(InvalidRequest) as info:
        decode(body, type_)
    assert info.value.details["field"] == field


def test_resources_put_tells_null_from_absent() -> None:
    put = decode(b'{"max_active_attempts": null}', ResourcesPut)
    assert put.max_active_attempts is None and put.max_unfinished_tasks is msgspec.UNSET


def test_cursors_are_bound_to_filters() -> None:
    cur = encode_cursor({"after": "x"}, {"state": "A"})
    assert decode_cursor(cur, {"state": "A"}) == {"after": "x"}
    assert decode_cursor(None) is None
    for bad, filters in ((cur, {"state": "B"}), ("!!!", {}), ("e30", {})):
        with pytest.raises(InvalidRequest) as info:
            decode_cursor(bad, filters)
        assert info.value.details["field"] == "cursor"
    assert parse_limit(None) == 50 and parse_limit("500") == 500
    for bad_limit in ("0", "501", "-1", "x"):
        with pytest.raises(InvalidRequest):
            parse_limit(bad_limit)


def test_preconditions() -> None:
    assert parse_tags('"1", W/"2", "x", *') == (True, frozenset({1}))
    Preconditions(if_match=frozenset({3})).check(3)
    with pytest.raises(PreconditionFailed):
        Preconditions(if_match=frozenset({3})).check(4)
    with pytest.raises(PreconditionFailed):
        Preconditions(if_match=frozenset()).check(4)  # only weak/malformed tags: never matches
    with pytest.raises(PreconditionFailed):
        Preconditions(if_match=frozenset({3})).check(None)
    Preconditions(if_match=frozenset(), if_match_any=True).check(7)
    with pytest.raises(PreconditionFailed):
        Preconditions(if_match=frozenset(), if_match_any=True).check(None)
    Preconditions(if_none_match_any=True).check(None)
    with pytest.raises(PreconditionFailed):
        Preconditions(if_none_match_any=True).check(1)


def test_key_format_round_trip() -> None:
    cred = bytes(range(16))
    key = format_key(cred, "s3cr-et_" + "x" * 35)
    assert key.startswith("orb_000102030405060708090a0b0c0d0e0f_")
    assert parse_key(key) == (cred, "s3cr-et_" + "x" * 35)
    for bad in (
        "",
        "orb_",
        "orb_XYZ_secret",
        f"orx_{cred.hex()}_{'x' * 43}",
        f"orb_{cred.hex()}_short",
        f"orb_{cred.hex()}_{'x' * 43}!",
    ):
        assert parse_key(bad) is None


def test_times() -> None:
    assert format_time(datetime(2026, 11, 29, 21, 30)) == "2026-11-29T21:30:00.000000Z"
    assert (
        format_time(datetime(2026, 1, 1, 1, tzinfo=timezone(timedelta(hours=1))))
        == "2026-01-01T00:00:00.000000Z"
    )
    assert parse_time("2026-11-29T21:30:00.123456Z") == datetime(2026, 11, 29, 21, 30, 0, 123456)
    assert parse_time("2026-11-29T23:30:00+02:00") == datetime(2026, 11, 29, 21, 30)
    for bad in ("2026-11-29", "2026-11-29T21:30:00", "2026-11-29T21:30:00.1234567Z", "soon"):
        with pytest.raises(ValueError):
            parse_time(bad)
    assert parse_time(format_time(datetime.now(UTC))).tzinfo is None


def test_sql_guard_checker() -> None:
    tables = {"orbit_events", "pulse_tasks"}
    ok = [
        "SELECT * FROM pulse_tasks WHERE namespace_id = %(ns)s AND id = %(id)s",
        "INSERT INTO orbit_events (namespace_id, id) VALUES (%s, %s)",
        "UPDATE pulse_tasks SET state = 'X' WHERE namespace_id = %s AND id = %s",
        "SELECT * FROM orbit_applications WHERE id = %s",  # not a runtime table
        "SELECT t.id FROM pulse_tasks t JOIN orbit_events e ON e.namespace_id = t.namespace_id WHERE t.namespace_id = %s",
    ]
    bad = [
        "SELECT * FROM pulse_tasks WHERE id = %s",
        "DELETE FROM orbit_events WHERE created_at < %s",
        "UPDATE pulse_tasks SET state = 'X'",
        "SELECT * FROM pulse_tasks WHERE id = %s -- namespace_id in a comment does not count",
    ]
    assert [sql_guard.violation(s, tables) for s in ok] == [None] * len(ok)
    assert [sql_guard.violation(s, tables) for s in bad] == [
        "pulse_tasks",
        "orbit_events",
        "pulse_tasks",
        "pulse_tasks",
    ]
    assert "orbit_result_events" in sql_guard.runtime_tables()
    assert "orbit_credentials" not in sql_guard.runtime_tables()


def test_every_named_query_passes_the_sql_guard() -> None:
    """Static form of the guard: all queries of all packages, executed by tests or not."""
    assert sql_guard.violations(sql_guard.known_queries()) == []


def test_a_quiet_subscription_stream_rechecks_less_often() -> None:
    from orbit.http.subscription_stream import StreamOptions, recheck_period

    default = StreamOptions()
    assert recheck_period(default, quiet=False) == 2.0
    assert recheck_period(default, quiet=True) == 10.0  # five times poll_s
    fast = StreamOptions(poll_s=0.1)
    assert recheck_period(fast, quiet=True) == 0.5
    assert recheck_period(StreamOptions(quiet_poll_s=30.0), quiet=True) == 30.0
