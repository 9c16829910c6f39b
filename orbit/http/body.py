"""Request bodies: size limit, JSON depth limit, msgspec decoding with the offending field.

Policy (docs/api/admin.md, "Request bodies"):

* Bodies larger than ``settings.max_body_bytes`` (default 1 MiB) → 413 ``payload_too_large``
  (checked on ``Content-Length`` before reading, and while streaming a chunked body).
* JSON nested deeper than ``settings.max_json_depth`` (32; the body object is level 1) →
  400 ``invalid_request``, checked on the raw bytes before decoding, in time linear in the
  body's size whatever it holds (unterminated strings, runs of escapes, unbalanced brackets).
* Malformed JSON, a wrong type, a value out of range, a missing required field **and an
  unknown field** → 400 ``invalid_request`` with ``details.field`` naming the field as a
  path (``name``, ``retry.max_attempts``, ``tasks[3].queue``). Unknown fields are rejected
  (request Structs use ``forbid_unknown_fields=True``) so a typo never silently does nothing.
"""

from __future__ import annotations

import operator
import re
from itertools import accumulate, repeat
from typing import Any, TypeVar

import msgspec
from starlette.requests import Request

from orbit.errors import InvalidRequest

T = TypeVar("T")

DEFAULT_MAX_DEPTH = 32
# A JSON string, or what is left of an unterminated one. The loop is possessive and the end
# always matches (closing quote, end of input, or a lone trailing backslash), so every match
# attempt that starts at a quote succeeds and consumes: one left-to-right pass, never a
# re-scan from the next quote (which would make the unterminated ``"\\"\\"…`` case quadratic).
_STRING = re.compile(rb'"(?>[^"\\]++|\\.)*+(?:"|\\?\Z)', re.DOTALL)
_BRACKETS = bytes(range(256)).translate(None, b"[]{}")
_STEP = bytes.maketrans(b"[{]}", b"\x02\x02\x00\x00")
_PATH = re.compile(r" - at `\$(?P<path>[^`]*)`$")
_NAMED = re.compile(r"(?:unknown|missing required) field `(?P<name>[^`]+)`")


def json_depth(body: bytes) -> int:
    """Nesting depth of a JSON text (``{}`` is 1), counting brackets outside strings.

    Malformed input gives some number; decoding rejects it afterwards anyway. Linear in
    ``len(body)``: one regex pass removes strings, the rest are C-level translations and
    one running sum.
    """
    if body.count(b"[") + body.count(b"{") == 0:
        return 0
    brackets = _STRING.sub(b"", body).translate(None, _BRACKETS)
    if not brackets:
        return 0
    steps = brackets.translate(_STEP)
    deepest: int = max(accumulate(map(operator.sub, steps, repeat(1))))
    return max(0, deepest)


def check_depth(body: bytes, max_depth: int = DEFAULT_MAX_DEPTH) -> None:
    """Raise 400 when ``body`` nests deeper than ``max_depth``."""
    # Cheap exit: fewer opening brackets than the limit cannot exceed it.
    if body.count(b"[") + body.count(b"{") <= max_depth:
        return
    depth = json_depth(body)
    if depth > max_depth:
        raise InvalidRequest(
            f"JSON nesting is {depth} levels deep, the limit is {max_depth}",
            max_depth=max_depth,
        )


def field_of(error: msgspec.ValidationError | str) -> str | None:
    """The offending field of a msgspec validation message, as ``a.b[2].c`` (None: the body)."""
    msg = str(error)
    path = ""
    m = _PATH.search(msg)
    if m:
        path = m.group("path")
        msg = msg[: m.start()]
    named = _NAMED.search(msg)
    if named:
        path += "." + named.group("name")
    path = path.lstrip(".")
    return path or None


def decode(body: bytes, type_: type[T], *, max_depth: int = DEFAULT_MAX_DEPTH) -> T:
    """Decode a JSON body into ``type_`` or raise 400 naming the offending field."""
    if not body.strip():
        raise InvalidRequest("a JSON request body is required")
    check_depth(body, max_depth)
    try:
        return msgspec.json.decode(body, type=type_)
    except msgspec.ValidationError as exc:
        raise InvalidRequest(_clean(str(exc)), field=field_of(exc)) from None
    except msgspec.DecodeError as exc:
        raise InvalidRequest(f"malformed JSON: {exc}") from None


def _clean(msg: str) -> str:
    return _PATH.sub("", msg)


async def read_body(request: Request) -> bytes:
    """The raw body (the size limit is enforced while it is received, see middleware)."""
    return await request.body()


async def decode_body(request: Request, type_: type[T]) -> T:
    """Read, depth-check and decode the request body into ``type_`` (400/413 on failure)."""
    body = await read_body(request)
    return decode(body, type_, max_depth=_max_depth(request))


def _max_depth(request: Request) -> int:
    ctx = getattr(request.app.state, "ctx", None)
    return ctx.settings.max_json_depth if ctx is not None else DEFAULT_MAX_DEPTH


def decode_optional(
    body: bytes, type_: type[T], default: T, *, max_depth: int = DEFAULT_MAX_DEPTH
) -> T:
    """Like :func:`decode`, but an empty body gives ``default``."""
    if not body.strip():
        return default
    return decode(body, type_, max_depth=max_depth)


#: Largest integer a query parameter may hold (the signed 64-bit range of the database).
MAX_QUERY_INT = 2**63 - 1


def query_int(
    request: Request, name: str, default: int, *, minimum: int = 0, maximum: int = MAX_QUERY_INT
) -> int:
    """An integer query parameter from ``minimum`` to ``maximum``, else 400 naming it."""
    raw = request.query_params.get(name)
    if raw is None or raw == "":
        return default
    digits = raw[1:] if raw.startswith("-") else raw
    if not (digits.isascii() and digits.isdigit()):  # int() would take " 1", "+1", "1_0", "١"
        raise InvalidRequest(f"{name} must be an integer", field=name)
    value = int(raw)
    if value < minimum:
        raise InvalidRequest(f"{name} must be >= {minimum}", field=name)
    if value > maximum:
        raise InvalidRequest(f"{name} must be <= {maximum}", field=name)
    return value


def any_json(body: bytes) -> Any:
    """Decode arbitrary JSON (400 on malformed input)."""
    return decode(body, Any)
