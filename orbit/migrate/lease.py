"""The cluster-wide migration lock on a Galera cluster.

On one server ``orbit-migrate`` serialises runs with ``GET_LOCK``. On a Galera cluster that
lock (like every row lock) is local to the node that grants it: two runs started through two
nodes would both get it and apply DDL at the same time. So on a Galera node (``wsrep_on``)
the runner also takes this lease, one row of ``orbit_schema_lock``:

* **Claim**: in one transaction, lock the row and insert it (free) or take it over (its
  ``expires_at`` passed); a live row of another run means "wait". Two nodes claiming at
  once both write the row; certification lets one COMMIT through and aborts the other with
  1213, which retries and then sees the winner. Times are the database clock.
* **Renewal**: a thread renews the row every ``renew_s`` seconds on its own connection
  (``expires_at`` = now + ``ttl_s``), only while it has not expired. A run whose renewal
  failed has **lost** the lock and stops before its next statement (:class:`LockLost`).
  A DDL statement replicated in total order holds back every commit ordered after it on
  every node, so nobody can take the lease over *during* a statement; a statement longer
  than ``ttl_s`` can lose it afterwards, which stops the run with a dirty mark, never two
  runs at once.
* **Release**: the row is deleted (by token) on every path. A run that died leaves its row
  until it expires (``ttl_s``); meanwhile ``status`` reports the run as live, and after it
  as ``interrupted`` (dirty), exactly like a dead run on one server.
"""

from __future__ import annotations

import contextlib
import os
import secrets
import threading
import time
from collections.abc import Callable

import pymysql
from pymysql.connections import Connection

from orbit.migrate import store
from orbit.migrate.errors import LockLost, LockTimeout
from orbit.storage.dsn import DSN
from orbit.storage.errors import DEADLOCK, LOCK_WAIT_TIMEOUT, error_code

#: Seconds a lease lives without renewal (``ORBIT_MIGRATE_LEASE_TTL_S``, default 60): how
#: long a dead run blocks the next one, and the longest a single statement may take without
#: the run losing its lease afterwards. Renewed every ``ttl / 12`` seconds (at most 5 s).
TTL_ENV = "ORBIT_MIGRATE_LEASE_TTL_S"


def lease_ttl() -> int:
    try:
        return max(2, int(os.environ.get(TTL_ENV, "60")))
    except ValueError:
        return 60


class ClusterLease:
    """A held lease; :meth:`check` raises :class:`LockLost` once renewal failed."""

    def __init__(self, dsn: DSN, token: bytes, ttl_s: int, renew_s: float) -> None:
        self.dsn = dsn
        self.token = token
        self.ttl_s = ttl_s
        self.renew_s = renew_s
        self.lost: str | None = None
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._renew_loop, name="orbit-migrate-lease", daemon=True)

    @classmethod
    def acquire(
        cls,
        dsn: DSN,
        timeout: float,
        say: Callable[[str], None],
        *,
        ttl_s: int | None = None,
        renew_s: float | None = None,
    ) -> ClusterLease:
        """Claim the lease, waiting up to ``timeout`` seconds for another run's to end."""
        ttl_s = ttl_s or lease_ttl()
        renew_s = renew_s or min(5.0, ttl_s / 12)
        token = secrets.token_bytes(16)
        holder = store.runner_id()
        deadline = time.monotonic() + timeout
        announced = False
        conn = store.connect(dsn, with_database=True)
        try:
            while True:
                try:
                    other = store.cluster_lock_claim(conn, holder, token, ttl_s)
                except pymysql.MySQLError as exc:
                    if error_code(exc) not in (DEADLOCK, LOCK_WAIT_TIMEOUT):
                        raise
                    other = "a concurrent claim"  # certification chose the other run
                if other is None:
                    break
                if time.monotonic() >= deadline:
                    raise LockTimeout(store.CLUSTER_LOCK_TABLE, timeout)
                if not announced:
                    say(f"another run ({other}) holds the cluster lock; waiting up to {timeout:g} s")
                    announced = True
                time.sleep(min(1.0, max(0.05, deadline - time.monotonic())))
        finally:
            conn.close()
        lease = cls(dsn, token, ttl_s, renew_s)
        lease._thread.start()
        return lease

    def check(self) -> None:
        """Raise :class:`LockLost` when the lease could not be renewed in time."""
        if self.lost is not None:
            raise LockLost(store.CLUSTER_LOCK_TABLE, self.lost)

    def release(self) -> None:
        """Stop renewing and delete the row (by token; errors ignored: it expires anyway)."""
        self._stop.set()
        self._thread.join(self.renew_s + 15)
        with contextlib.suppress(pymysql.MySQLError):
            conn = store.connect(self.dsn, with_database=True)
            try:
                store.cluster_lock_release(conn, self.token)
            finally:
                conn.close()

    def _renew_loop(self) -> None:
        conn: Connection | None = None
        renewed = time.monotonic()
        try:
            while not self._stop.wait(self.renew_s):
                try:
                    if conn is None:
                        conn = store.connect(self.dsn, with_database=True)
                    if not store.cluster_lock_renew(conn, self.token, self.ttl_s):
                        self.lost = "the lease expired or was taken over"
                        return
                    renewed = time.monotonic()
                except pymysql.MySQLError as exc:
                    with contextlib.suppress(Exception):
                        if conn is not None:
                            conn.close()
                    conn = None
                    if time.monotonic() - renewed >= self.ttl_s:
                        self.lost = f"could not renew the lease for {self.ttl_s} s ({exc})"
                        return
        finally:
            if conn is not None:
                with contextlib.suppress(Exception):
                    conn.close()
