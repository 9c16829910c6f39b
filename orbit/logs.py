"""Structured JSON logs: one JSON object per line on stderr.

Every record passes :class:`RedactSecrets` first: libraries logging at DEBUG (uvicorn logs a
WebSocket handshake's headers, ``Authorization`` included, and every frame's head and tail,
execution tokens and proofs included) must not put a credential in the logs. Orbit's own code never logs secrets; this is the net under third-party code.
"""

from __future__ import annotations

import logging
import re
import sys
import time
from typing import Any

import msgspec

_ENC = msgspec.json.Encoder()
_STD = set(vars(logging.makeLogRecord({})))


#: ``Bearer <anything>``, and API keys / session tokens by their shape (docs/security.md).
_SECRET = re.compile(
    r"(?i)(bearer\s+)[^\s'\",;]+"
    r"|\b(orb_[0-9a-f]{32}_|pws_[0-9a-f]{32}_[0-9a-f]{32}_)[A-Za-z0-9_\-]+"
)


#: A WebSocket frame dump (``websockets`` at DEBUG: ``< TEXT '{...}' [113 bytes]``, head and
#: tail of the payload): frames carry execution tokens, session tokens and delivery proofs.
_FRAME = re.compile(r"^([<>] (?:TEXT|BINARY|CONT))\b.*?(\[\d+ bytes\])?$", re.DOTALL)


def redact(text: str) -> str:
    """``text`` with bearer credentials and key/token secrets replaced by ``<redacted>``,
    and a WebSocket frame dump reduced to its type and size."""
    frame = _FRAME.match(text)
    if frame is not None:
        return f"{frame.group(1)} <payload redacted> {frame.group(2) or ''}".rstrip()
    return _SECRET.sub(lambda m: (m.group(1) or m.group(2)) + "<redacted>", text)


class RedactSecrets(logging.Filter):
    """Rewrites a record whose message carries a credential (see :func:`redact`)."""

    def filter(self, record: logging.LogRecord) -> bool:
        try:
            message = record.getMessage()
        except Exception:  # a broken format string: leave it to the formatter
            return True
        cleaned = redact(message)
        if cleaned != message:
            record.msg, record.args = cleaned, None
        return True


class JsonFormatter(logging.Formatter):
    """``{"ts", "level", "logger", "msg", ...extra fields, "exc"?}``."""

    def format(self, record: logging.LogRecord) -> str:
        out: dict[str, Any] = {
            "ts": time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(record.created))
            + f".{int(record.msecs * 1000):06d}Z",
            "level": record.levelname.lower(),
            "logger": record.name,
            "msg": record.getMessage(),
        }
        for k, v in vars(record).items():
            if k not in _STD and not k.startswith("_") and k != "color_message":
                out[k] = v if isinstance(v, (str, int, float, bool, type(None))) else repr(v)
        if record.exc_info:
            out["exc"] = self.formatException(record.exc_info)
        return _ENC.encode(out).decode()


def configure(level: str = "info", *, json: bool = True) -> None:
    """Route the root logger to stderr, as JSON lines (or plain text with ``json=False``)."""
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(
        JsonFormatter() if json else logging.Formatter("%(levelname)s %(name)s: %(message)s")
    )
    handler.addFilter(RedactSecrets())
    root = logging.getLogger()
    root.handlers[:] = [handler]
    root.setLevel(level.upper())
