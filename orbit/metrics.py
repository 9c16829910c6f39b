"""A tiny Prometheus registry: Counter, Gauge and Histogram with labels, text exposition 0.0.4.

One :class:`Registry` lives on ``AppContext.metrics``. Metrics are get-or-create by name
(``registry.counter(name, help, labels)``), so every package registers what it needs at import
or startup without a central list.

A scrape costs O(1) in the data: it never touches the database and never waits for a pool
connection. Two hooks fill gauges:

* **collectors** (``add_collector``) run at scrape time and may only copy in-memory values
  (``db.stats``, pool sizes, group-commit counters) into gauges;
* **refreshers** (``add_refresher``) compute gauges from the database. They run in the
  background at a fixed interval (:meth:`Registry.run_refresh`, started by the server, default
  every 10 s, ``ORBIT_METRICS_REFRESH_S``), one after the other, each bounded by its own
  queries' limits; a scrape shows the last values they set.

The rendered text is cached for ``render_ttl_s`` (1 s) so a burst of scrapes renders once.

Label values are escaped; label *names* are fixed per metric. Keep cardinality bounded: label
by route template, status, kind or queue name, never by id.
"""

from __future__ import annotations

import asyncio
import bisect
import contextlib
import inspect
import logging
import math
import threading
import time
from collections.abc import Awaitable, Callable, Iterable, Sequence
from typing import Protocol, TypeVar

log = logging.getLogger("orbit.metrics")

Number = int | float
Collector = Callable[[], Awaitable[None] | None]
Refresher = Callable[[], Awaitable[None]]
#: Seconds between two background refreshes of the database-computed gauges.
DEFAULT_REFRESH_S = 10.0


class Refreshing(Protocol):
    """An object that refreshes its gauges (see :meth:`Registry.refreshing`)."""

    def refresh(self) -> Awaitable[None]: ...


R = TypeVar("R", bound=Refreshing)

DEFAULT_BUCKETS: tuple[float, ...] = (
    0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0,
)  # fmt: skip


def _escape(value: str) -> str:
    return value.replace("\\", "\\\\").replace("\n", "\\n").replace('"', '\\"')


def _fmt(value: Number) -> str:
    if isinstance(value, float):
        if math.isinf(value):
            return "+Inf" if value > 0 else "-Inf"
        if math.isnan(value):
            return "NaN"
        if value.is_integer() and abs(value) < 1e15:
            return str(int(value))
        return repr(value)
    return str(value)


def _labels(names: Sequence[str], values: Sequence[str], extra: str = "") -> str:
    parts = [f'{n}="{_escape(v)}"' for n, v in zip(names, values, strict=True)]
    if extra:
        parts.append(extra)
    return "{" + ",".join(parts) + "}" if parts else ""


class _Metric:
    kind = "untyped"

    def __init__(self, name: str, help: str, labels: Sequence[str] = ()) -> None:
        self.name = name
        self.help = help
        self.label_names = tuple(labels)
        self._lock = threading.Lock()

    def _key(self, labels: dict[str, str] | None, kw: dict[str, str]) -> tuple[str, ...]:
        merged = {**(labels or {}), **kw}
        if set(merged) != set(self.label_names):
            raise ValueError(f"{self.name}: labels {sorted(merged)} != {sorted(self.label_names)}")
        return tuple(str(merged[n]) for n in self.label_names)

    def render(self) -> list[str]:  # pragma: no cover - overridden
        raise NotImplementedError


class Counter(_Metric):
    """A monotonically increasing count per label set."""

    kind = "counter"

    def __init__(self, name: str, help: str, labels: Sequence[str] = ()) -> None:
        super().__init__(name, help, labels)
        self._values: dict[tuple[str, ...], float] = {}

    def inc(self, amount: Number = 1, labels: dict[str, str] | None = None, **kw: str) -> None:
        if amount < 0:
            raise ValueError("a counter only goes up")
        key = self._key(labels, kw)
        with self._lock:
            self._values[key] = self._values.get(key, 0) + amount

    def set_total(self, total: Number, labels: dict[str, str] | None = None, **kw: str) -> None:
        """Mirror an external monotonic total (e.g. ``db.stats.commits``) at scrape time."""
        key = self._key(labels, kw)
        with self._lock:
            self._values[key] = total

    def value(self, labels: dict[str, str] | None = None, **kw: str) -> float:
        return self._values.get(self._key(labels, kw), 0)

    def render(self) -> list[str]:
        with self._lock:
            items = sorted(self._values.items())
        return [f"{self.name}{_labels(self.label_names, k)} {_fmt(v)}" for k, v in items]


class Gauge(_Metric):
    """A value that goes up and down per label set."""

    kind = "gauge"

    def __init__(self, name: str, help: str, labels: Sequence[str] = ()) -> None:
        super().__init__(name, help, labels)
        self._values: dict[tuple[str, ...], float] = {}

    def set(self, value: Number, labels: dict[str, str] | None = None, **kw: str) -> None:
        key = self._key(labels, kw)
        with self._lock:
            self._values[key] = value

    def inc(self, amount: Number = 1, labels: dict[str, str] | None = None, **kw: str) -> None:
        key = self._key(labels, kw)
        with self._lock:
            self._values[key] = self._values.get(key, 0) + amount

    def dec(self, amount: Number = 1, labels: dict[str, str] | None = None, **kw: str) -> None:
        self.inc(-amount, labels, **kw)

    def clear(self) -> None:
        """Forget every label set (collectors call it before re-filling a gauge)."""
        with self._lock:
            self._values.clear()

    def value(self, labels: dict[str, str] | None = None, **kw: str) -> float:
        return self._values.get(self._key(labels, kw), 0)

    def render(self) -> list[str]:
        with self._lock:
            items = sorted(self._values.items())
        return [f"{self.name}{_labels(self.label_names, k)} {_fmt(v)}" for k, v in items]


class Histogram(_Metric):
    """Cumulative buckets, sum and count per label set."""

    kind = "histogram"

    def __init__(
        self,
        name: str,
        help: str,
        labels: Sequence[str] = (),
        buckets: Iterable[float] = DEFAULT_BUCKETS,
    ) -> None:
        super().__init__(name, help, labels)
        self.buckets = tuple(sorted(buckets))
        self._data: dict[tuple[str, ...], tuple[list[int], list[float]]] = {}

    def observe(self, value: Number, labels: dict[str, str] | None = None, **kw: str) -> None:
        key = self._key(labels, kw)
        with self._lock:
            counts, acc = self._data.setdefault(key, ([0] * (len(self.buckets) + 1), [0.0, 0]))
            counts[bisect.bisect_left(self.buckets, value)] += 1
            acc[0] += value
            acc[1] += 1

    def count(self, labels: dict[str, str] | None = None, **kw: str) -> int:
        data = self._data.get(self._key(labels, kw))
        return int(data[1][1]) if data else 0

    def render(self) -> list[str]:
        out: list[str] = []
        with self._lock:
            items = sorted((k, (list(c), list(a))) for k, (c, a) in self._data.items())
        for key, (counts, (total, n)) in items:
            running = 0
            for bound, c in zip((*self.buckets, math.inf), counts, strict=True):
                running += c
                le = f'le="{_fmt(float(bound))}"'
                out.append(f"{self.name}_bucket{_labels(self.label_names, key, le)} {running}")
            out.append(f"{self.name}_sum{_labels(self.label_names, key)} {_fmt(total)}")
            out.append(f"{self.name}_count{_labels(self.label_names, key)} {_fmt(n)}")
        return out


class Registry:
    """Get-or-create metrics by name and render them all as Prometheus text."""

    def __init__(self, *, render_ttl_s: float = 1.0) -> None:
        self._metrics: dict[str, _Metric] = {}
        self._collectors: list[Collector] = []
        self._refreshers: dict[str, Refresher] = {}
        self._refreshing: dict[str, Refreshing] = {}
        self._lock = threading.Lock()
        self.render_ttl_s = render_ttl_s
        self._rendered: tuple[float, str] | None = None
        self._rendering: asyncio.Future[str] | None = None

    def _get(
        self, cls: type[_Metric], name: str, help: str, labels: Sequence[str], **kw: object
    ) -> _Metric:
        with self._lock:
            existing = self._metrics.get(name)
            if existing is not None:
                if type(existing) is not cls or existing.label_names != tuple(labels):
                    raise ValueError(f"metric {name} already registered with another type/labels")
                return existing
            metric = cls(name, help, labels, **kw)
            self._metrics[name] = metric
            return metric

    def counter(self, name: str, help: str, labels: Sequence[str] = ()) -> Counter:
        return self._get(Counter, name, help, labels)  # type: ignore[return-value]

    def gauge(self, name: str, help: str, labels: Sequence[str] = ()) -> Gauge:
        return self._get(Gauge, name, help, labels)  # type: ignore[return-value]

    def histogram(
        self,
        name: str,
        help: str,
        labels: Sequence[str] = (),
        buckets: Iterable[float] = DEFAULT_BUCKETS,
    ) -> Histogram:
        return self._get(Histogram, name, help, labels, buckets=tuple(buckets))  # type: ignore[return-value]

    def add_collector(self, fn: Collector) -> None:
        """Run ``fn()`` before every render. It may only read memory (never the database):
        it runs on the scrape's path."""
        self._collectors.append(fn)

    def add_refresher(self, name: str, fn: Refresher) -> None:
        """Register ``fn`` (async, may query the database with bounded queries) to refresh
        gauges in the background; one per ``name`` (a second registration replaces it)."""
        self._refreshers[name] = fn

    def refreshing(self, name: str, make: Callable[[], R]) -> R:
        """The refresher object registered as ``name``; on first use ``make()`` builds it and
        its ``refresh`` is registered (:meth:`add_refresher`). Once per registry."""
        existing = self._refreshing.get(name)
        if existing is None:
            existing = self._refreshing[name] = make()
            self.add_refresher(name, existing.refresh)
        return existing  # type: ignore[return-value]

    async def collect(self) -> None:
        for fn in list(self._collectors):
            result = fn()
            if inspect.isawaitable(result):
                await result

    async def refresh(self) -> None:
        """Run every refresher once, one after the other. A failing refresher is logged and
        counted (``orbit_metrics_refresh_errors_total{gauge}``); its gauges keep their last
        values. Called by :meth:`run_refresh` (and by tests)."""
        seconds = self.histogram(
            "orbit_metrics_refresh_seconds",
            "Time of one background refresh of database-computed gauges, by refresher",
            ("gauge",),
        )
        errors = self.counter(
            "orbit_metrics_refresh_errors_total",
            "Background gauge refreshes that failed (the gauges keep their last values)",
            ("gauge",),
        )
        for name, fn in list(self._refreshers.items()):
            started = time.perf_counter()
            try:
                await fn()
            except asyncio.CancelledError:
                raise
            except Exception:
                errors.inc(gauge=name)
                log.warning("metrics refresh %s failed", name, exc_info=True)
            seconds.observe(time.perf_counter() - started, gauge=name)
        self._rendered = None

    async def run_refresh(self, stop: asyncio.Event, interval_s: float = DEFAULT_REFRESH_S) -> None:
        """Refresh at once, then every ``interval_s`` until ``stop`` is set."""
        while not stop.is_set():
            await self.refresh()
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(stop.wait(), interval_s)

    def render(self) -> str:
        lines: list[str] = []
        with self._lock:
            metrics = sorted(self._metrics.values(), key=lambda m: m.name)
        for m in metrics:
            lines.append(f"# HELP {m.name} {m.help.replace(chr(10), ' ')}")
            lines.append(f"# TYPE {m.name} {m.kind}")
            lines.extend(m.render())
        return "\n".join(lines) + "\n"

    async def render_async(self) -> str:
        """Run the collectors, then render."""
        await self.collect()
        return self.render()

    async def scrape(self) -> str:
        """The text of a scrape: rendered at most once per ``render_ttl_s``; concurrent
        scrapes share one rendering. Touches no database."""
        now = time.monotonic()
        cached = self._rendered
        if cached is not None and now - cached[0] < self.render_ttl_s:
            return cached[1]
        if self._rendering is not None:
            return await asyncio.shield(self._rendering)
        future: asyncio.Future[str] = asyncio.get_running_loop().create_future()
        self._rendering = future
        try:
            text = await self.render_async()
        except BaseException as exc:
            future.set_exception(exc)
            future.exception()  # retrieved: concurrent scrapes re-raise it themselves
            raise
        finally:
            self._rendering = None
        self._rendered = (time.monotonic(), text)
        future.set_result(text)
        return text


# Names of the platform's standard metrics (other packages reuse the conflict counter).
HTTP_REQUESTS = "orbit_http_requests_total"
HTTP_DURATION = "orbit_http_request_duration_seconds"
CONFLICTS = "orbit_conflicts_total"


def conflicts(registry: Registry) -> Counter:
    """``orbit_conflicts_total{kind}``: every 409/412/429 and rejected CAS, by kind."""
    return registry.counter(CONFLICTS, "Conflicts returned to clients, by kind", ("kind",))


def count_conflict(registry: Registry, kind: str) -> None:
    conflicts(registry).inc(kind=kind)
