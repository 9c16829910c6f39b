"""Pure storage helpers: DSN parsing, ids and digests, SQL file parsing."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from orbit import ids
from orbit.storage.dsn import DEFAULT_DSN, DSN
from orbit.storage.errors import duplicate_key_name
from orbit.storage.sqlfile import parse_queries


def test_dsn_default_and_full() -> None:
    d = DSN.parse(DEFAULT_DSN)
    assert (d.user, d.password, d.host, d.port, d.database) == ("root", "", "127.0.0.1", 3306, "orbit")
    d = DSN.parse("mysql://app:s%40cret@db.example:3307/orbit_prod")
    assert (d.user, d.password, d.host, d.port, d.database) == (
        "app", "s@cret", "db.example", 3307, "orbit_prod")
    assert d.connect_kwargs() == {
        "user": "app", "password": "s@cret", "host": "db.example", "port": 3307, "db": "orbit_prod"}
    assert "s@cret" not in str(d) and "***" in str(d)


def test_dsn_unix_socket() -> None:
    d = DSN.parse("mysql://root@localhost/orbit?unix_socket=/run/mysqld/mysqld.sock")
    kw = d.connect_kwargs()
    assert kw["unix_socket"] == "/run/mysqld/mysqld.sock" and "host" not in kw
    assert DSN.parse(d.url(hide_password=False)) == d


@pytest.mark.parametrize(
    "bad",
    ["postgres://x@h/db", "mysql://root@h", "mysql://root@h/", "mysql://root@h/a/b",
     "mysql://root@h:notaport/db", "mysql://root@h/db?sslmode=x"],
)
def test_dsn_rejects(bad: str) -> None:
    with pytest.raises(ValueError):
        DSN.parse(bad)


def test_dsn_from_env(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("ORBIT_DSN", "mysql://u@h:1234/x")
    assert DSN.from_env().port == 1234
    assert DSN.from_env("mysql://u@h/y").database == "y"
    monkeypatch.delenv("ORBIT_DSN")
    assert DSN.from_env() == DSN.parse(DEFAULT_DSN)


@given(st.binary(min_size=16, max_size=16))
def test_id_round_trip(raw: bytes) -> None:
    text = ids.id_hex(raw)
    assert len(text) == 32 and text == text.lower()
    assert ids.parse_id(text) == raw


@pytest.mark.parametrize("bad", ["", "0" * 31, "0" * 33, "G" * 32, "A" * 32, "0" * 30 + "-1"])
def test_parse_id_rejects(bad: str) -> None:
    assert ids.parse_id(bad) is None


def test_new_ids_are_random_and_secrets_digest() -> None:
    assert len({ids.new_id() for _ in range(1000)}) == 1000
    secret = ids.new_secret()
    d = ids.digest(secret)
    assert len(d) == 32
    assert ids.digest_matches(secret, d)
    assert not ids.digest_matches(secret + "x", d)


def test_parse_queries() -> None:
    q = parse_queries(
        "-- name: a_get\nSELECT 1;\n\n-- name: b_update_if_x\nUPDATE t\n  SET x = 1;\n"
    )
    assert q.a_get == "SELECT 1"
    assert q["b_update_if_x"] == "UPDATE t\n  SET x = 1"
    with pytest.raises(AttributeError):
        _ = q.nope
    with pytest.raises(ValueError):
        parse_queries("-- name: a\nSELECT 1;\n-- name: a\nSELECT 2;")


def test_duplicate_key_name() -> None:
    import pymysql

    exc = pymysql.err.IntegrityError(1062, "Duplicate entry 'x' for key 'uq_pulse_tasks_identity'")
    assert duplicate_key_name(exc) == "uq_pulse_tasks_identity"
    exc = pymysql.err.IntegrityError(1062, "Duplicate entry 'x' for key 'pulse_tasks.uq_t'")
    assert duplicate_key_name(exc) == "uq_t"
