"""Real processes: ``orbit-server`` (python -m orbit_cmd.server) on a free port and the ``orbit``
CLI (python -m orbit_cmd.cli), talking HTTP and SQL like an operator would."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Iterator
from typing import Any

import httpx
import msgspec
import pymysql
import pytest
from platform_fixtures import ServerProcess, process_env, run_cli, unique

from orbit import migrate
from orbit.storage import DSN

pytestmark = pytest.mark.process


def start_server_expecting_exit(dsn: DSN) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "orbit_cmd.server", "--dsn", dsn.url(hide_password=False), "--port", "1", "--plain-logs"],
        env=process_env(), capture_output=True, text=True, timeout=60, check=False,
    )  # fmt: skip


def test_server_refuses_an_unmigrated_database(empty_db: DSN) -> None:
    r = start_server_expecting_exit(empty_db)
    assert r.returncode == 1
    assert "refusing to start" in r.stderr and "0001_platform.sql" in r.stderr


def test_server_refuses_a_foreign_key(empty_db: DSN) -> None:
    migrate.up(empty_db)
    conn = pymysql.connect(autocommit=True, **empty_db.connect_kwargs())
    try:
        with conn.cursor() as cur:
            cur.execute("CREATE TABLE fk_parent (id INT PRIMARY KEY) ENGINE=InnoDB")
            cur.execute(
                "CREATE TABLE fk_child (pid INT, CONSTRAINT fk_x FOREIGN KEY (pid) REFERENCES fk_parent (id)) ENGINE=InnoDB"
            )
    finally:
        conn.close()
    r = start_server_expecting_exit(empty_db)
    assert r.returncode == 1
    assert "foreign key" in r.stderr and "fk_x" in r.stderr


def test_server_exits_3_when_the_database_is_unreachable(dsn: DSN) -> None:
    r = start_server_expecting_exit(DSN(host="127.0.0.1", port=1, database="orbit"))
    assert r.returncode == 3 and "unreachable" in r.stderr


@pytest.fixture(scope="module")
def server(dsn: DSN) -> Iterator[ServerProcess]:
    s = ServerProcess(dsn)
    try:
        s.wait_ready()
        yield s
    finally:
        code = s.stop()
        assert code == 0, "orbit-server did not shut down cleanly on SIGTERM"


def bootstrap_cli(dsn: DSN, app: str, *extra: str) -> dict[str, str]:
    r = run_cli(
        "admin",
        "bootstrap",
        "--application",
        app,
        "--namespace",
        "default",
        "--dsn",
        dsn.url(hide_password=False),
        *extra,
    )
    assert r.returncode == 0, r.stderr
    lines = r.stdout.splitlines()
    assert len(lines) == 1
    out: dict[str, Any] = json.loads(lines[0])
    assert {"application_id", "namespace", "credential_id", "key", "created"} <= set(out)
    if out["key"] is None:  # a re-run: says so, on stdout (the line) and stderr (for humans)
        assert "already exist" in out["hint"] and "--rotate" in r.stderr
    return out


def cli(server: ServerProcess, key: str, *args: str) -> subprocess.CompletedProcess[str]:
    return run_cli(*args, env=process_env(ORBIT_URL=server.url, ORBIT_KEY=key))


def test_two_cli_tenants_manage_only_their_own_namespaces(server: ServerProcess, dsn: DSN) -> None:
    a_name, b_name = unique("cli-a"), unique("cli-b")
    a, b = bootstrap_cli(dsn, a_name), bootstrap_cli(dsn, b_name)
    again = bootstrap_cli(dsn, a_name)
    assert (
        again["application_id"] == a["application_id"]
        and again["credential_id"] == a["credential_id"]
    )
    # A re-run changes nothing: no key is printed and the first one keeps working.
    assert again["key"] is None and again["created"]["credential"] is False
    who = {"Authorization": f"Bearer {a['key']}"}
    assert httpx.get(server.url + "/v1/whoami", headers=who).status_code == 200
    # --rotate prints a new key once; the previous one stops working.
    rotated = bootstrap_cli(dsn, a_name, "--rotate")
    assert rotated["rotated"] is True and rotated["credential_id"] == a["credential_id"]
    assert httpx.get(server.url + "/v1/whoami", headers=who).status_code == 401
    a_key = rotated["key"]
    assert bootstrap_cli(dsn, a_name)["key"] is None  # and a re-run keeps the new one
    assert cli(server, a_key, "whoami").returncode == 0

    assert cli(server, a_key, "namespaces", "create", "extra").returncode == 0
    listed = cli(server, a_key, "namespaces", "list", "--json")
    assert listed.returncode == 0
    page = json.loads(listed.stdout)  # the server's answer, not a bare array
    assert set(page) == {"items", "next_cursor"} and page["next_cursor"] is None
    assert sorted(n["name"] for n in page["items"]) == ["default", "extra"]
    table = cli(server, a_key, "namespaces", "list")
    assert table.stdout.splitlines()[0].split()[:2] == ["ID", "NAME"] and "extra" in table.stdout

    # Tenant A cannot touch tenant B: the same 404 as an unknown application, exit code 1.
    denied = cli(server, a_key, "namespaces", "create", "x", "--application", b["application_id"])
    assert denied.returncode == 1 and "404 not_found" in denied.stderr
    b_list = cli(server, b["key"], "namespaces", "list", "--json")
    assert [n["name"] for n in json.loads(b_list.stdout)["items"]] == ["default"]


def test_cli_credentials_and_resources(server: ServerProcess, dsn: DSN) -> None:
    t = bootstrap_cli(dsn, unique("cli"))
    created = cli(
        server,
        t["key"],
        "credentials",
        "create",
        "--name",
        "ci",
        "--namespace",
        "default",
        "--action",
        "tasks.read",
        "--json",
    )
    assert created.returncode == 0, created.stderr
    cred = json.loads(created.stdout)
    assert cred["key"].startswith("orb_") and cred["actions"] == ["tasks.read"]
    who = cli(server, cred["key"], "whoami", "--json")
    assert who.returncode == 0 and json.loads(who.stdout)["actions"] == ["tasks.read"]
    assert cli(server, cred["key"], "namespaces", "list").returncode == 1  # 403: no admin
    assert cli(server, t["key"], "credentials", "revoke", cred["id"]).returncode == 0
    assert cli(server, cred["key"], "whoami").returncode == 1  # revoked: 401 on the next request
    listed = json.loads(cli(server, t["key"], "credentials", "list", "--json").stdout)["items"]
    assert {c["id"]: c["revoked_at"] is not None for c in listed} == {
        t["credential_id"]: False,
        cred["id"]: True,
    }

    set_ = cli(
        server,
        t["key"],
        "resources",
        "set",
        "--max-active-attempts",
        "3",
        "--max-starts-per-second",
        "unlimited",
        "--json",
    )
    assert set_.returncode == 0 and json.loads(set_.stdout)["max_active_attempts"] == 3
    stale = cli(
        server, t["key"], "resources", "set", "--max-active-attempts", "4", "--if-match", "1"
    )
    assert stale.returncode == 1 and "412" in stale.stderr
    got = json.loads(cli(server, t["key"], "resources", "get", "--json").stdout)
    assert got["max_active_attempts"] == 3 and got["revision"] == 2


def test_cli_exit_codes_for_configuration_and_connection(server: ServerProcess) -> None:
    env = process_env()
    env.pop("ORBIT_URL", None)
    env.pop("ORBIT_KEY", None)
    missing = run_cli("whoami", env=env)
    assert missing.returncode == 2 and "ORBIT_URL" in missing.stderr
    unreachable = run_cli(
        "whoami", env=process_env(ORBIT_URL="http://127.0.0.1:1", ORBIT_KEY="orb_x")
    )
    assert unreachable.returncode == 3
    usage = run_cli("applications", "frobnicate")
    assert usage.returncode == 2
    bad_dsn = run_cli(
        "admin",
        "bootstrap",
        "--application",
        "a",
        "--namespace",
        "n",
        "--dsn",
        "mysql://root@127.0.0.1:1/orbit",
    )
    assert bad_dsn.returncode == 3


def test_real_server_serves_the_open_endpoints(server: ServerProcess) -> None:
    assert httpx.get(server.url + "/readyz").json()["status"] == "ready"
    assert "orbit_http_requests_total" in httpx.get(server.url + "/metrics").text
    assert "/v1/applications" in httpx.get(server.url + "/openapi.json").json()["paths"]
    r = httpx.get(server.url + "/v1/whoami", headers={"X-Request-Id": "abc-123"})
    assert r.status_code == 401 and r.headers["x-request-id"] == "abc-123"


def test_dev_mode_migrates_bootstraps_and_prints_the_key(server_dsn: DSN) -> None:
    """``--dev`` with a reachable server: create + migrate the database, bootstrap demo/default
    and print the JSON line before serving (the private-database path is tested with devdb)."""
    from conftest import drop_database

    target = server_dsn.with_database(f"orbit_test_dev_{unique('x').split('-')[1]}")

    def start(*extra: str) -> tuple[ServerProcess, dict[str, Any]]:
        s = ServerProcess(target, "--dev", *extra)
        s.wait_ready(timeout=60)
        assert s.proc.stdout is not None
        return s, json.loads(s.proc.stdout.readline())

    def whoami(s: ServerProcess, key: str) -> httpx.Response:
        return httpx.get(s.url + "/v1/whoami", headers={"Authorization": f"Bearer {key}"})

    s: ServerProcess | None = None
    try:
        s, line = start()
        assert {"application_id", "namespace", "credential_id", "key"} <= set(line)
        assert line["namespace"] == "default" and line["created"]["credential"] is True
        who = whoami(s, line["key"])
        assert who.status_code == 200 and who.json()["global_admin"] is True
        assert s.stop() == 0
        # A restart on the same database keeps the key working and prints it as null.
        s, again = start()
        assert again["key"] is None and "hint" in again
        assert whoami(s, line["key"]).status_code == 200
        assert s.stop() == 0
        # --rotate-key (what the demo does) prints a new key; the old one stops working.
        s, rotated = start("--rotate-key")
        assert rotated["rotated"] is True and whoami(s, rotated["key"]).status_code == 200
        assert whoami(s, line["key"]).status_code == 401
    finally:
        if s is not None:
            assert s.stop() == 0
        drop_database(target)


def test_platform_lists_print_the_servers_answer_byte_for_byte(
    server: ServerProcess, dsn: DSN
) -> None:
    t = bootstrap_cli(dsn, unique("cli"))
    app = t["application_id"]
    for words, path in (
        (("namespaces", "list"), f"/v1/applications/{app}/namespaces"),
        (("credentials", "list"), f"/v1/applications/{app}/credentials"),
        (("applications", "list"), "/v1/applications"),
    ):
        out = cli(server, t["key"], *words, "--json", "--limit", "10")
        assert out.returncode == 0, out.stderr
        answer = httpx.get(
            server.url + path, params={"limit": 10},
            headers={"Authorization": f"Bearer {t['key']}"},
        )  # fmt: skip
        assert json.loads(out.stdout) == answer.json(), words
        page = msgspec.json.decode(answer.content, type=dict[str, msgspec.Raw])
        for item in msgspec.json.decode(page["items"], type=list[msgspec.Raw]):
            assert bytes(item).decode() in out.stdout  # each item as the server sent it
    # One page, more with --cursor / --all (like every other list command).
    cli(server, t["key"], "namespaces", "create", "second")
    one = json.loads(cli(server, t["key"], "namespaces", "list", "--limit", "1", "--json").stdout)
    assert len(one["items"]) == 1 and one["next_cursor"]
    every = json.loads(cli(server, t["key"], "namespaces", "list", "--all", "--json").stdout)
    assert len(every["items"]) == 2 and every["next_cursor"] is None


def test_a_closed_output_pipe_ends_quietly(server: ServerProcess, dsn: DSN) -> None:
    """``orbit … | head``: when the reader goes away, no traceback — exit 141 like a Unix
    tool killed by SIGPIPE (here the pipe is closed before the first write)."""
    t = bootstrap_cli(dsn, unique("cli"))
    for args in (
        ("namespaces", "list"),
        ("namespaces", "list", "--json"),
        ("admin", "bootstrap", "--application", unique("pipe"), "--namespace", "n",
         "--dsn", dsn.url(hide_password=False)),
    ):  # fmt: skip
        read, write = os.pipe()
        os.close(read)
        try:
            proc = subprocess.run(
                [sys.executable, "-m", "orbit_cmd.cli", *args],
                env=process_env(ORBIT_URL=server.url, ORBIT_KEY=t["key"]),
                stdout=write, stderr=subprocess.PIPE, text=True, timeout=60, check=False,
            )  # fmt: skip
        finally:
            os.close(write)
        assert "Traceback" not in proc.stderr and "BrokenPipe" not in proc.stderr, proc.stderr
        assert proc.returncode == 141, (args, proc.returncode, proc.stderr)
