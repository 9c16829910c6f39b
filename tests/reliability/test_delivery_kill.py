"""A server process killed (SIGKILL) in the middle of hand-outs loses nothing and doubles
nothing: a hand-out's range row and the subscription's cursor commit together or not at
all, so after the kills every matching event is handed out for the first time exactly once,
ranges never overlap, and a surviving consumer acks every delivery (the killed one's leases
expire and come back as rows with the same delivery id)."""

from __future__ import annotations

import asyncio
import itertools
import os
import random
import signal
import subprocess
import sys
import textwrap
from datetime import timedelta

from subscription_fixtures import append_results, make_tenant

from orbit import deliveries, delivery_history, delivery_pump, subscriptions
from orbit import delivery_ranges as dr
from orbit.audit import CLI_ACTOR
from orbit.ids import id_hex
from orbit.storage import DSN, Database, Tx
from orbit.subscriptions import SubscriptionFilter, SubscriptionPut

CHILD = textwrap.dedent(
    """
    import asyncio, sys
    from orbit import delivery_pump
    from orbit.storage import DSN, Database

    async def main() -> None:
        db = await Database.connect(DSN.parse(sys.argv[1]), maxsize=2)
        ns, sub = bytes.fromhex(sys.argv[2]), bytes.fromhex(sys.argv[3])
        print("ready", flush=True)
        while True:  # hand out and never ack, until killed
            await delivery_pump.lease(db, ns, sub, 3)

    asyncio.run(main())
    """
)


async def test_a_server_killed_mid_hand_out_loses_nothing(db: Database, dsn: DSN) -> None:
    t = await make_tenant(db)
    row, *_ = await subscriptions.put_subscription(
        db, CLI_ACTOR, t.namespace_id, "s",
        SubscriptionPut(start="earliest", filter=SubscriptionFilter(states=["SUCCEEDED"]),
                        ack_timeout_ms=100, max_in_flight=10_000),
    )  # fmt: skip
    url = dsn.url(hide_password=False)
    rng = random.Random(7)
    for _ in range(6):  # producers keep appending while children hand out and die
        child = await asyncio.to_thread(
            subprocess.Popen,
            [sys.executable, "-c", CHILD, url, id_hex(t.namespace_id), id_hex(row.id)],
            stdout=subprocess.PIPE, env={**os.environ},
        )  # fmt: skip
        assert child.stdout is not None
        assert (await asyncio.to_thread(child.stdout.readline)).strip() == b"ready"
        for _ in range(5):
            await append_results(db, t.namespace_id, rng.randint(1, 6), state="SUCCEEDED")
            await append_results(db, t.namespace_id, 1, state="FAILED")
        await asyncio.sleep(rng.uniform(0.01, 0.15))
        child.send_signal(signal.SIGKILL)  # mid-hand-out, or between two
        await asyncio.to_thread(child.wait)

    async def ranges(tx: Tx) -> list[tuple[int, int, list[int]]]:
        rows = await tx.fetchall(
            "SELECT seq_lo, seq_hi, seqs FROM orbit_delivery_ranges"
            " WHERE namespace_id = %s AND subscription_id = %s ORDER BY seq_lo",
            (t.namespace_id, row.id),
        )
        return [(int(r["seq_lo"]), int(r["seq_hi"]), dr.unpack_seqs(r["seqs"])) for r in rows]

    spans = await db.read(ranges)
    assert spans, "the children handed something out before they died"
    for (_, hi, _), (lo, _, _) in itertools.pairwise(spans):
        assert lo > hi  # ranges of a subscription never overlap
    # A survivor: leases of the dead have expired (pinned clock); it acks everything.
    later = await db.now() + timedelta(minutes=5)
    acked: set[bytes] = set()
    for _ in range(500):
        batch = await delivery_pump.lease(db, t.namespace_id, row.id, 50, now=later)
        if not batch.deliveries and not batch.behind:
            break
        for d in batch.deliveries:
            res = await deliveries.ack(db, t.namespace_id, d.delivery_id, d.proof, now=later)
            assert res.outcome == "applied"
            acked.add(d.delivery_id)
        later += timedelta(minutes=5)  # anything still leased expires: back-off passes
    from orbit.events import list_result_events

    events = await list_result_events(db, t.namespace_id, 0, 5000)
    expected = [e.seq for e in events if e.state == "SUCCEEDED"]
    history = await delivery_history.list_history(
        db, t.namespace_id, row.id, state=None, after_seq=0, limit=500
    )
    assert [h.seq for h in history] == expected  # each once: nothing lost, nothing doubled
    assert {h.state for h in history} == {"ACKED"}
    assert len({h.id for h in history}) == len(history)
    handed = sorted(s for _, _, seqs in spans for s in seqs)
    assert len(handed) == len(set(handed)) and set(handed) <= set(expected)
    sub = await subscriptions.get_subscription(db, t.namespace_id, "s")
    assert sub.after_seq == events[-1].seq
