"""Order fulfilment on Orbit: a Weave workflow with a payment task, a wait for the warehouse's
``shipped`` signal with a timeout, a parallel notification fan-out, and a compensation path
(refund, then release the stock) — run end to end against a live server.

    python docs/examples/order_fulfilment/order_fulfilment.py \\
        --url http://127.0.0.1:8080 --key "$ORBIT_KEY" --namespace default

The key needs ``queues.manage``, ``workflows.manage``, ``workflows.signal``, ``tasks.read`` and
``workers.connect`` on the namespace (``orbit admin bootstrap`` prints such a key). The script

1. creates the queues ``warehouse``, ``payments`` and ``notifications``;
2. publishes the workflow ``order-fulfilment`` (built with ``orbit_sdk.workflow``);
3. runs an SDK :class:`~orbit_sdk.Worker` with the handlers below (simulated services);
4. starts three orders (the order id is the business key, so re-running is idempotent):

   * ``happy`` — paid, then the warehouse signals ``shipped`` (sent twice with the same
     ``signal_id``: the second is a de-duplicated replay) → SUCCEEDED with the tracking number;
   * ``lost`` — paid, but no ``shipped`` signal arrives in time → refund → release → FAILED
     ``order_cancelled``;
   * ``declined`` — the card is refused (a permanent task failure) → release → FAILED;

5. waits for the three instances to end and prints a JSON summary.

It is run in CI by ``tests/e2e/test_weave_e2e.py`` (with a short shipping timeout).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import secrets
import sys
from typing import Any

import httpx
from orbit_sdk import OrbitClient, PermanentError, RetryPolicy, TaskContext, Worker
from orbit_sdk.workflow import Retry, T, Workflow, concat, input, output, when

WORKFLOW = "order-fulfilment"
QUEUES = ("warehouse", "payments", "notifications")
TERMINAL = ("SUCCEEDED", "FAILED", "CANCELLED")


def definition(ship_timeout_ms: int = 86_400_000) -> dict[str, Any]:
    """The workflow definition (JSON object) — see docs/workflows.md for the language."""
    wf = Workflow(
        description="reserve stock, charge, wait for shipping; refund and release otherwise",
        input_schema=T.object(order_id=T.string, amount=T.number, card=T.string),
    )
    wf.task(
        "reserve", queue="warehouse", kind="reserve",
        payload={"order": input("order_id")},
        output_schema=T.object(reservation=T.string),
    )  # fmt: skip
    wf.task(
        "charge", queue="payments", kind="charge",
        payload={"order": input("order_id"), "cents": input("amount") * 100,
                 "card": input("card")},
        retry=Retry(max_attempts=3, backoff_initial_ms=100, backoff_max_ms=1000),
        output_schema=T.object(status=T.string, charge_id=T.string),
        on_failure="release",
    )  # fmt: skip
    wf.choice("paid", [when(output("charge", "status") == "captured", "ship")], default="release")
    wf.wait_signal(
        "ship", signal="shipped", correlation_key=input("order_id"),
        timeout_ms=ship_timeout_ms, on_timeout="refund",
        output_schema=T.object(tracking=T.string),
    )  # fmt: skip
    notify = wf.parallel("notify")
    notify.branch("customer").task(
        "email", queue="notifications", kind="email",
        payload={"order": input("order_id"), "tracking": output("ship", "tracking")},
    )  # fmt: skip
    notify.branch("accounting").task(
        "receipt", queue="notifications", kind="receipt",
        payload={"charge_id": output("charge", "charge_id"), "cents": input("amount") * 100},
    )  # fmt: skip
    wf.succeed(
        "done",
        output={"order": input("order_id"), "tracking": output("ship", "tracking"),
                "charge_id": output("charge", "charge_id")},
    )  # fmt: skip
    # Compensation: only reached by jumps (on_timeout, on_failure, the choice's default).
    wf.task(
        "refund", queue="payments", kind="refund",
        payload={"charge_id": output("charge", "charge_id")}, next="release",
    )  # fmt: skip
    wf.task(
        "release", queue="warehouse", kind="release",
        payload={"reservation": output("reserve", "reservation")}, next="cancelled",
    )  # fmt: skip
    wf.fail("cancelled", error="order_cancelled",
            message=concat("order ", input("order_id"), " was cancelled"))  # fmt: skip
    return wf.to_dict()


class Services:
    """Simulated warehouse, payment and notification services, recording what they did."""

    def __init__(self) -> None:
        self.log: list[tuple[str, Any]] = []

    def worker(self, url: str, key: str, namespace: str) -> Worker:
        w = Worker(url, key, namespace=namespace, max_concurrency=8)

        @w.task("warehouse", "reserve")
        async def reserve(ctx: TaskContext, p: dict[str, Any]) -> dict[str, Any]:
            self.log.append(("reserve", p["order"]))
            return {"reservation": f"res-{p['order']}"}

        @w.task("payments", "charge")
        async def charge(ctx: TaskContext, p: dict[str, Any]) -> dict[str, Any]:
            if p["card"] == "declined":
                raise PermanentError("card declined", type="CardDeclined")
            self.log.append(("charge", p["order"]))
            return {"status": "captured", "charge_id": f"ch-{p['order']}"}

        @w.task("payments", "refund")
        async def refund(ctx: TaskContext, p: dict[str, Any]) -> dict[str, Any]:
            self.log.append(("refund", p["charge_id"]))
            return {"refunded": p["charge_id"]}

        @w.task("warehouse", "release")
        async def release(ctx: TaskContext, p: dict[str, Any]) -> dict[str, Any]:
            self.log.append(("release", p["reservation"]))
            return {"released": p["reservation"]}

        @w.task("notifications", "email")
        async def email(ctx: TaskContext, p: dict[str, Any]) -> dict[str, Any]:
            self.log.append(("email", p["tracking"]))
            return {"sent": True}

        @w.task("notifications", "receipt")
        async def receipt(ctx: TaskContext, p: dict[str, Any]) -> dict[str, Any]:
            self.log.append(("receipt", p["charge_id"]))
            return {"sent": True}

        return w


class Api:
    """The workflow calls this example needs, over plain HTTP (docs/api/workflows.md)."""

    def __init__(self, http: httpx.AsyncClient, namespace: str) -> None:
        self.http = http
        self.ns = f"/v1/namespaces/{namespace}"

    async def _call(self, method: str, path: str, **kw: Any) -> tuple[int, Any]:
        r = await self.http.request(method, self.ns + path, **kw)
        if r.status_code >= 400:
            raise RuntimeError(f"{method} {path}: {r.status_code} {r.text}")
        return r.status_code, r.json()

    async def publish(self, doc: dict[str, Any]) -> int:
        _, body = await self._call("POST", f"/workflows/{WORKFLOW}/versions",
                                   json={"definition": doc})  # fmt: skip
        return int(body["version"])

    async def start(self, order: dict[str, Any], version: int) -> dict[str, Any]:
        _, body = await self._call(
            "POST", f"/workflows/{WORKFLOW}/instances",
            json={"input": order, "version": version, "business_key": order["order_id"]},
        )  # fmt: skip
        return body  # type: ignore[no-any-return]

    async def get(self, instance_id: str) -> dict[str, Any]:
        return (await self._call("GET", f"/instances/{instance_id}"))[1]  # type: ignore[no-any-return]

    async def signal(self, instance_id: str, name: str, signal_id: str, key: str,
                     payload: Any) -> int:  # fmt: skip
        status, _ = await self._call(
            "POST", f"/instances/{instance_id}/signals/{name}",
            json={"signal_id": signal_id, "correlation_key": key, "payload": payload},
        )  # fmt: skip
        return status

    async def wait_step(self, instance_id: str, step: str) -> dict[str, Any]:
        """Poll until ``step`` is RUNNING (or the instance ended)."""
        while True:
            inst = await self.get(instance_id)
            if inst["state"] in TERMINAL or any(
                s["step"] == step and s["state"] == "RUNNING" for s in inst["steps"]
            ):
                return inst
            await asyncio.sleep(0.05)

    async def wait_end(self, instance_id: str) -> dict[str, Any]:
        """Poll until the instance reached SUCCEEDED, FAILED or CANCELLED."""
        while True:
            inst = await self.get(instance_id)
            if inst["state"] in TERMINAL:
                return inst
            await asyncio.sleep(0.05)


async def run_demo(
    url: str, key: str, namespace: str, *, ship_timeout_ms: int = 3000, within_s: float = 60
) -> dict[str, Any]:
    """Run the three orders end to end; return ``{"orders", "instances", "signal_statuses",
    "services"}`` (what each instance did, and what the simulated services were asked)."""
    run_id = secrets.token_hex(3)
    orders = {
        "happy": {"order_id": f"o-{run_id}-1", "amount": 19.90, "card": "visa"},
        "lost": {"order_id": f"o-{run_id}-2", "amount": 5, "card": "visa"},
        "declined": {"order_id": f"o-{run_id}-3", "amount": 7.5, "card": "declined"},
    }
    services = Services()
    async with OrbitClient(url, key, namespace=namespace) as orbit, httpx.AsyncClient(
        base_url=url, headers={"Authorization": f"Bearer {key}"}, timeout=30
    ) as http:  # fmt: skip
        for q in QUEUES:
            await orbit.queues.put(
                q, lease_ms=5000,
                retry=RetryPolicy(max_attempts=3, backoff_initial_ms=100, backoff_max_ms=1000),
            )  # fmt: skip
        api = Api(http, namespace)
        version = await api.publish(definition(ship_timeout_ms))
        worker = services.worker(url, key, namespace)
        runner = asyncio.create_task(worker.run(install_signal_handlers=False))
        try:
            async with asyncio.timeout(within_s):
                started = {name: await api.start(o, version) for name, o in orders.items()}
                happy = started["happy"]
                await api.wait_step(happy["id"], "ship")
                oid = orders["happy"]["order_id"]
                payload = {"tracking": f"TRK-{oid}"}
                # The warehouse's signal; sent twice (a retry): the second is a replay (200).
                first = await api.signal(happy["id"], "shipped", f"ship-{oid}", oid, payload)
                again = await api.signal(happy["id"], "shipped", f"ship-{oid}", oid, payload)
                ended = {name: await api.wait_end(i["id"]) for name, i in started.items()}
        finally:
            worker.drain()
            with contextlib.suppress(Exception):
                await asyncio.wait_for(runner, 30)
    return {
        "orders": {name: o["order_id"] for name, o in orders.items()},
        "instances": {
            name: {
                "id": inst["id"],
                "state": inst["state"],
                "output": inst["output"],
                "error": inst["error"],
                "steps": {s["step"]: s["state"] for s in inst["steps"]},
            }
            for name, inst in ended.items()
        },
        "signal_statuses": [first, again],
        "services": services.log,
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--url", default=os.environ.get("ORBIT_URL", "http://127.0.0.1:8080"))
    parser.add_argument("--key", default=os.environ.get("ORBIT_KEY"))
    parser.add_argument("--namespace", default=os.environ.get("ORBIT_NAMESPACE", "default"))
    parser.add_argument("--ship-timeout-ms", type=int, default=3000,
                        help="how long the workflow waits for the shipped signal")  # fmt: skip
    args = parser.parse_args(argv)
    if not args.key:
        parser.error("--key (or ORBIT_KEY) is required")
    summary = asyncio.run(
        run_demo(args.url, args.key, args.namespace, ship_timeout_ms=args.ship_timeout_ms)
    )
    json.dump(summary, sys.stdout, indent=2)
    print()
    states = {k: v["state"] for k, v in summary["instances"].items()}
    return 0 if states == {"happy": "SUCCEEDED", "lost": "FAILED", "declined": "FAILED"} else 1


if __name__ == "__main__":
    sys.exit(main())
