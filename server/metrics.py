"""Prometheus metrics on a per-app CollectorRegistry (tests build many apps in one process), and the
ASGI middleware that times every request by route template (not raw path: bounded cardinality)."""

from __future__ import annotations

import time
from collections.abc import Callable

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest
from starlette.requests import ClientDisconnect
from starlette.types import ASGIApp, Message, Receive, Scope, Send

# nginx's code for "client closed the request": the client left before any answer was sent.
CLIENT_CLOSED = 499
LATENCY_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0)
BATCH_BUCKETS = (1, 2, 4, 8, 16, 32, 64, 128)


class ServerMetrics:
    def __init__(self) -> None:
        self.registry = CollectorRegistry(auto_describe=True)
        r = self.registry
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
        self.batch_rows = Histogram(
            "harmony_inference_batch_rows",
            "feature rows per executed micro-batch",
            buckets=BATCH_BUCKETS,
            registry=r,
        )
        self.batches = Counter("harmony_inference_batches", "executed micro-batches", registry=r)
        self.inferred_rows = Counter("harmony_inference_rows", "feature rows inferred", registry=r)
        self.queue_depth = Gauge(
            "harmony_inference_queue_depth", "infer requests waiting for a batch", registry=r
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
        self.rate_limited = Counter("harmony_rate_limited", "requests refused with 429", registry=r)
        self.rounds = Counter(
            "harmony_alignment_rounds", "finished alignment rounds by status", ["status"], registry=r
        )
        self.model_swaps = Counter("harmony_model_swaps", "default back-end version changes", registry=r)
        # labelled children by label values: prometheus_client's labels() validates and locks on each
        # call, a per-request cost the counts do not need (the key sets are bounded like the labels)
        self._request_children: dict[tuple[str, str, int], tuple] = {}
        self._fallback_children: dict[str, object] = {}

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

    def watch_queue(self, depth: Callable[[], int]) -> None:
        self.queue_depth.set_function(depth)

    def render(self) -> bytes:
        return generate_latest(self.registry)

    def counter_value(self, counter: Counter, **metric_labels: str) -> float:
        """Current value of a counter (for the status page)."""
        metric = counter.labels(**metric_labels) if metric_labels else counter
        return metric._value.get()


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

        try:
            await self.app(scope, watching_receive, send_with_status)
        except ClientDisconnect:
            # Not a server error: nobody is left to answer, so nothing is logged or re-raised.
            disconnected = True
        finally:
            if disconnected:  # whatever was "answered" after that reached nobody
                status_code = CLIENT_CLOSED
            route = scope.get("route")
            route_name = getattr(route, "path", None) or "unmatched"
            method = scope["method"]
            self.metrics.count_request(route_name, method, status_code, time.perf_counter() - started)
