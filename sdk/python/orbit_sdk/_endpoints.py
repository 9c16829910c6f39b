"""Several base URLs of one Orbit deployment, and moving between them.

Every Orbit node serves every request (they share one database), so a client given the URLs
of several nodes can use any of them. :class:`Endpoints` keeps the one in use (it sticks to
a node that works) and moves to the next one when that node fails; the HTTP transport, the
worker's stream and the subscriber's stream all use it. Moving on is immediate: a client
tries each other node at once and waits out its backoff only after a whole round of nodes
failed.

URLs come as a list or as one string with commas (``ORBIT_URL=http://a:8080,http://b:8080``).
"""

from __future__ import annotations

import logging
from collections.abc import Iterator, Sequence

__all__ = ["Endpoints", "ws_url"]

logger = logging.getLogger("orbit_sdk.endpoints")


def _split(urls: str | Sequence[str]) -> list[str]:
    items = urls.split(",") if isinstance(urls, str) else list(urls)
    out: list[str] = []
    for item in items:
        url = str(item).strip().rstrip("/")
        if url and url not in out:
            out.append(url)
    if not out:
        raise ValueError("at least one base URL is needed")
    return out


def ws_url(base: str) -> str:
    """The WebSocket form of an HTTP base URL (``http`` → ``ws``, ``https`` → ``wss``)."""
    if base.startswith("https://"):
        return "wss://" + base[len("https://") :]
    if base.startswith("http://"):
        return "ws://" + base[len("http://") :]
    return base


class Endpoints:
    """The base URLs of one deployment; :attr:`current` is the one in use."""

    def __init__(self, urls: str | Sequence[str]) -> None:
        self.urls = _split(urls)
        self._index = 0
        #: Moves to another URL so far (a node failed).
        self.failovers = 0

    def __len__(self) -> int:
        return len(self.urls)

    def __repr__(self) -> str:
        return f"Endpoints({self.urls!r}, current={self.current!r})"

    @property
    def current(self) -> str:
        """The URL in use."""
        return self.urls[self._index]

    def failed(self, url: str) -> bool:
        """``url`` failed: when it is the one in use, move to the next. True when another
        URL is there to move to."""
        if len(self.urls) == 1:
            return False
        if url == self.current:
            self._index = (self._index + 1) % len(self.urls)
            self.failovers += 1
            logger.warning("orbit node %s failed: using %s", url, self.current)
        return True

    def round(self) -> Iterator[str]:
        """Each URL once, from the one in use on (the order one request tries them in)."""
        start = self._index
        for i in range(len(self.urls)):
            yield self.urls[(start + i) % len(self.urls)]
