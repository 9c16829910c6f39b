"""Business JSON keeps its numbers at every entry point of the server, one rule for all:
any JSON text is accepted, stored as received and returned byte for byte; where the server
has to look inside (a report's digest, an error's details, a workflow copying values), it
reads numbers exactly as written. One corpus (tests/json_corpus.py) through each way in:

* task payloads (single and batch submit);
* results reported by a worker (HTTP fallback and WebSocket), their result events and
  subscription deliveries; a failure's error details;
* effect results (``commit`` and the ``committed`` answer of a later ``begin``);
* an operator's resolve result;
* workflow input, a task step's payload taken from it, the step's output, a signal's
  payload, and the instance output built from all three.
"""

from __future__ import annotations

import asyncio
import json
from typing import Any

import httpx
import msgspec
import websockets
from json_corpus import EDGE_DOC, EDGE_DOC_NUMBERS, number_texts
from sdk_server import Env, env_fixture, server_fixture, unique  # noqa: F401

HEADERS = {"Content-Type": "application/json"}


def _field(body: bytes, name: str) -> bytes:
    """The raw bytes of a top-level field of a JSON object (decoded lazily, never re-encoded)."""
    return bytes(msgspec.json.decode(body, type=dict[str, msgspec.Raw])[name])


async def _queue(http: httpx.AsyncClient, ns: str) -> str:
    queue = unique("bj")
    r = await http.put(f"/v1/namespaces/{ns}/queues/{queue}", json={})
    assert r.status_code == 201, r.text
    return queue


class _RawWorker:
    """The worker protocol over the HTTP fallback, frame by frame."""

    def __init__(self, http: httpx.AsyncClient, ns: str, queue: str) -> None:
        self.http, self.ns, self.queue = http, ns, queue
        self.token = ""
        self.sid = ""
        self.offers: list[dict[str, Any]] = []

    async def open(self) -> None:
        r = await self.http.post(
            f"/v1/namespaces/{self.ns}/workers/sessions",
            json={"instance": {"host": "h", "pid": 1, "sdk": "raw"}, "queues": [self.queue],
                  "max_concurrency": 4},
        )  # fmt: skip
        assert r.status_code == 201, r.text
        self.token, self.sid = r.json()["session_token"], r.json()["session_id"]

    def _auth(self) -> dict[str, str]:
        return {"Authorization": f"Bearer {self.token}", **HEADERS}

    async def take(self) -> tuple[str, str, dict[str, Any]]:
        """Poll one offer and start it: (attempt id, execution token, offered task)."""
        while not self.offers:
            r = await self.http.post(
                f"/v1/namespaces/{self.ns}/workers/sessions/{self.sid}/poll?wait_ms=10000",
                headers=self._auth(),
            )
            assert r.status_code == 200, r.text
            self.offers += r.json()["offers"]
        offer = self.offers.pop(0)
        aid = offer["attempt_id"]
        s = await self.post(aid, "start", b"")
        assert s.status_code == 200 and s.json()["type"] == "started", s.text
        return aid, s.json()["execution_token"], offer["task"]

    async def post(self, aid: str, op: str, body: bytes) -> httpx.Response:
        return await self.http.post(
            f"/v1/namespaces/{self.ns}/attempts/{aid}/{op}", content=body, headers=self._auth()
        )


def _body(token: str, **raw: bytes) -> bytes:
    parts = [b'"execution_token": ' + json.dumps(token).encode()]
    parts += [json.dumps(k).encode() + b": " + v for k, v in raw.items()]
    return b"{" + b", ".join(parts) + b"}"


async def test_payloads_single_and_batch_are_kept(env: Env) -> None:
    async with env.http() as http:
        queue = await _queue(http, env.ns)
        one = await http.post(
            f"/v1/namespaces/{env.ns}/tasks",
            content=b'{"queue": "%s", "kind": "k", "payload": %s}' % (queue.encode(), EDGE_DOC),
            headers=HEADERS,
        )
        assert one.status_code == 201, one.text
        assert _field(one.content, "payload") == EDGE_DOC
        batch = await http.post(
            f"/v1/namespaces/{env.ns}/tasks:batch",
            content=b'{"tasks": [{"queue": "%s", "kind": "k", "payload": %s}]}'
            % (queue.encode(), EDGE_DOC),
            headers=HEADERS,
        )
        assert batch.status_code == 200, batch.text
        assert EDGE_DOC in batch.content
        got = await http.get(f"/v1/namespaces/{env.ns}/tasks/{one.json()['id']}")
        assert _field(got.content, "payload") == EDGE_DOC


async def test_results_effects_and_error_details_are_kept(env: Env) -> None:
    async with env.http() as http:
        queue = await _queue(http, env.ns)
        sub = await http.put(
            f"/v1/namespaces/{env.ns}/subscriptions/{unique('s')}",
            json={"filter": {"queues": [queue]}, "start": "earliest"},
        )
        assert sub.status_code == 201, sub.text
        sub_name = sub.json()["name"]
        for kind in ("ok", "bad"):
            r = await http.post(
                f"/v1/namespaces/{env.ns}/tasks",
                json={"queue": queue, "kind": kind, "payload": None},
            )
            assert r.status_code == 201, r.text
        worker = _RawWorker(http, env.ns, queue)
        await worker.open()
        done: dict[str, str] = {}
        for _ in range(2):
            aid, token, task = await worker.take()
            done[task["kind"]] = task["id"]
            if task["kind"] == "ok":
                commit = await worker.post(
                    aid, "effect", _body(token, key=b'"charge"', phase=b'"commit"', result=EDGE_DOC)
                )
                assert commit.status_code == 200, commit.text
                assert _field(commit.content, "result") == EDGE_DOC
                again = await worker.post(
                    aid, "effect", _body(token, key=b'"charge"', phase=b'"begin"')
                )
                assert again.json()["state"] == "committed"
                assert _field(again.content, "result") == EDGE_DOC
                receipt = await worker.post(aid, "complete", _body(token, result=EDGE_DOC))
                assert receipt.status_code == 200, receipt.text
                # The same report re-sent: replayed (the digest reads the numbers exactly).
                replay = await worker.post(aid, "complete", _body(token, result=EDGE_DOC))
                assert replay.status_code == 200 and replay.json()["outcome"] == "replayed"
            else:
                error = b'{"type": "Bad", "message": "m", "details": %s}' % EDGE_DOC
                failed = await worker.post(aid, "fail", _body(token, error=error))
                assert failed.status_code == 200, failed.text
                assert failed.json()["task_state"] == "FAILED"
        ok = await http.get(f"/v1/namespaces/{env.ns}/tasks/{done['ok']}")
        assert ok.json()["state"] == "SUCCEEDED"
        assert _field(ok.content, "result") == EDGE_DOC
        bad = await http.get(f"/v1/namespaces/{env.ns}/tasks/{done['bad']}")
        assert number_texts(_field(_field(bad.content, "error"), "details")) == EDGE_DOC_NUMBERS
        events = await http.get(f"/v1/namespaces/{env.ns}/events?after_seq=0")
        assert EDGE_DOC in events.content
        attempts = await http.get(f"/v1/namespaces/{env.ns}/tasks/{done['bad']}/attempts")
        assert attempts.status_code == 200, attempts.text
        for number in EDGE_DOC_NUMBERS:  # the attempt's error, as stored
            assert number in number_texts(attempts.content)
        pulled = await http.post(
            f"/v1/namespaces/{env.ns}/subscriptions/{sub_name}/pull", json={"max": 10}
        )
        assert pulled.status_code == 200, pulled.text
        assert EDGE_DOC in pulled.content


async def test_websocket_report_is_kept(env: Env) -> None:
    async with env.http() as http:
        queue = await _queue(http, env.ns)
        r = await http.post(
            f"/v1/namespaces/{env.ns}/tasks", json={"queue": queue, "kind": "k", "payload": 1}
        )
        task_id = r.json()["id"]
        worker = _RawWorker(http, env.ns, queue)
        await worker.open()
        url = env.server.url.replace("http://", "ws://")
        path = f"/v1/namespaces/{env.ns}/workers/sessions/{worker.sid}/stream"
        async with websockets.connect(
            url + path, additional_headers={"Authorization": f"Bearer {worker.token}"}
        ) as ws:
            offer = json.loads(await ws.recv())
            while offer["type"] != "offer":
                offer = json.loads(await ws.recv())
            aid = offer["attempt_id"]
            await ws.send(json.dumps({"type": "start", "msg_id": "s", "attempt_id": aid}))
            started = json.loads(await ws.recv())
            assert started["type"] == "started", started
            frame = (
                b'{"type": "complete", "msg_id": "c", "attempt_id": "%s", "execution_token": "%s",'
                b' "result": %s}' % (aid.encode(), started["execution_token"].encode(), EDGE_DOC)
            )
            await ws.send(frame.decode())
            receipt = json.loads(await ws.recv())
            assert receipt["type"] == "receipt", receipt
        got = await http.get(f"/v1/namespaces/{env.ns}/tasks/{task_id}")
        assert _field(got.content, "result") == EDGE_DOC


async def test_resolve_result_is_kept(env: Env) -> None:
    async with env.http() as http:
        queue = await _queue(http, env.ns)
        r = await http.post(
            f"/v1/namespaces/{env.ns}/tasks", json={"queue": queue, "kind": "k", "payload": 1}
        )
        task_id = r.json()["id"]
        worker = _RawWorker(http, env.ns, queue)
        await worker.open()
        _aid, _token, _ = await worker.take()
        closed = await http.delete(
            f"/v1/namespaces/{env.ns}/workers/sessions/{worker.sid}",
            headers={"Authorization": f"Bearer {worker.token}"},
        )
        assert closed.status_code == 200 and closed.json()["lost_attempts"] == 1
        resolved = await http.post(
            f"/v1/namespaces/{env.ns}/tasks/{task_id}/resolve",
            content=b'{"action": "succeed", "note": "checked", "result": %s}' % EDGE_DOC,
            headers=HEADERS,
        )
        assert resolved.status_code == 200, resolved.text
        assert _field(resolved.content, "result") == EDGE_DOC


WORKFLOW = {
    "steps": [
        {"id": "calc", "type": "task", "queue": "__QUEUE__", "kind": "calc",
         "payload": {"from_input": {"$": "$.input"}}},
        {"id": "wait", "type": "wait_signal", "signal": "go"},
        {"id": "done", "type": "succeed",
         "output": {"input": {"$": "$.input"}, "task": {"$": "$.steps.calc.output"},
                    "signal": {"$": "$.steps.wait.output"}}},
    ],
}  # fmt: skip


async def test_workflow_input_output_and_signal_payloads_are_kept(env: Env) -> None:
    async with env.http() as http:
        queue = await _queue(http, env.ns)
        name = unique("wf")
        definition = json.loads(json.dumps(WORKFLOW).replace("__QUEUE__", queue))
        r = await http.post(
            f"/v1/namespaces/{env.ns}/workflows/{name}/versions", json={"definition": definition}
        )
        assert r.status_code == 201, r.text
        started = await http.post(
            f"/v1/namespaces/{env.ns}/workflows/{name}/instances",
            content=b'{"input": %s}' % EDGE_DOC,
            headers=HEADERS,
        )
        assert started.status_code == 201, started.text
        assert _field(started.content, "input") == EDGE_DOC
        iid = started.json()["id"]
        worker = _RawWorker(http, env.ns, queue)
        await worker.open()
        aid, token, task = await worker.take()
        # The step's payload copied the input's values: every number as written.
        offered = await http.get(f"/v1/namespaces/{env.ns}/tasks/{task['id']}")
        assert number_texts(_field(offered.content, "payload")) == EDGE_DOC_NUMBERS
        receipt = await worker.post(aid, "complete", _body(token, result=EDGE_DOC))
        assert receipt.status_code == 200, receipt.text
        signal = await http.post(
            f"/v1/namespaces/{env.ns}/instances/{iid}/signals/go",
            content=b'{"signal_id": "s1", "payload": %s}' % EDGE_DOC,
            headers=HEADERS,
        )
        assert signal.status_code == 201, signal.text
        assert _field(signal.content, "payload") == EDGE_DOC
        for _ in range(300):
            inst = await http.get(f"/v1/namespaces/{env.ns}/instances/{iid}")
            if inst.json()["state"] != "RUNNING":
                break
            await asyncio.sleep(0.05)
        assert inst.json()["state"] == "SUCCEEDED", inst.text
        output = _field(inst.content, "output")
        assert number_texts(output) == EDGE_DOC_NUMBERS * 3, output


async def test_text_that_is_not_json_is_400_naming_the_field_at_every_entry(env: Env) -> None:
    """The same one check everywhere: invalid UTF-8 inside a string (what JSON_VALID would
    refuse) is a 400 naming the field and changes nothing — never a 500."""
    bad = b'{"s": "\xff"}'
    async with env.http() as http:
        queue = await _queue(http, env.ns)
        r = await http.post(
            f"/v1/namespaces/{env.ns}/tasks",
            content=b'{"queue": "%s", "kind": "k", "payload": %s}' % (queue.encode(), bad),
            headers=HEADERS,
        )
        assert r.status_code == 400 and r.json()["error"]["details"]["field"] == "payload"
        r = await http.post(
            f"/v1/namespaces/{env.ns}/tasks", json={"queue": queue, "kind": "k", "payload": 1}
        )
        task_id = r.json()["id"]
        worker = _RawWorker(http, env.ns, queue)
        await worker.open()
        aid, token, _ = await worker.take()
        effect = await worker.post(
            aid, "effect", _body(token, key=b'"e"', phase=b'"commit"', result=bad)
        )
        assert effect.status_code == 400, effect.text
        assert effect.json()["error"]["details"]["field"] == "result"
        report = await worker.post(aid, "complete", _body(token, result=bad))
        assert report.status_code == 400, report.text
        assert report.json()["error"]["details"]["field"] == "result"
        error = b'{"type": "X", "message": "m", "details": %s}' % bad
        failed = await worker.post(aid, "fail", _body(token, error=error))
        assert failed.status_code == 400, failed.text
        assert failed.json()["error"]["details"]["field"] == "error.details"
        got = await http.get(f"/v1/namespaces/{env.ns}/tasks/{task_id}")
        assert got.json()["state"] == "RUNNING"  # nothing changed
        ok = await worker.post(aid, "complete", _body(token, result=EDGE_DOC))
        assert ok.status_code == 200 and ok.json()["outcome"] == "applied"
