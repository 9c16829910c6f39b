"""The noisy tenant of the hostile-load test (test_hostile_load.py), as its own process.

    python hostile_flood.py '<json config>'

Config: ``url``, ``ws_url``, ``namespace``, ``key``, ``sessions`` (worker sessions: id and
token), ``subscriptions`` (names), ``seconds``. For ``seconds`` it runs, all at once:

* a heartbeat flood on each session's stream (frames as fast as the socket takes them; the
  server closes the stream with 1008 when its budget is spent, and the flood reconnects);
* bad frames on one more stream (malformed JSON, deep nesting, unknown types);
* big lists (``GET …/tasks?limit=500`` over large payloads, ``GET …/events?limit=500``);
* subscription pulls (``max`` 500, on subscriptions that start at the earliest event);
* ``/metrics`` scrapes.

At the end (``seconds`` passed, or SIGTERM) it prints one JSON line of counts (requests by
kind and status, frames sent, closes by code) on stdout. The test pauses it with SIGSTOP
between its measured phases, so the flood's own clock keeps running meanwhile.
"""

from __future__ import annotations

import asyncio
import json
import signal
import sys
import time
from collections import Counter
from typing import Any

import httpx
import websockets

BAD_FRAMES = ["{", "[" * 2000 + "]" * 2000, '{"type": "nope", "msg_id": "x"}', "\x00\xff", "null",
              '{"type": "heartbeat"}', '{"type": "start", "msg_id": "m", "attempt_id": "zz"}']  # fmt: skip


class Stop:
    """When the flood ends (monotonic seconds); SIGTERM moves it to now."""

    def __init__(self, seconds: float) -> None:
        self.at = time.monotonic() + seconds

    def running(self) -> bool:
        return time.monotonic() < self.at


async def _stream(cfg: dict[str, Any], sid: str, token: str, frames: list[str], counts: Counter[str],
                  stop: Stop) -> None:  # fmt: skip
    path = f"{cfg['ws_url']}/v1/namespaces/{cfg['namespace']}/workers/sessions/{sid}/stream"
    headers = {"Authorization": f"Bearer {token}"}
    i = 0
    while stop.running():
        try:
            async with websockets.connect(path, additional_headers=headers, max_size=None,
                                          open_timeout=10) as ws:  # fmt: skip
                counts["ws_open"] += 1

                async def drain(ws: Any = ws) -> None:
                    async for _ in ws:
                        counts["ws_replies"] += 1

                reader = asyncio.create_task(drain())
                try:
                    while stop.running():
                        await ws.send(frames[i % len(frames)].replace("$I", str(i)))
                        i += 1
                        counts["ws_frames"] += 1
                        if i % 64 == 0:
                            await asyncio.sleep(0)
                finally:
                    reader.cancel()
        except websockets.ConnectionClosed as exc:
            code = exc.rcvd.code if exc.rcvd is not None else 1006
            counts[f"ws_close_{code}"] += 1
        except (OSError, websockets.InvalidStatus, TimeoutError) as exc:
            counts[f"ws_error_{type(exc).__name__}"] += 1
            await asyncio.sleep(0.05)


async def _loop(client: httpx.AsyncClient, kind: str, method: str, url: str, counts: Counter[str],
                stop: Stop, **kw: Any) -> None:  # fmt: skip
    while stop.running():
        try:
            r = await client.request(method, url, **kw)
            counts[f"{kind}_{r.status_code}"] += 1
            counts[f"{kind}_bytes"] += len(r.content)
        except httpx.HTTPError as exc:
            counts[f"{kind}_{type(exc).__name__}"] += 1
            await asyncio.sleep(0.05)


async def main(cfg: dict[str, Any]) -> dict[str, Any]:
    counts: Counter[str] = Counter()
    stop = Stop(float(cfg["seconds"]))
    asyncio.get_running_loop().add_signal_handler(signal.SIGTERM, lambda: setattr(stop, "at", 0.0))
    ns = f"/v1/namespaces/{cfg['namespace']}"
    auth = {"Authorization": f"Bearer {cfg['key']}"}
    heartbeat = ['{"type": "heartbeat", "msg_id": "h$I", "attempt_ids": []}']
    jobs = []
    async with httpx.AsyncClient(base_url=cfg["url"], headers=auth, timeout=60,
                                 limits=httpx.Limits(max_connections=32)) as client:  # fmt: skip
        kinds = set(cfg.get("kinds") or ("heartbeats", "bad_frames", "lists", "pulls", "metrics"))
        sessions = cfg["sessions"]
        if "heartbeats" in kinds:
            for s in sessions[:-1]:
                jobs.append(_stream(cfg, s["id"], s["token"], heartbeat, counts, stop))
        if "bad_frames" in kinds:
            last = sessions[-1]
            jobs.append(_stream(cfg, last["id"], last["token"], BAD_FRAMES, counts, stop))
        if "lists" in kinds:
            for _ in range(3):
                jobs.append(_loop(client, "list_tasks", "GET", f"{ns}/tasks", counts, stop,
                                  params={"limit": 500}))  # fmt: skip
            jobs.append(_loop(client, "list_events", "GET", f"{ns}/events", counts, stop,
                              params={"limit": 500}))  # fmt: skip
        if "pulls" in kinds:
            for name in cfg["subscriptions"]:
                jobs.append(_loop(client, "pull", "POST", f"{ns}/subscriptions/{name}/pull",
                                  counts, stop, json={"max": 500, "wait_ms": 0}))  # fmt: skip
        if "metrics" in kinds:
            for _ in range(4):
                jobs.append(_loop(client, "metrics", "GET", "/metrics", counts, stop))
        await asyncio.gather(*jobs)
    return dict(counts)


if __name__ == "__main__":
    print(json.dumps(asyncio.run(main(json.loads(sys.argv[1])))), flush=True)
