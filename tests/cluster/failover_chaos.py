"""The chaos run (tests/chaos/chaos.py) against a primary with one replica, with a failover
mid-run: the primary is SIGKILLed, the replica applies what it received, is promoted, and the
endpoint every ``orbit-server`` connects to moves to it (tests/cluster/replication.py). Then
the history checker judges every client's log against the *new* primary's data.

    python tests/cluster/failover_chaos.py --mode semisync --seconds 120
    python tests/cluster/failover_chaos.py --mode async --seconds 120

The rest of the deck (worker, server-node, subscriber kills, SIGSTOP, KILL CONNECTION) runs
as in the one-database run; the failover happens once, ``--failover-after`` seconds into the
fault phase. The inbox subscriber's database is a separate private server (it is the
subscriber's own application database, not Orbit's). Figures: the failover's timings, the
503 windows, outcome-unknown answers, re-sends with idempotency keys, and every anomaly.
"""

from __future__ import annotations

import argparse
import shutil
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
ROOT = HERE.parents[1]
for extra in (ROOT / "tests" / "chaos", ROOT / "tests" / "reliability", ROOT / "tests", ROOT, HERE):
    if str(extra) not in sys.path:
        sys.path.insert(0, str(extra))

import chaos  # noqa: E402
from cluster_chaos import report_run, windows  # noqa: E402
from replication import ReplicatedPair  # noqa: E402

DATABASE = "orbit_chaos"


class Failover:
    def __init__(self, pair: ReplicatedPair, after_s: float, lag_s: float) -> None:
        self.pair = pair
        self.after_s = after_s
        self.lag_s = lag_s
        self.started = time.monotonic()
        self.done: dict[str, Any] | None = None
        self.thread: threading.Thread | None = None

    def watch(self, cluster: Any, stop: threading.Event) -> None:
        """Fail over once, ``after_s`` into the run (its own thread: the other faults go on)."""
        if stop.wait(self.after_s):
            return
        self.done = self.pair.failover(lag_s=self.lag_s)


def failover_run(seconds: float, *, mode: str, after_s: float, lag_s: float = 0.0, seed: int | None = None,
                 work: Path | None = None, settle_s: float = 180.0, keep: bool = False) -> tuple[chaos.ChaosResult, Path]:  # fmt: skip
    root = Path(tempfile.mkdtemp(prefix="orbit-failover-"))
    work = work or ROOT / ".orbit" / "failover" / time.strftime(f"{mode}-lag{lag_s:g}-%Y%m%d-%H%M%S")
    pair = ReplicatedPair(root / "pair", mode=mode, keep=keep)
    inbox_db = chaos.PrivateDatabase(root / "inbox", database="chaos_inbox")
    try:
        pair.start()
        pair.create_database(DATABASE)
        inbox_db.start()
        inbox = inbox_db.create("chaos_inbox")
        tree_env = chaos.freeze_tree(root / "src")
        dsn = pair.dsn(DATABASE)
        chaos.migrate_up(dsn, tree_env)
        fo = Failover(pair, after_s, lag_s)
        hooks = chaos.ChaosHooks(node_dsns=[dsn], watchers=[fo.watch])
        res = chaos.run_chaos(dsn, work, seconds=seconds, seed=seed, settle_s=settle_s, inbox_dsn=inbox,
                              tree_env=tree_env, hooks=hooks)  # fmt: skip
        res.figures["failover"] = fo.done
        res.figures["unavailable_503"] = windows(res.unavailable)
        if fo.done is not None:
            t0, t1 = fo.done["t_kill"], fo.done["t_done"] + 30
            res.figures["failover_503"] = sum(1 for t, _, _ in res.unavailable if t0 - 1 <= t <= t1)
        res.figures["anomaly_kinds"] = _kinds(res.anomalies)
        if fo.done is None:
            res.anomalies.append("no_failover: the run ended before the failover")
    finally:
        pair.stop()
        inbox_db.stop()
        if not keep:
            shutil.rmtree(root, ignore_errors=True)
    return res, work


def _kinds(anomalies: list[str]) -> dict[str, int]:
    out: dict[str, int] = {}
    for a in anomalies:
        k = a.split(":", 1)[0]
        out[k] = out.get(k, 0) + 1
    return out


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--mode", choices=("async", "semisync"), default="semisync")
    p.add_argument("--seconds", type=float, default=120.0)
    p.add_argument("--failover-after", type=float, default=45.0)
    p.add_argument("--lag", type=float, default=0.0,
                   help="cut the replication link this many seconds before the primary dies")
    p.add_argument("--seed", type=int, default=None)
    p.add_argument("--settle", type=float, default=180.0)
    p.add_argument("--keep", action="store_true")
    p.add_argument("--json", action="store_true")
    args = p.parse_args(argv)
    res, work = failover_run(args.seconds, mode=args.mode, after_s=args.failover_after, lag_s=args.lag, seed=args.seed,
                             settle_s=args.settle, keep=args.keep)  # fmt: skip
    return report_run(res, work, f"failover_{args.mode}", compact=args.json)

if __name__ == "__main__":
    sys.exit(main())
