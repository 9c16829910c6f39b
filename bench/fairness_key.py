"""S5's fairness-key leg: one queue, 100 subjects, one of them flooding it.

Tasks carry their subject in the optional submit field ``fairness_key``. Subject 0 submits
``flood`` tasks (batches of 500) and then, while its backlog waits, each of the 99 other
subjects submits ``others_each`` tasks (single submits, the subjects in turn, 20 ms apart).
Worker sessions (2 processes x 2 sessions x 8) run no-op handlers that return their start
time. The figure, for each task of a non-flooding subject: how many tasks of the queue
started between the moment its submit was answered and its own start (:func:`waits`; the
handler start stands for the dispatch, and the bench's clock is the workers' clock). Max and
p99 are the ratio's figures: with dispatch rotating across fairness keys a task waits a few
dispatches; first-in-first-out makes it wait for the flood's backlog.

A server without the field answers the probe submit with 400: the leg is then "not
measured" with that answer as the reason, and the same load runs once without the field
(``without_key``: what first-in-first-out dispatch gives today, for reference).
"""

from __future__ import annotations

import asyncio
import secrets
import time
from bisect import bisect_left, bisect_right
from typing import Any

import httpx
import msgspec

from bench.env import ScratchDatabase, Server, WorkerProcs
from bench.lean_http import LeanClient
from bench.scenarios import Results, Tenant, pct, put_queue, put_subscription

_ENC = msgspec.json.Encoder()


def waits(
    starts: dict[str, float], answered: dict[str, float], subject: dict[str, str], flooder: str
) -> tuple[list[int], int]:
    """For each task of a subject other than ``flooder`` (``answered``: when its submit was
    answered): the number of tasks (of any subject, in ``starts``) that started after that
    moment and before it started. Returns (those counts, tasks that never started)."""
    order = sorted(starts.values())
    out: list[int] = []
    never = 0
    for tid, t_sub in answered.items():
        if subject.get(tid) == flooder:
            continue
        own = starts.get(tid)
        if own is None:
            never += 1
            continue
        out.append(max(0, bisect_left(order, own) - bisect_right(order, t_sub)))
    return out, never


def summary(counts: list[int], never: int) -> dict[str, Any]:
    return {
        "tasks": len(counts),
        "never_started": never,
        "max": max(counts) if counts else None,
        "p99": pct([float(c) for c in counts], 0.99),
        "p50": pct([float(c) for c in counts], 0.50),
    }


async def fairness_key_leg(
    server: Server,
    t: Tenant,
    db: ScratchDatabase,
    *,
    flood: int = 10_000,
    subjects: int = 100,
    others_each: int = 3,
    limit_s: float = 240.0,
) -> dict[str, Any]:
    fig = await _leg(server, t, flood=flood, subjects=subjects, others_each=others_each,
                     limit_s=limit_s, with_key=True)  # fmt: skip
    if "not_measured" in fig:
        fig["without_key"] = await _leg(server, t, flood=flood, subjects=subjects,
                                        others_each=others_each, limit_s=limit_s,
                                        with_key=False)  # fmt: skip
    return fig


async def _leg(
    server: Server, t: Tenant, *, flood: int, subjects: int, others_each: int, limit_s: float,
    with_key: bool,
) -> dict[str, Any]:  # fmt: skip
    queue = f"s5k-{secrets.token_hex(3)}"
    sub_name = f"sub-{queue}"
    names = [f"subject-{i:03d}" for i in range(subjects)]
    flooder = names[0]
    subject: dict[str, str] = {}
    answered: dict[str, float] = {}
    async with httpx.AsyncClient(timeout=60.0) as client, LeanClient(t.url, 8) as lean:
        await put_queue(client, t, queue)
        await put_subscription(client, t, sub_name, queue)

        def body(key: str) -> dict[str, Any]:
            item = {"queue": queue, "kind": "noop", "payload": {"t0": time.time()}}
            return {**item, "fairness_key": key} if with_key else item

        probe = await client.post(f"{t.base()}/tasks", headers=t.headers,
                                  content=_ENC.encode(body(names[1])))  # fmt: skip
        if probe.status_code != 201:
            return {"not_measured": f"the server does not take the submit field fairness_key "
                    f"({probe.status_code}: {probe.text[:200]})"}  # fmt: skip
        results = Results(t, sub_name)
        results.start()
        workers = WorkerProcs()
        workers.start(url=t.url, key=t.key, namespace=t.namespace, queue=queue,
                      processes=2, sessions=2, concurrency=8)  # fmt: skip
        try:
            await results.wait_for(probe.json()["id"], 60)
            began = time.monotonic()
            for start in range(0, flood, 500):
                items = [body(flooder) for _ in range(min(500, flood - start))]
                r = await lean.post(f"{t.base()}/tasks:batch", headers=t.headers,
                                    content=_ENC.encode({"tasks": items}))  # fmt: skip
                if r.status_code != 200:
                    raise RuntimeError(f"flood batch: {r.status_code} {r.text[:200]}")
                now = time.time()
                for item in r.json()["items"]:
                    if item.get("task"):
                        subject[item["task"]["id"]] = flooder
                        answered[item["task"]["id"]] = now
            flood_s = time.monotonic() - began
            started_before_others = results.count
            for _ in range(others_each):
                for name in names[1:]:
                    r = await lean.post(f"{t.base()}/tasks", headers=t.headers,
                                        content=_ENC.encode(body(name)))  # fmt: skip
                    if r.status_code != 201:
                        raise RuntimeError(f"submit: {r.status_code} {r.text[:200]}")
                    tid = r.json()["id"]
                    answered[tid] = time.time()
                    subject[tid] = name
                    await asyncio.sleep(0.02)
            started_after_others = results.count
            deadline = time.monotonic() + limit_s
            while time.monotonic() < deadline and any(  # noqa: ASYNC110 - a poll
                tid not in results.results for tid in answered
            ):
                await asyncio.sleep(0.2)
        finally:
            await workers.stop()
            await results.stop()
    starts: dict[str, float] = {}
    for tid, raw in results.results.items():
        res = msgspec.json.decode(raw) if raw else None
        if isinstance(res, dict) and "t1" in res:
            starts[tid] = float(res["t1"])
    counts, never = waits(starts, answered, subject, flooder)
    return {
        "queue": queue,
        "subjects": subjects,
        "flood": flood,
        "others_each": others_each,
        "flood_submit_s": round(flood_s, 1),
        # How much of the flood was still waiting while the others submitted.
        "flood_left_when_others_began": flood - max(0, started_before_others - 1),
        "flood_left_when_others_ended": flood - max(0, started_after_others - 1),
        "wait_dispatches": summary(counts, never),
        "subscriber_error": repr(results.error) if results.error else None,
    }
