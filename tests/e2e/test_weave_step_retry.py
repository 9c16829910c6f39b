"""A workflow step's retry policy is the policy of the tasks it submits: precedence step →
task → queue (docs/workflows.md, "Retries"). Each backoff field the step gives wins; a field
it leaves out is the queue's; a step asking for what the queue's ``retry_bounds`` forbid
fails on entry with the reason."""

from __future__ import annotations

import asyncio
from datetime import datetime
from typing import Any

import httpx
from sdk_server import Env, env_fixture, server_fixture, unique  # noqa: F401

QUEUE_RETRY = {"max_attempts": 5, "backoff_initial_ms": 60_000, "backoff_max_ms": 600_000,
               "backoff_multiplier": 3}  # fmt: skip


def _workflow(queue: str, retry: dict[str, Any]) -> dict[str, Any]:
    return {"steps": [
        {"id": "work", "type": "task", "queue": queue, "kind": "k", "retry": retry},
        {"id": "done", "type": "succeed", "output": {"$": "$.steps.work.output"}},
    ]}  # fmt: skip


async def _start(http: httpx.AsyncClient, ns: str, queue: str, retry: dict[str, Any]) -> str:
    name = unique("wf")
    r = await http.post(f"/v1/namespaces/{ns}/workflows/{name}/versions",
                        json={"definition": _workflow(queue, retry)})  # fmt: skip
    assert r.status_code == 201, r.text
    r = await http.post(f"/v1/namespaces/{ns}/workflows/{name}/instances", json={"input": {}})
    assert r.status_code == 201, r.text
    return str(r.json()["id"])


async def _task_of(http: httpx.AsyncClient, ns: str, queue: str) -> dict[str, Any]:
    for _ in range(200):
        r = await http.get(f"/v1/namespaces/{ns}/tasks", params={"queue": queue})
        if r.json()["items"]:
            return r.json()["items"][0]  # type: ignore[no-any-return]
        await asyncio.sleep(0.05)
    raise AssertionError("the step submitted no task")


async def test_the_steps_backoff_is_used_and_the_rest_comes_from_the_queue(env: Env) -> None:
    ns = env.ns
    async with env.http() as http:
        queue = unique("rq")
        r = await http.put(f"/v1/namespaces/{ns}/queues/{queue}", json={"retry": QUEUE_RETRY})
        assert r.status_code == 201, r.text
        await _start(http, ns, queue, {"max_attempts": 2, "backoff_initial_ms": 100})
        task = await _task_of(http, ns, queue)
        assert task["max_attempts"] == 2
        # The step's initial delay; the cap and the multiplier it did not give: the queue's.
        assert task["retry"] == {"backoff_initial_ms": 100, "backoff_max_ms": 600_000,
                                 "backoff_multiplier": 3.0}  # fmt: skip
        # And it is what the retry waits: a retryable failure is due again after 100 ms,
        # not after the queue's 60 s.
        s = await http.post(
            f"/v1/namespaces/{ns}/workers/sessions",
            json={"instance": {"host": "h", "pid": 1, "sdk": "raw"}, "queues": [queue],
                  "max_concurrency": 1},
        )  # fmt: skip
        auth = {"Authorization": f"Bearer {s.json()['session_token']}"}
        poll = await http.post(
            f"/v1/namespaces/{ns}/workers/sessions/{s.json()['session_id']}/poll?wait_ms=10000",
            headers=auth,
        )
        aid = poll.json()["offers"][0]["attempt_id"]
        started = await http.post(f"/v1/namespaces/{ns}/attempts/{aid}/start", headers=auth)
        token = started.json()["execution_token"]
        failed = await http.post(
            f"/v1/namespaces/{ns}/attempts/{aid}/fail", headers=auth,
            json={"execution_token": token, "retryable": True,
                  "error": {"type": "Flaky", "message": "again"}},
        )  # fmt: skip
        assert failed.json()["task_state"] == "WAITING", failed.text
        again = (await http.get(f"/v1/namespaces/{ns}/tasks/{task['id']}")).json()
        due = datetime.fromisoformat(again["available_at"]) - datetime.fromisoformat(
            again["state_changed_at"] if "state_changed_at" in again else again["created_at"]
        )
        assert due.total_seconds() < 30, again  # 0.1 s (the queue would say 60 s)


async def test_a_step_outside_the_queues_bounds_fails_with_the_reason(env: Env) -> None:
    ns = env.ns
    async with env.http() as http:
        queue = unique("rq")
        r = await http.put(
            f"/v1/namespaces/{ns}/queues/{queue}",
            json={"retry": QUEUE_RETRY, "retry_bounds": {"min_delay_ms": 1000}},
        )
        assert r.status_code == 201, r.text
        iid = await _start(http, ns, queue, {"backoff_initial_ms": 100})
        for _ in range(200):
            inst = (await http.get(f"/v1/namespaces/{ns}/instances/{iid}")).json()
            if inst["state"] != "RUNNING":
                break
            await asyncio.sleep(0.05)
        assert inst["state"] == "FAILED", inst
        (step,) = [st for st in inst["steps"] if st["step"] == "work"]
        assert step["state"] == "FAILED" and step["error"]["code"] == "invalid_request"
        assert "retry.backoff_initial_ms" in step["error"]["message"], step["error"]
