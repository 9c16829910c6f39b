"""Payloads are stored and returned byte for byte
(docs/invariants.md#10-business-json-keeps-its-numbers): a Hypothesis property over JSON texts with odd number spellings, escapes, raw unicode and whitespace, through submit
(single and batch), the stored column, and reads."""

from __future__ import annotations

import json

import msgspec
import pytest
from hypothesis import HealthCheck, Phase, given, settings
from hypothesis import strategies as st
from json_corpus import EDGE_NUMBERS

from orbit.errors import InvalidRequest
from orbit.storage import Database, Tx
from pulse import submit, tasks
from pulse.types import TaskSubmit

#: The shared corpus of edge numbers (tests/json_corpus.py) and a few more spellings.
ODD_NUMBERS = [
    *EDGE_NUMBERS, "0", "0.0", "1.0", "1.50", "1E5", "1e+5", "1E-5", "-1.50e-10",
]  # fmt: skip


def _string_literal(text: str, escape_mask: list[bool]) -> str:
    out = ['"']
    for ch, esc in zip(text, escape_mask + [False] * len(text), strict=False):
        code = ord(ch)
        if ch in '"\\' or code < 0x20:
            out.append(f"\\u{code:04x}" if esc or code < 0x20 else "\\" + ch)
        elif esc and code > 0xFFFF:
            v = code - 0x10000
            out.append(f"\\u{0xD800 + (v >> 10):04x}\\u{0xDC00 + (v & 0x3FF):04X}")
        elif esc:
            out.append(f"\\u{code:04x}")
        else:
            out.append(ch)
    out.append('"')
    return "".join(out)


strings = st.builds(_string_literal, st.text(max_size=12), st.lists(st.booleans(), max_size=12))
numbers = st.one_of(
    st.sampled_from(ODD_NUMBERS),
    st.integers(min_value=-(10**40), max_value=10**40).map(str),
    st.floats(allow_nan=False, allow_infinity=False).map(repr),
)
ws = st.sampled_from(["", " ", "  ", "\n", "\t", " \r\n "])
scalars = st.one_of(numbers, strings, st.sampled_from(["true", "false", "null"]))


def _array(items: list[tuple[str, str]]) -> str:
    return "[" + ",".join(f"{a}{v}{b}" for a, v, b in items) + "]"


def _object(items: list[tuple[str, str, str]]) -> str:
    return "{" + ",".join(f"{k}{sp}:{sp}{v}" for k, sp, v in items) + "}"


values = st.recursive(
    scalars,
    lambda inner: st.one_of(
        st.lists(st.tuples(ws, inner, ws), max_size=4).map(_array),
        st.lists(st.tuples(strings, ws, inner), max_size=4).map(_object),
    ),
    max_leaves=12,
)


def collect(n: int) -> list[str]:
    """Draw ``n`` JSON texts with Hypothesis (the DB round trip runs on the collected set)."""
    out: list[str] = []

    @settings(
        max_examples=n,
        database=None,
        deadline=None,
        phases=[Phase.generate],
        suppress_health_check=list(HealthCheck),
    )
    @given(values)
    def draw(text: str) -> None:
        json.loads(text)  # the generator makes valid JSON only
        out.append(text)

    draw()
    return out


class Item(msgspec.Struct):
    status: int
    task: msgspec.Raw = msgspec.Raw(b"null")


class Batch(msgspec.Struct):
    items: list[Item]


class Ident(msgspec.Struct):
    id: str


async def stored_payload(db: Database, ns: bytes, task_id: str) -> str:
    async def run(tx: Tx) -> str:
        return str(
            await tx.fetchval(
                "SELECT payload FROM pulse_tasks WHERE namespace_id = %s AND id = %s",
                (ns, bytes.fromhex(task_id)),
            )
        )

    return await db.read(run)


def task_bytes(text: str) -> bytes:
    return b'{"queue": "default", "kind": "k", "payload": ' + text.encode() + b"}"


def payload_in(body: bytes) -> bytes:
    """The raw bytes of the ``payload`` member of an encoded task object."""

    class P(msgspec.Struct):
        payload: msgspec.Raw

    return bytes(msgspec.json.decode(body, type=P).payload)


async def test_payload_round_trip_is_byte_exact(db, tenant) -> None:
    t = await tenant()
    texts = collect(150)
    # batch: one transaction for many payloads
    batch = await submit.submit_batch(
        db, t.namespace_id, t.application_id, [task_bytes(x) for x in texts]
    )
    items = msgspec.json.decode(batch.body, type=Batch).items  # raw: 1e400 stays text
    assert [i.status for i in items] == [201] * len(texts)
    ids = []
    for text, item in zip(texts, items, strict=True):
        assert payload_in(bytes(item.task)) == text.encode()
        ids.append(msgspec.json.decode(bytes(item.task), type=Ident).id)
    # stored column and reads
    for text, tid in list(zip(texts, ids, strict=True))[:40]:
        assert await stored_payload(db, t.namespace_id, tid) == text
        got = await tasks.get_task(db, t.namespace_id, tid)
        assert bytes(got["payload"]) == text.encode()
        assert payload_in(msgspec.json.encode(got)) == text.encode()
    # single submit path
    for text in texts[:20]:
        res = await submit.submit_one(
            db, t.namespace_id, t.application_id, submit.decode_item(task_bytes(text))
        )
        assert payload_in(res.body) == text.encode()


async def test_odd_numbers_survive(db, tenant) -> None:
    t = await tenant()
    text = "[" + ", ".join(ODD_NUMBERS) + ', "\\u00e9\\ud83d\\ude00", "é😀"]'
    task = await t.submit()  # warm
    res = await submit.submit_one(
        db, t.namespace_id, t.application_id, submit.decode_item(task_bytes(text))
    )
    assert payload_in(res.body) == text.encode()
    got = await tasks.get_task(db, t.namespace_id, msgspec.json.decode(res.body, type=Ident).id)
    assert bytes(got["payload"]) == text.encode()
    assert task["payload"] is None  # an absent payload is JSON null


async def test_invalid_payload_text_is_400(db, tenant) -> None:
    t = await tenant()
    # An unpaired surrogate escape: rejected while decoding the body.
    with pytest.raises(InvalidRequest):
        submit.decode_item(task_bytes('"\\udc00"'))
    # An encoded surrogate (invalid UTF-8) passes the body parser, not the service.
    item = msgspec.json.decode(
        task_bytes('"x"').replace(b'"x"', b'"\xed\xa0\x80"'), type=TaskSubmit
    )
    with pytest.raises(InvalidRequest) as info:
        await submit.submit_one(db, t.namespace_id, t.application_id, item)
    assert info.value.field == "payload"
    res = await submit.submit_batch(
        db, t.namespace_id, t.application_id, [task_bytes('"\\udc00"'), task_bytes("1")]
    )
    assert [i.status for i in msgspec.json.decode(res.body, type=Batch).items] == [400, 201]
