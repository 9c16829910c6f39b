"""A tiny Prometheus registry: Counter, Gauge and Histogram with labels, text exposition 0.0.4.

One :class:`Registry` lives on ``AppContext.metrics``. Metrics are get-or-create by name
(``registry.counter(name, help, labels)``), so every package registers what it needs at import
or startup without a central list. Collectors (sync or async callables) run at scrape time to
refresh gauges from the database or from ``db.stats``; they must be cheap and bounded.

Label values are escaped; label *names* are fixed per metric. Keep cardinality bounded: label
by route template, status, kind or queue name, never by id.
"""

from __future__ import annotations

import bisect
import inspect
import math
import threading
from collections.abc import Awaitable, Callable, Iterable, Sequence

Number = int | float
Collector = Callable[[], Awaitable[None] | None]

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

    def __init__(self) -> None:
        self._metrics: dict[str, _Metric] = {}
        self._collectors: list[Collector] = []
        self._lock = threading.Lock()

    def _get(
        self, cls: type[_Metric], name: str, help: str, labels: Sequence[str], **kw: object
    ) -> _Metric:
        with self._lock:
            existing = self._metrics.get(name)
            if existing is not None:
                if type(existing) is not cls or existing.label_names != tuple(labels):
                    raise ValueError(f"metric {name} already registered with another type/labels")
                return existing
            metric = cls(name, help, labels, **kw)  # type: ignore[arg-type]
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
        """Run ``fn()`` (sync or async) before every render to refresh gauges."""
        self._collectors.append(fn)

    async def collect(self) -> None:
        for fn in list(self._collectors):
            result = fn()
            if inspect.isawaitable(result):
                await result

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


# Names of the platform's standard metrics (other packages reuse the conflict counter).
HTTP_REQUESTS = "orbit_http_requests_total"
HTTP_DURATION = "orbit_http_request_duration_seconds"
CONFLICTS = "orbit_conflicts_total"


def conflicts(registry: Registry) -> Counter:
    """``orbit_conflicts_total{kind}``: every 409/412/429 and rejected CAS, by kind."""
    return registry.counter(CONFLICTS, "Conflicts returned to clients, by kind", ("kind",))


def count_conflict(registry: Registry, kind: str) -> None:
    conflicts(registry).inc(kind=kind)
