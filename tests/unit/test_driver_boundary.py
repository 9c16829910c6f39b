"""Driver exceptions stop at the storage boundary: only ``orbit/storage`` (the pool and the
translation of errors), ``orbit/migrate`` (synchronous migrations) import a MySQL driver (the private dev database
lives in the composition root, ``cmd/orbit_cmd/devdb.py``). Every other module sees Orbit's own errors
(``orbit.storage.errors``: CheckViolation, DuplicateKey, LockConflict, ConnectionRefused…)."""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
DRIVERS = {"pymysql", "aiomysql", "asyncmy", "MySQLdb"}
ALLOWED = ("orbit/storage/", "orbit/migrate/")


def _driver_imports(path: Path) -> list[str]:
    found = []
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            names = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            names = [node.module]
        else:
            continue
        found += [n for n in names if n.split(".")[0] in DRIVERS]
    return found


def test_no_service_or_http_module_imports_a_driver() -> None:
    leaks = {}
    for package in ("orbit", "pulse", "weave"):
        for path in sorted((ROOT / package).rglob("*.py")):
            rel = path.relative_to(ROOT).as_posix()
            if rel.startswith(ALLOWED):
                continue
            if names := _driver_imports(path):
                leaks[rel] = names
    assert not leaks, f"driver imported outside orbit/storage: {leaks}"


def test_one_mapping_from_errors_to_http_and_websocket() -> None:
    from orbit.http.errors import client_error, ws_close_code
    from orbit.storage import (
        CheckViolation,
        ConnectionRefused,
        DatabaseError,
        LockConflict,
        NodeNotReady,
        PoolExhausted,
    )
    from orbit.storage.errors import from_driver
    from pulse.errors import SessionGone
    from pulse.hub import CLOSE_SESSION_GONE

    check = client_error(CheckViolation(4025, "CONSTRAINT `ck_x` failed"))
    assert check is not None and (check.status, check.code) == (400, "invalid_request")
    assert check.details["constraint"] == "CONSTRAINT `ck_x` failed"
    for exc, reason in (
        (ConnectionRefused(1226, "too many"), "connection_limit"),
        (NodeNotReady(1047, "WSREP"), "cluster_not_primary"),
        (PoolExhausted(1.0, 4), "pool_exhausted"),
    ):
        err = client_error(exc)
        assert err is not None and (err.status, err.code) == (503, "not_ready")
        assert err.details["reason"] == reason and err.headers()["Retry-After"] == "1"
    assert client_error(DatabaseError(1064, "syntax")) is None  # internal: logged, 500
    assert client_error(ValueError("bug")) is None
    gone = client_error(SessionGone())
    assert gone is not None and (gone.status, gone.code) == (401, "unauthenticated")
    assert ws_close_code(gone) == CLOSE_SESSION_GONE == 4401

    class Driver(Exception):
        pass

    assert type(from_driver(Driver(4025, "check"))) is CheckViolation
    assert type(from_driver(Driver(1213, "deadlock"))) is LockConflict
    assert type(from_driver(Driver(1040, "too many"))) is ConnectionRefused
    dup = from_driver(Driver(1062, "Duplicate entry 'a' for key 't.uq_t_name'"))
    assert getattr(dup, "key", None) == "uq_t_name"
