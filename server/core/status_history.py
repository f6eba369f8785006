"""The status page's memory of the fallback traffic: every `status_sample_seconds` each process
samples the whole server's counters (with several workers: the sum over all of them, see
server/core/metrics.py) and keeps the last hour or so; the plots are the differences between samples.

Kept in memory, per process: a restart (or a worker uvicorn replaced) starts an empty history, and
a worker that started later has a shorter one. The long view is Prometheus (deploy/)."""

from __future__ import annotations

import math
import time
from collections import deque
from dataclasses import dataclass
from typing import TYPE_CHECKING

if TYPE_CHECKING:  # metrics.py keeps the history: no import at run time
    from harmony_mobile.server.core.metrics import MetricSnapshot

FALLBACK_ROWS = "harmony_fallback_rows_total"
LATENCY_BUCKETS = "harmony_fallback_request_duration_seconds_bucket"


@dataclass(frozen=True)
class Sample:
    at: float  # seconds since the epoch
    rows: dict[str, float]  # tier -> fallback rows so far
    buckets: dict[str, dict[float, float]]  # tier -> upper bound -> answered requests so far (cumulative)


@dataclass(frozen=True)
class Interval:
    """What happened between two samples."""

    end: float
    seconds: float
    rows_per_second: dict[str, float]  # tier -> rows/s
    share: dict[str, float]  # tier -> share of the interval's fallback rows (empty: no rows)
    p50: dict[str, float]  # tier -> seconds, for tiers with answered requests in the interval
    p99: dict[str, float]


def quantile(q: float, buckets: dict[float, float]) -> float | None:
    """The q-quantile of a cumulative histogram (upper bound -> count), interpolated linearly
    inside its bucket as Prometheus' histogram_quantile does; None without observations."""
    bounds = sorted(buckets)
    total = buckets[bounds[-1]] if bounds else 0.0
    if total <= 0:
        return None
    rank, lower, below = q * total, 0.0, 0.0
    for bound in bounds:
        count = buckets[bound]
        if count >= rank:
            if math.isinf(bound):  # above the last finite bucket: its bound is the best estimate
                return lower
            return lower + (bound - lower) * (rank - below) / max(count - below, 1e-12)
        lower, below = bound, count
    return lower


def sample_of(snapshot: MetricSnapshot, at: float | None = None) -> Sample:
    rows: dict[str, float] = {}
    buckets: dict[str, dict[float, float]] = {}
    for s in snapshot.samples:
        if s.name == FALLBACK_ROWS:
            rows[s.labels["tier"]] = rows.get(s.labels["tier"], 0.0) + s.value
        elif s.name == LATENCY_BUCKETS:
            tier = buckets.setdefault(s.labels["tier"], {})
            bound = float(s.labels["le"])
            tier[bound] = tier.get(bound, 0.0) + s.value
    return Sample(time.time() if at is None else at, rows, buckets)


def interval(before: Sample, after: Sample) -> Interval:
    seconds = max(after.at - before.at, 1e-9)
    delta = {tier: after.rows[tier] - before.rows.get(tier, 0.0) for tier in after.rows}
    total = sum(delta.values())
    p50, p99 = {}, {}
    for tier, bounds in after.buckets.items():
        previous = before.buckets.get(tier, {})
        window = {bound: count - previous.get(bound, 0.0) for bound, count in bounds.items()}
        for target, q in ((p50, 0.5), (p99, 0.99)):
            value = quantile(q, window)
            if value is not None:
                target[tier] = value
    return Interval(
        end=after.at,
        seconds=seconds,
        rows_per_second={tier: d / seconds for tier, d in delta.items()},
        share={tier: d / total for tier, d in delta.items()} if total > 0 else {},
        p50=p50,
        p99=p99,
    )


class MetricHistory:
    def __init__(self, keep: int = 360) -> None:
        self.samples: deque[Sample] = deque(maxlen=keep + 1)
        self.plots: tuple[float, str] | None = None  # (drawn at, HTML): the page redraws at most this often

    def add(self, sample: Sample) -> None:
        self.samples.append(sample)

    def intervals(self) -> list[Interval]:
        samples = list(self.samples)
        return [interval(a, b) for a, b in zip(samples, samples[1:], strict=False)]
