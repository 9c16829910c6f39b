"""The chaos run (tests/chaos/chaos.py) on a private 3-node Galera cluster, writes on every
node: ``orbit-server`` node ``i`` talks to Galera node ``i``; SDK workers, the producer, the
workflow driver and the subscribers spread over the server nodes as in the one-database run.

    python tests/cluster/cluster_chaos.py --minutes 20 --seed 7   # the report's run
    python tests/cluster/cluster_chaos.py --seconds 60 --json     # a short one

Faults, dealt from the same shuffled deck as the one-database run (worker SIGKILL and
SIGSTOP, server node SIGKILL, KILL CONNECTION on a random database node, subscriber SIGKILL)
plus two cluster kinds:

* ``galera_restart``: a Galera node SIGKILLed (or SIGTERMed, alternately), started again
  two seconds later; it recovers its position and rejoins by IST while the other two serve.
* ``galera_partition``: a Galera node cut off from the other two (iptables on this cluster's
  own loopback addresses; Galera's ``gmcast.isolate`` where iptables is not available) for
  ``PARTITION_S`` seconds, then healed. Its ``orbit-server`` still reaches it: the node
  loses the primary component and refuses every query (1047), so that server must answer
  503 (never acknowledge a write the cluster does not keep) until the partition heals.

At most one Galera node is away at a time (the fault thread waits until the cluster is back
to three synced members after each), so the other two keep quorum. Then the history checker
judges every client's log and the database, exactly as in the one-database run, and the
figures add what a cluster adds: retries by kind on the Orbit side (scraped from every
server's /metrics, counter resets of restarted servers handled), certification failures and
brute-force aborts on the Galera side, and the 503 windows per server node.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import re
import shutil
import signal
import sys
import tempfile
import threading
import time
from collections import defaultdict
from pathlib import Path
from typing import Any

import httpx

HERE = Path(__file__).resolve().parent
ROOT = HERE.parents[1]
for extra in (ROOT / "tests" / "chaos", ROOT / "tests" / "reliability", ROOT / "tests", ROOT, HERE):
    if str(extra) not in sys.path:
        sys.path.insert(0, str(extra))

import chaos  # noqa: E402
import history  # noqa: E402
from galera import GaleraCluster  # noqa: E402

PARTITION_S = 8.0
DATABASE = "orbit_chaos"
INBOX = "chaos_inbox"
_KIND_RE = re.compile(r'^orbit_db_transaction_retries_by_kind_total\{kind="(\w+)"\} (\d+(?:\.\d+)?)', re.M)


class Counters:
    """Monotonic totals over processes that restart: per source, a counter that went down
    was reset (the process restarted) and its last value is banked."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._last: dict[tuple[str, str], float] = {}
        self._banked: dict[tuple[str, str], float] = defaultdict(float)

    def observe(self, source: str, values: dict[str, float]) -> None:
        with self._lock:
            for name, v in values.items():
                key = (source, name)
                if v < self._last.get(key, 0.0):
                    self._banked[key] += self._last[key]
                self._last[key] = v

    def totals(self) -> dict[str, int]:
        out: dict[str, float] = defaultdict(float)
        with self._lock:
            for (_, name), v in self._last.items():
                out[name] += v
            for (_, name), v in self._banked.items():
                out[name] += v
        return {k: int(v) for k, v in sorted(out.items())}


class ClusterFaults:
    """The Galera fault kinds and the watcher of one run."""

    def __init__(self, galera: GaleraCluster) -> None:
        self.galera = galera
        self.orbit_retries = Counters()
        self.galera_conflicts = Counters()
        self.events: list[dict[str, Any]] = []
        self._kill = False

    # -- faults (run in the fault thread, one at a time) ----------------------------------

    def restart(self, cluster: Any, rec: history.Recorder, res: chaos.ChaosResult, rng: Any) -> None:
        node = rng.randrange(len(self.galera.nodes))
        self._kill = not self._kill
        sig = signal.SIGKILL if self._kill else signal.SIGTERM
        self._sample_galera()  # bank its counters before they reset
        t0 = time.monotonic()
        rec("fault", kind="galera_stop", node=node, sigkill=self._kill)
        how = self.galera.restart(node, sig=sig, down_s=2.0)
        rec("fault", kind="galera_started", node=node, transfer=how["transfer"])
        res.faults["galera_restart_sigkill" if self._kill else "galera_restart_sigterm"] += 1
        self.galera.wait_size(len(self.galera.nodes), 180)
        self.events.append({"kind": "restart", "node": node, "signal": "KILL" if self._kill else "TERM",
                            "t0": t0, "rejoin_s": how["rejoin_s"], "transfer": how["transfer"],
                            "back_s": round(time.monotonic() - t0, 2)})  # fmt: skip

    def partition(self, cluster: Any, rec: history.Recorder, res: chaos.ChaosResult, rng: Any) -> None:
        node = rng.randrange(len(self.galera.nodes))
        t0 = time.monotonic()
        method = self.galera.partition(node)
        rec("fault", kind="galera_partition", node=node, method=method)
        res.faults["galera_partition"] += 1
        non_primary_at = None
        deadline = t0 + PARTITION_S
        while time.monotonic() < deadline:
            with contextlib.suppress(Exception):
                if non_primary_at is None and self.galera.nodes[node].status()["wsrep_cluster_status"] != "Primary":
                    non_primary_at = time.monotonic()
            time.sleep(0.2)
        self.galera.heal(node)
        rec("fault", kind="galera_heal", node=node)
        healed = time.monotonic()
        self.galera.wait_size(len(self.galera.nodes), 180)
        self.events.append({"kind": "partition", "node": node, "method": method, "t0": t0, "t_heal": healed,
                            "non_primary_after_s": None if non_primary_at is None else round(non_primary_at - t0, 2),
                            "rejoined_after_heal_s": round(time.monotonic() - healed, 2),
                            "orbit_node": f"http://127.0.0.1:{cluster.nodes[node].port}"
                            if node < len(cluster.nodes) else None})  # fmt: skip

    def revive(self, cluster: Any) -> None:
        self.galera.heal_all()
        for n in self.galera.nodes:
            if not n.alive():
                n.start()
        self.galera.wait_size(len(self.galera.nodes), 180)

    # -- the watcher -----------------------------------------------------------------------

    def _sample_galera(self) -> None:
        for n in self.galera.nodes:
            if not n.alive():
                continue
            with contextlib.suppress(Exception):
                st = n.status()
                self.galera_conflicts.observe(f"node{n.index}", {
                    "cert_failures": float(st.get("wsrep_local_cert_failures", 0) or 0),
                    "bf_aborts": float(st.get("wsrep_local_bf_aborts", 0) or 0),
                })  # fmt: skip

    def _sample_orbit(self, cluster: Any) -> None:
        for node in cluster.nodes:
            if not node.alive():
                continue
            with contextlib.suppress(httpx.HTTPError):
                text = httpx.get(f"{node.url}/metrics", timeout=3).text
                self.orbit_retries.observe(str(node.port), {k: float(v) for k, v in _KIND_RE.findall(text)})

    def watch(self, cluster: Any, stop: threading.Event) -> None:
        while not stop.wait(2.0):
            self._sample_orbit(cluster)
            self._sample_galera()
        self._sample_orbit(cluster)
        self._sample_galera()


def windows(samples: list[tuple[float, str, str]], gap_s: float = 2.0) -> dict[str, Any]:
    """Runs of 503 answers per server node (samples closer than ``gap_s`` join one window)."""
    by_node: dict[str, list[float]] = defaultdict(list)
    reasons: dict[str, int] = defaultdict(int)
    for t, node, reason in samples:
        by_node[node].append(t)
        reasons[reason or "?"] += 1
    out: dict[str, Any] = {"count": 0, "longest_s": 0.0, "total_s": 0.0, "answers": len(samples),
                           "reasons": dict(reasons), "per_node": {}, "list": []}  # fmt: skip
    for node, ts in sorted(by_node.items()):
        ts.sort()
        start = prev = ts[0]
        runs: list[tuple[float, float, int]] = []
        n = 1
        for t in ts[1:]:
            if t - prev > gap_s:
                runs.append((start, prev, n))
                start, n = t, 0
            prev = t
            n += 1
        runs.append((start, prev, n))
        out["per_node"][node] = {"windows": len(runs), "longest_s": round(max(b - a for a, b, _ in runs), 2)}
        for a, b, k in runs:
            out["list"].append({"node": node, "t0": round(a, 2), "seconds": round(b - a, 2), "answers": k})
        out["count"] += len(runs)
        out["longest_s"] = max(out["longest_s"], round(max(b - a for a, b, _ in runs), 2))
        out["total_s"] = round(out["total_s"] + sum(b - a for a, b, _ in runs), 2)
    out["list"].sort(key=lambda w: w["t0"])
    return out


def cluster_run(seconds: float, *, seed: int | None = None, work: Path | None = None, settle_s: float = 120.0,
                keep: bool = False, nodes: int = 3, workers: int = 3,
                deck: tuple[str, ...] = ("galera_restart", "galera_partition")) -> tuple[chaos.ChaosResult, Path]:  # fmt: skip
    """One run on a fresh private cluster (removed afterwards unless ``keep``)."""
    root = Path(tempfile.mkdtemp(prefix="orbit-cluster-chaos-"))
    work = work or ROOT / ".orbit" / "cluster-chaos" / time.strftime("run-%Y%m%d-%H%M%S")
    galera = GaleraCluster(root / "galera", keep=keep)
    try:
        galera.start()
        galera.create_database(DATABASE)
        galera.create_database(INBOX)
        tree_env = chaos.freeze_tree(root / "src")
        dsns = galera.dsns(DATABASE)
        chaos.migrate_up(dsns[0], tree_env)  # through one node; DDL reaches all of them
        faults = ClusterFaults(galera)
        table = {"galera_restart": faults.restart, "galera_partition": faults.partition}
        hooks = chaos.ChaosHooks(node_dsns=dsns, faults={k: table[k] for k in deck}, revive=faults.revive,
                                 watchers=[faults.watch])  # fmt: skip
        res = chaos.run_chaos(dsns[0], work, seconds=seconds, nodes=nodes, workers=workers, seed=seed,
                              settle_s=settle_s, inbox_dsn=galera.nodes[-1].dsn(INBOX), tree_env=tree_env,
                              hooks=hooks)  # fmt: skip
        res.figures["retries_by_kind"] = faults.orbit_retries.totals()
        res.figures["galera_conflicts"] = faults.galera_conflicts.totals()
        res.figures["unavailable_503"] = windows(res.unavailable)
        res.figures["galera_faults"] = faults.events
        res.figures["partition_method"] = sorted({e["method"] for e in faults.events if e["kind"] == "partition"})
        _split_brain_check(res, faults.events)
    finally:
        galera.stop()
        if not keep:
            shutil.rmtree(root, ignore_errors=True)
    return res, work


def _split_brain_check(res: chaos.ChaosResult, events: list[dict[str, Any]]) -> None:
    """A partitioned node's server answers 503 while its database node is outside the
    primary component; every write it acknowledged before must be in the final history
    (the checker's lost_submit / lost_instance / acked_not_final say so). Here: figures of
    how its server answered during each partition."""
    per: list[dict[str, Any]] = []
    for e in events:
        if e["kind"] != "partition" or e.get("orbit_node") is None:
            continue
        n503 = sum(1 for t, node, _ in res.unavailable if node == e["orbit_node"] and e["t0"] <= t <= e["t_heal"])
        per.append({"node": e["node"], "non_primary_after_s": e["non_primary_after_s"], "answers_503": n503,
                    "rejoined_after_heal_s": e["rejoined_after_heal_s"]})  # fmt: skip
    res.figures["partitions"] = per


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--minutes", type=float, default=None)
    p.add_argument("--seconds", type=float, default=60.0)
    p.add_argument("--seed", type=int, default=None)
    p.add_argument("--settle", type=float, default=180.0)
    p.add_argument("--keep", action="store_true")
    p.add_argument("--json", action="store_true")
    args = p.parse_args(argv)
    seconds = args.minutes * 60 if args.minutes is not None else args.seconds
    res, work = cluster_run(seconds, seed=args.seed, settle_s=args.settle, keep=args.keep)
    return report_run(res, work, "cluster_chaos_by_hand", compact=args.json)


def report_run(res: chaos.ChaosResult, work: Path, name: str, *, compact: bool) -> int:
    """Record the figures (.orbit/reliability/figures.jsonl), write ``result.json`` next to
    the run's logs, print the JSON and a summary line; the exit status (1: anomalies)."""
    from reliability_support import record_figures

    out = res.to_json()
    record_figures(name, **out)
    (work / "result.json").write_text(json.dumps(out, default=str, indent=2))
    print(json.dumps(out, indent=None if compact else 2, default=str))
    print(f"{name}: {res.tasks} tasks, {res.operations} client operations, {sum(res.faults.values())} faults, "
          f"{len(res.anomalies)} anomalies (logs and history.jsonl in {work})", file=sys.stderr)  # fmt: skip
    return 1 if res.anomalies else 0

if __name__ == "__main__":
    sys.exit(main())
