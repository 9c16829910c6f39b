"""The SDK keeps business JSON too (docs/sdk.md, "Numbers"), with the corpus of
tests/json_corpus.py against a real server:

* a payload sent as ``msgspec.Raw`` reaches the handler byte for byte and a handler that
  returns ``msgspec.Raw`` reports exactly those bytes;
* decoding never fails on a valid number: a handler's ``payload_type=Any`` payload, a
  task's ``decode_payload()``/``decode_result()``, a task whose error details carry
  ``1e400`` — numbers a float cannot hold come as ``Decimal``;
* ``Decimal`` is written as a JSON number with its digits (a result, an effect result);
* an effect result keeps its bytes (``result_type=msgspec.Raw``) on the run that made it
  and on the retry that finds it committed.
"""

from __future__ import annotations

import asyncio
from decimal import Decimal
from typing import Any

import msgspec
from json_corpus import EDGE_DOC, EDGE_DOC_NUMBERS, number_texts
from orbit_sdk import PermanentError, RetryableError, TaskContext, Worker
from sdk_server import Env, env_fixture, server_fixture, unique  # noqa: F401


def _worker(env: Env) -> Worker:
    return Worker(env.server.url, env.tenant.key, namespace=env.ns)


async def _run(worker: Worker, n: int) -> None:
    await asyncio.wait_for(worker.run(max_tasks=n, install_signal_handlers=False), 60)


async def test_payload_and_result_bytes_through_a_worker(env: Env) -> None:
    queue = unique("sbj")
    await env.orbit.queues.put(queue)
    echo = await env.orbit.tasks.submit(queue, "echo", msgspec.Raw(EDGE_DOC))
    values = await env.orbit.tasks.submit(queue, "values", msgspec.Raw(EDGE_DOC))
    seen: dict[str, Any] = {}
    worker = _worker(env)

    @worker.task(queue, "echo")
    async def do_echo(ctx: TaskContext, payload: Any) -> Any:
        return msgspec.Raw(bytes(ctx.payload_raw))

    @worker.task(queue, "values")
    async def do_values(ctx: TaskContext, payload: Any) -> Any:
        seen["payload"] = payload  # decoding 1e400 must not fail the attempt
        return {"big": payload["nested"]["big"], "exact": Decimal("10.10")}

    await _run(worker, 2)
    done = await env.orbit.tasks.wait(echo.id, timeout=30)
    assert done.state == "SUCCEEDED" and bytes(done.result) == EDGE_DOC
    assert bytes(done.payload) == EDGE_DOC
    other = await env.orbit.tasks.wait(values.id, timeout=30)
    assert other.state == "SUCCEEDED", other.error
    assert seen["payload"]["nested"]["big"] == Decimal("1e400")
    assert seen["payload"]["money"] == 10.10  # Any gives floats where a float holds it
    assert number_texts(bytes(other.result)) == ["1E+400", "10.10"]  # Decimal as a number
    # Reading them back never fails either.
    decoded = done.decode_payload()
    assert decoded["numbers"][0] == Decimal("1e400") and decoded["numbers"][2] == Decimal("1e-400")
    assert done.decode_result(msgspec.Raw) == msgspec.Raw(EDGE_DOC)
    assert done.decode_result(dict[str, Any])["nested"]["zero"] == 0


async def test_error_details_with_any_number_decode(env: Env) -> None:
    queue = unique("sbj")
    await env.orbit.queues.put(queue)
    task = await env.orbit.tasks.submit(queue, "bad", None)
    worker = _worker(env)

    @worker.task(queue, "bad")
    async def bad(ctx: TaskContext, payload: Any) -> Any:
        raise PermanentError(
            "no", details={"nested": {"big": Decimal("1e400")}, "numbers": [1, Decimal("-1e400")]}
        )

    await _run(worker, 1)
    failed = await env.orbit.tasks.wait(task.id, timeout=30)  # decodes the error: no failure
    assert failed.state == "FAILED"
    assert failed.error["details"]["nested"]["big"] == Decimal("1e400")
    page = await env.orbit.tasks.list(queue=queue)
    assert page.items[0].error["details"]["numbers"][1] == Decimal("-1e400")


async def test_effect_results_keep_their_bytes_across_attempts(env: Env) -> None:
    queue = unique("sbj")
    await env.orbit.queues.put(
        queue, retry={"max_attempts": 2, "backoff_initial_ms": 10, "backoff_max_ms": 10,
                      "backoff_multiplier": 1}
    )  # fmt: skip
    task = await env.orbit.tasks.submit(queue, "pay", None)
    runs: list[int] = []
    got: list[tuple[Any, Any]] = []
    worker = _worker(env)

    @worker.task(queue, "pay")
    async def pay(ctx: TaskContext, payload: Any) -> Any:
        def charge() -> Any:
            runs.append(ctx.generation)
            return msgspec.Raw(EDGE_DOC)

        raw = await ctx.effect("charge", charge, result_type=msgspec.Raw)
        amount = await ctx.effect("amount", lambda: Decimal("10.10"), result_type=Decimal)
        got.append((raw, amount))
        if ctx.generation == 1:
            raise RetryableError("after the effects")
        return [raw, amount]

    await _run(worker, 2)
    final = await env.orbit.tasks.wait(task.id, timeout=30)
    assert final.state == "SUCCEEDED" and final.attempts == 2
    assert runs == [1], "a committed effect runs once"
    assert got == [(msgspec.Raw(EDGE_DOC), Decimal("10.10"))] * 2
    assert [str(a) for _, a in got] == ["10.10", "10.10"]
    assert bytes(final.result) == b"[" + EDGE_DOC + b",10.10]"  # the Decimal is a number
    assert number_texts(bytes(final.result)) == [*EDGE_DOC_NUMBERS, "10.10"]
