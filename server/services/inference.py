"""Dynamic batching with a bounded queue delay (Triton's dynamic batcher): CPU-bound inference runs
on one worker thread, never on the event loop, one batch at a time.

Requests wait on the event loop, in a plain list (no lock: only the loop touches it), each with an
asyncio future. A batch leaves for the worker when it holds `max_batch` rows, or when its oldest
request has waited `max_wait` (the bounded queue delay; 0 = at the loop's next turn), but never
while the worker is still running the previous batch: under load the requests that arrive during
a forward fill the next one, so the batch size grows with the load and rows per second approach
the back-end's batched forward. The worker runs one forward pass per model version in the batch
and hands every result back with one wake-up of the loop.

One hand-off per batch, not per request, is the point: a thread that is woken for every request
competes with the event loop for the GIL on every request, which cost more than batching saved
(docs/DECISIONS.md). More than `queue_size` waiting requests are refused at once (503 + Retry-After) so a phone
keeps its own answer instead of waiting behind a backlog.
"""

from __future__ import annotations

import asyncio
import queue
import threading
import time
from collections import deque
from dataclasses import dataclass, field, replace

import numpy as np
from harmony_mobile.server.core.metrics import ServerMetrics
from harmony_mobile.server.services.registry import ServedVersion, predict


class QueueFull(RuntimeError):
    pass


@dataclass(frozen=True)
class Prediction:
    model_version: str
    slot_scores: np.ndarray  # (N, S) float32, S = slots of the version's slot table
    top_slot: np.ndarray  # (N,) int64
    confidence: np.ndarray  # (N,) float32
    finite: bool = True  # False when g overflowed on a finite input (checked per batch, off the loop)


@dataclass
class VersionStats:
    """Counters of one version in the shape of Triton's statistics extension (times in ns)."""

    last_inference_ms: int = 0
    inference_count: int = 0  # rows
    execution_count: int = 0  # forward passes
    success: list[int] = field(default_factory=lambda: [0, 0])  # [requests, ns enqueue -> result]
    fail: list[int] = field(default_factory=lambda: [0, 0])
    queue: list[int] = field(default_factory=lambda: [0, 0])
    compute_infer: list[int] = field(default_factory=lambda: [0, 0])


@dataclass
class _Job:
    features: np.ndarray
    model: ServedVersion
    future: asyncio.Future
    loop: asyncio.AbstractEventLoop
    enqueued_ns: int = 0

    @property
    def rows(self) -> int:
        return self.features.shape[0]


_STOP = object()


def _resolve(outcomes: list[tuple[asyncio.Future, object, BaseException | None]]) -> None:
    for future, result, error in outcomes:
        if future.done():  # the client went away and the request was cancelled
            continue
        if error is not None:
            future.set_exception(error)
        else:
            future.set_result(result)


class MicroBatcher:
    def __init__(self, max_batch: int, max_wait_ms: float, queue_size: int, metrics: ServerMetrics):
        self.max_batch = max_batch
        self.max_wait = max_wait_ms / 1000.0
        self.queue_size = queue_size
        self.metrics = metrics
        # loop side: touched only by the event loop
        self._waiting: deque[_Job] = deque()
        self._waiting_rows = 0
        self._timer: asyncio.TimerHandle | None = None
        self._busy = False  # a batch is with the worker
        # worker side: at most one batch (and the stop sign) in it
        self._batches: queue.SimpleQueue = queue.SimpleQueue()
        self._thread: threading.Thread | None = None
        self._stats: dict[str, VersionStats] = {}
        self._stats_lock = threading.Lock()

    def stats(self) -> dict[str, VersionStats]:
        """A copy of the per-version counters (the worker keeps updating the originals)."""
        with self._stats_lock:
            return {
                version: replace(
                    s,
                    success=[*s.success],
                    fail=[*s.fail],
                    queue=[*s.queue],
                    compute_infer=[*s.compute_infer],
                )
                for version, s in self._stats.items()
            }

    def waiting(self) -> int:
        """Requests waiting for a batch (not yet with the worker)."""
        return len(self._waiting)

    def start(self) -> None:
        self._thread = threading.Thread(target=self._run, name="harmony-inference", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        if self._thread is not None:
            self._batches.put(_STOP)
            self._thread.join(timeout=10)
            self._thread = None

    async def infer(self, features: np.ndarray, model: ServedVersion) -> Prediction:
        if len(self._waiting) >= self.queue_size:
            self.metrics.queue_full.inc()
            raise QueueFull(f"the inference queue is full ({self.queue_size} requests waiting)")
        loop = asyncio.get_running_loop()
        job = _Job(features, model, loop.create_future(), loop, time.perf_counter_ns())
        self._waiting.append(job)
        self._waiting_rows += job.rows
        # counted up here and down when the job leaves for the worker: a callback gauge would be
        # read in the scraped process only, and with several workers a scrape sums every worker's
        self.metrics.queue_depth.inc()
        self._schedule(loop)
        return await job.future

    # ---------------------------------------------------------------- event loop side

    def _schedule(self, loop: asyncio.AbstractEventLoop) -> None:
        """Send a batch now if one is due, else make sure a timer fires when the oldest waiting
        request's delay runs out. Nothing while the worker is busy: its hand-back calls this."""
        if self._busy or not self._waiting:
            return
        oldest = self._waiting[0].enqueued_ns / 1e9
        due_in = oldest + self.max_wait - time.perf_counter_ns() / 1e9
        if self._waiting_rows >= self.max_batch or due_in <= 0:
            self._dispatch()
        elif self._timer is None:
            self._timer = loop.call_later(due_in, self._on_timer, loop)

    def _on_timer(self, loop: asyncio.AbstractEventLoop) -> None:
        self._timer = None
        self._schedule(loop)

    def _dispatch(self) -> None:
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        batch, rows = [], 0
        while self._waiting and (not batch or rows + self._waiting[0].rows <= self.max_batch):
            job = self._waiting.popleft()
            batch.append(job)
            rows += job.rows
        self._waiting_rows -= rows
        self.metrics.queue_depth.dec(len(batch))
        self._busy = True
        self._batches.put(batch)

    def _finished(self, outcomes: list[tuple[_Job, object, BaseException | None]]) -> None:
        """On the loop: resolve the batch's futures, then send the next batch if one is due."""
        self._busy = False
        _resolve([(job.future, result, error) for job, result, error in outcomes])
        if self._waiting:
            self._schedule(self._waiting[0].loop)

    # ---------------------------------------------------------------- worker thread

    def _run(self) -> None:
        while (batch := self._batches.get()) is not _STOP:
            outcomes: list[tuple[_Job, object, BaseException | None]] = []
            try:
                by_model: dict[int, list[_Job]] = {}
                for job in batch:
                    by_model.setdefault(id(job.model), []).append(job)
                for jobs in by_model.values():
                    outcomes += self._execute(jobs)
            except BaseException as error:  # never leave the loop waiting on a batch
                outcomes = [(job, None, error) for job in batch]
            batch[0].loop.call_soon_threadsafe(self._finished, outcomes)

    def _execute(self, jobs: list[_Job]) -> list[tuple[_Job, object, BaseException | None]]:
        model = jobs[0].model
        started = time.perf_counter_ns()
        try:
            features = np.concatenate([j.features for j in jobs])
            slot_scores, top_slot, confidence = predict(model, features)
        except Exception as error:  # a bug must fail these requests, not kill the worker
            self._count(model.version, jobs, started, failed=True)
            return [(job, None, error) for job in jobs]
        self.metrics.batches.inc()
        self.metrics.batch_rows.observe(features.shape[0])
        self.metrics.inferred_rows.inc(features.shape[0])
        self._count(model.version, jobs, started, failed=False)
        # a list: slicing it per request costs a tenth of a numpy reduction per request
        finite_rows = (np.isfinite(slot_scores).all(axis=1) & np.isfinite(confidence)).tolist()
        outcomes, start = [], 0
        for job in jobs:
            end = start + job.rows
            result = Prediction(
                model.version,
                slot_scores[start:end],
                top_slot[start:end],
                confidence[start:end],
                all(finite_rows[start:end]),
            )
            outcomes.append((job, result, None))
            start = end
        return outcomes

    def _count(self, version: str, jobs: list[_Job], started: int, failed: bool) -> None:
        finished = time.perf_counter_ns()
        with self._stats_lock:
            stats = self._stats.setdefault(version, VersionStats())
            stats.execution_count += 1
            stats.last_inference_ms = time.time_ns() // 1_000_000
            stats.compute_infer[0] += len(jobs)
            stats.compute_infer[1] += finished - started
            outcome = stats.fail if failed else stats.success
            for job in jobs:
                stats.inference_count += 0 if failed else job.rows
                stats.queue[0] += 1
                stats.queue[1] += started - job.enqueued_ns
                outcome[0] += 1
                outcome[1] += finished - job.enqueued_ns
