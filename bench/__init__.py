"""Orbit's benchmark suite: ``python -m bench`` (see bench/README.md).

Everything runs on this machine against the real processes: a scratch MariaDB database
migrated with ``orbit-migrate up``, the real ``orbit-server`` as a subprocess, SDK workers as
separate processes, HTTP/WebSocket clients in the driver process. Baselines (the raw
database lifecycle and the peers) run in the same invocation so ratios compare like with
like on a shared, loaded 2-core box.
"""
