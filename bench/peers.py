"""Peers on the local PostgreSQL: PgQueuer and Procrastinate, each measured by its own
documented benchmark method, in a subprocess that imports them from ``PEERS_DIR`` (installed
by ``bench/install-peers``; never added to Orbit's environment).

PgQueuer (its ``tools/benchmark.py`` method): *throughput* — 1 enqueuer inserting batches of
10 while 5 consumers dequeue batches of 10 with no-op handlers, rate = jobs handled / time;
*drain* — N jobs enqueued up front, 5 consumers drain them (rate = N / time). Plus, measured
the way Orbit's S2/S3 are: *one-by-one enqueue* (16 concurrent connections each inserting
one job per call) and *latency* (one job at a time, enqueue → handler start, LISTEN/NOTIFY).

Procrastinate: *drain* (N jobs deferred in bulk, one worker with concurrency 10) and
one-by-one defer with 16 concurrent callers.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import secrets
import subprocess
import sys
from typing import Any

from bench.env import PEERS_DIR, ROOT


def _available() -> str | None:
    """None when the peers can be imported, else why not."""
    if not PEERS_DIR.is_dir():
        return f"not installed: run bench/install-peers (expected in {PEERS_DIR})"
    probe = subprocess.run(
        [sys.executable, "-c", "import pgqueuer, procrastinate, asyncpg"],
        env={**os.environ, "PYTHONPATH": str(PEERS_DIR)},
        capture_output=True,
        text=True,
    )
    if probe.returncode != 0:
        return "import failed: " + probe.stderr.strip().splitlines()[-1]
    ok = subprocess.run(
        ["psql", "-h", "127.0.0.1", "-U", "postgres", "-Atc", "SELECT 1"],
        capture_output=True,
        text=True,
    )
    if ok.returncode != 0:
        return "no local PostgreSQL at 127.0.0.1 (user postgres)"
    return None


def _psql(sql: str) -> None:
    subprocess.run(
        ["psql", "-h", "127.0.0.1", "-U", "postgres", "-v", "ON_ERROR_STOP=1", "-qc", sql],
        check=True,
        capture_output=True,
    )


async def _child(kind: str, args: dict[str, Any], limit_s: float) -> dict[str, Any]:
    env = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join([str(PEERS_DIR), str(ROOT)]),
    }
    proc = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "bench.peer_child", kind, json.dumps(args),
        stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE, env=env, cwd=ROOT,
    )  # fmt: skip
    try:
        out, err = await asyncio.wait_for(proc.communicate(), limit_s)
    except TimeoutError:
        proc.kill()
        await proc.wait()
        return {"error": f"timed out after {limit_s}s"}
    if proc.returncode != 0:
        return {"error": err.decode(errors="replace")[-800:]}
    return json.loads(out.decode().strip().splitlines()[-1])  # type: ignore[no-any-return]


async def run_all(*, quick: bool = False) -> dict[str, Any]:
    why = _available()
    if why is not None:
        return {"pgqueuer": {"not_measured": why}, "procrastinate": {"not_measured": why}}
    db = f"orbit_bench_peer_{secrets.token_hex(3)}"
    _psql(f"CREATE DATABASE {db}")
    dsn = f"postgresql://postgres@127.0.0.1:5432/{db}"
    seconds = 5.0 if quick else 15.0
    jobs = 5_000 if quick else 20_000
    try:
        pgq: dict[str, Any] = {}
        pgq["throughput"] = await _child("pgq-throughput", {"dsn": dsn, "seconds": seconds}, 120)
        pgq["drain"] = await _child("pgq-drain", {"dsn": dsn, "jobs": jobs}, 180)
        pgq["enqueue_one_by_one"] = await _child(
            "pgq-enqueue-one", {"dsn": dsn, "seconds": seconds / 2, "clients": 16}, 120
        )
        pgq["latency"] = await _child("pgq-latency", {"dsn": dsn, "n": 40 if quick else 200}, 180)
        pro: dict[str, Any] = {}
        # Procrastinate drains far slower (one job per fetch): fewer jobs, bounded time.
        pro["drain"] = await _child("pro-drain", {"dsn": dsn, "jobs": jobs // 10}, 150)
        pro["defer_one_by_one"] = await _child(
            "pro-defer-one", {"dsn": dsn, "seconds": seconds / 2, "clients": 16}, 120
        )
        return {"pgqueuer": pgq, "procrastinate": pro, "postgres_database": "dropped"}
    finally:
        with contextlib.suppress(subprocess.CalledProcessError):
            _psql(f"DROP DATABASE IF EXISTS {db} WITH (FORCE)")
