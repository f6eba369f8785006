"""Prometheus metrics on a per-app CollectorRegistry (tests build many apps in one process), and the
ASGI middleware that times every request by route template (not raw path: bounded cardinality).

With `harmony serve --workers N` every worker is its own process with its own counters, and a scrape
or a status page reaches one of them. So the launcher starts the workers in prometheus-client's
multiprocess mode (PROMETHEUS_MULTIPROC_DIR, set before they import prometheus_client): each
process writes its values to memory-mapped files there, and `/metrics` and the status page read
the sum over all of them (`multiprocess_dir`, see launch.prepare_multiprocess_dir)."""

from __future__ import annotations

import os
import time
from collections.abc import Callable, Iterator
from contextvars import ContextVar
from pathlib import Path

from harmony_mobile.server.core.status_history import MetricHistory
from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest, values
from prometheus_client.core import GaugeMetricFamily
from prometheus_client.multiprocess import MultiProcessCollector
from starlette.requests import ClientDisconnect
from starlette.types import ASGIApp, Message, Receive, Scope, Send

# nginx's code for "client closed the request": the client left before any answer was sent.
CLIENT_CLOSED = 499
LATENCY_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0)
BATCH_BUCKETS = (1, 2, 4, 8, 16, 32, 64, 128)


MULTIPROCESS_ENV = "PROMETHEUS_MULTIPROC_DIR"
# The tier an infer request was answered for, set by the endpoint through count_fallback_rows and
# read by the middleware once the response is sent: the endpoint knows the tier (a header or a JSON
# parameter), only the middleware knows when the request ended.
_answered_tier: ContextVar[list[str | None] | None] = ContextVar("answered_tier", default=None)


def multiprocess_dir() -> Path | None:
    """The shared metrics directory if this process writes its metrics there, else None. Both must
    hold: the variable is set, and it was set when prometheus_client was imported (the library
    chooses its value class then; a test process may set the variable later)."""
    path = os.environ.get(MULTIPROCESS_ENV)
    return Path(path) if path and values.ValueClass._multiprocess else None


def process_is_running(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # someone else's process: it exists
        return True
    return True


def forget_dead_processes(path: Path) -> None:
    """Drop the live-gauge files of processes that are gone (a worker uvicorn replaced): their queue
    depth is no longer anyone's. Their counters stay, so the sums never go backwards."""
    for file in path.glob("gauge_live*_*.db"):
        pid = file.stem.rsplit("_", 1)[-1]
        if pid.isdigit() and not process_is_running(int(pid)):
            file.unlink(missing_ok=True)


class DefaultVersionCollector:
    """`harmony_default_version_info{version}` = 1: the version the scraped process serves by default,
    read at scrape time (every worker follows the store's default within default_refresh_seconds)."""

    def __init__(self) -> None:
        self.current: Callable[[], str | None] = lambda: None

    def collect(self) -> Iterator[GaugeMetricFamily]:
        family = GaugeMetricFamily(
            "harmony_default_version_info", "the back-end version served by default", labels=["version"]
        )
        version = self.current()
        if version is not None:
            family.add_metric([version], 1.0)
        yield family


class ServerMetrics:
    def __init__(self) -> None:
        self.multiprocess_dir = multiprocess_dir()
        if self.multiprocess_dir is not None:
            forget_dead_processes(self.multiprocess_dir)
        self.registry = CollectorRegistry(auto_describe=True)
        self.history = MetricHistory()  # the status page's plots over time
        self.default_version = DefaultVersionCollector()
        self.registry.register(self.default_version)
        self._http_metrics(self.registry)
        self._inference_metrics(self.registry)
        self._operator_metrics(self.registry)
        # labelled children by label values: prometheus_client's labels() validates and locks on each
        # call, a per-request cost the counts do not need (the key sets are bounded like the labels)
        self._request_children: dict[tuple[str, str, int], tuple] = {}
        self._fallback_children: dict[str, object] = {}
        self._tier_latency_children: dict[str, object] = {}

    def _http_metrics(self, r: CollectorRegistry) -> None:
        self.requests = Counter(
            "harmony_http_requests",
            "HTTP requests by route, method and status",
            ["route", "method", "status"],
            registry=r,
        )
        self.latency = Histogram(
            "harmony_http_request_duration_seconds",
            "HTTP request latency by route",
            ["route", "method"],
            buckets=LATENCY_BUCKETS,
            registry=r,
        )
        self.rate_limited = Counter("harmony_rate_limited", "requests refused with 429", registry=r)

    def _inference_metrics(self, r: CollectorRegistry) -> None:
        self.batch_rows = Histogram(
            "harmony_inference_batch_rows",
            "feature rows per executed micro-batch",
            buckets=BATCH_BUCKETS,
            registry=r,
        )
        self.batches = Counter("harmony_inference_batches", "executed micro-batches", registry=r)
        self.inferred_rows = Counter("harmony_inference_rows", "feature rows inferred", registry=r)
        self.queue_depth = Gauge(
            "harmony_inference_queue_depth",
            "infer requests waiting for a batch",
            registry=r,
            multiprocess_mode="livesum",  # the server's queue: the sum over its live workers
        )
        self.queue_full = Counter(
            "harmony_inference_queue_full", "infer requests refused with 503", registry=r
        )
        self.fallbacks = Counter(
            "harmony_fallback_rows",
            "rows phones fell back on, by tier ('other' = unknown tier)",
            ["tier"],
            registry=r,
        )
        self.fallback_latency = Histogram(
            "harmony_fallback_request_duration_seconds",
            "latency of answered infer requests by the phone's tier, from the request's start to the"
            " last byte handed to the server",
            ["tier"],
            buckets=LATENCY_BUCKETS,
            registry=r,
        )

    def _operator_metrics(self, r: CollectorRegistry) -> None:
        self.uploads = Counter(
            "harmony_uploads",
            "sealed uploads by outcome (accepted, duplicate, rejected)",
            ["outcome"],
            registry=r,
        )
        self.upload_rows = Counter("harmony_upload_rows", "feature rows in accepted uploads", registry=r)
        self.upload_bytes = Counter(
            "harmony_upload_envelope_bytes", "envelope bytes of accepted uploads", registry=r
        )
        self.rounds = Counter(
            "harmony_alignment_rounds", "finished alignment rounds by status", ["status"], registry=r
        )
        self.model_swaps = Counter("harmony_model_swaps", "default back-end version changes", registry=r)

    def count_request(self, route: str, method: str, status: int, seconds: float) -> None:
        key = (route, method, status)
        children = self._request_children.get(key)
        if children is None:
            children = (self.requests.labels(route, method, str(status)), self.latency.labels(route, method))
            self._request_children[key] = children
        children[0].inc()
        children[1].observe(seconds)

    def count_fallback_rows(self, tier: str, rows: int) -> None:
        child = self._fallback_children.get(tier)
        if child is None:
            child = self._fallback_children[tier] = self.fallbacks.labels(tier)
        child.inc(rows)
        answered = _answered_tier.get()
        if answered is not None:  # the middleware times this request and files it under the tier
            answered[0] = tier

    def time_fallback(self, tier: str, seconds: float) -> None:
        child = self._tier_latency_children.get(tier)
        if child is None:
            child = self._tier_latency_children[tier] = self.fallback_latency.labels(tier)
        child.observe(seconds)

    def _view(self) -> CollectorRegistry:
        """What a scrape sees: this process's registry, or a registry over every process's files."""
        if self.multiprocess_dir is None:
            return self.registry
        view = CollectorRegistry()
        MultiProcessCollector(view, path=str(self.multiprocess_dir))
        view.register(self.default_version)
        return view

    def render(self) -> bytes:
        return generate_latest(self._view())

    def snapshot(self) -> MetricSnapshot:
        """Every sample over the whole server (every worker) at once, for the status page."""
        return MetricSnapshot([sample for family in self._view().collect() for sample in family.samples])

    def counter_value(self, counter: Counter, **metric_labels: str) -> float:
        return self.snapshot().counter(counter, **metric_labels)


class MetricSnapshot:
    def __init__(self, samples: list) -> None:
        self.samples = samples

    def value(self, name: str, **metric_labels: str) -> float:
        """The sum of the samples called `name` whose labels include `metric_labels` (0 if none)."""
        return sum(
            s.value
            for s in self.samples
            if s.name == name and all(s.labels.get(k) == v for k, v in metric_labels.items())
        )

    def counter(self, counter: Counter, **metric_labels: str) -> float:
        return self.value(f"{counter._name}_total", **metric_labels)


class MetricsMiddleware:
    """Counts and times every HTTP request, including the ones the body limit refuses."""

    def __init__(self, app: ASGIApp, metrics: ServerMetrics):
        self.app, self.metrics = app, metrics

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        started = time.perf_counter()
        status_code = 500
        disconnected = responded = False

        async def watching_receive() -> Message:
            nonlocal disconnected
            message = await receive()
            if message["type"] == "http.disconnect" and not responded:
                disconnected = True
            return message

        async def send_with_status(message: Message) -> None:
            nonlocal status_code, responded
            if message["type"] == "http.response.start":
                status_code, responded = message["status"], True
            await send(message)

        answered_tier: list[str | None] = [None]
        reset = _answered_tier.set(answered_tier)
        try:
            await self.app(scope, watching_receive, send_with_status)
        except ClientDisconnect:
            # Not a server error: nobody is left to answer, so nothing is logged or re-raised.
            disconnected = True
        finally:
            _answered_tier.reset(reset)
            if disconnected:  # whatever was "answered" after that reached nobody
                status_code = CLIENT_CLOSED
            route = scope.get("route")
            route_name = getattr(route, "path", None) or "unmatched"
            seconds = time.perf_counter() - started
            self.metrics.count_request(route_name, scope["method"], status_code, seconds)
            if answered_tier[0] is not None and status_code == 200:
                self.metrics.time_fallback(answered_tier[0], seconds)
