"""Dynamic micro-batching: CPU-bound inference runs on one worker thread, never on the event loop.

Requests enqueue (features, model) with an asyncio future; the worker takes the first waiting job,
then keeps collecting until it holds `max_batch` rows or `max_wait` has passed since that first job,
runs one forward pass per model version in the batch, and resolves the futures on their loop.
The queue is a thread-safe `queue.Queue` (an asyncio.Queue is not safe to read from another
thread); a full queue refuses at once (503 + Retry-After) so a phone keeps its own answer instead
of waiting behind a backlog.
"""

from __future__ import annotations

import asyncio
import queue
import threading
import time
from dataclasses import dataclass, field, replace

import numpy as np
import torch
from harmony_mobile.server.metrics import ServerMetrics
from harmony_mobile.server.registry import ServedModel, predict


class QueueFull(RuntimeError):
    pass


@dataclass(frozen=True)
class Prediction:
    model_version: str
    slot_scores: np.ndarray  # (N, S) float32, S = slots of the version's slot table
    top_slot: np.ndarray  # (N,) int64
    confidence: np.ndarray  # (N,) float32


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
    model: ServedModel
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


def _hand_back(outcomes: list[tuple[_Job, object, BaseException | None]]) -> None:
    """One wake-up per event loop for a whole batch: each call_soon_threadsafe writes to the loop's
    self-pipe, so one per request would cost a syscall and a loop iteration per row."""
    by_loop: dict[asyncio.AbstractEventLoop, list] = {}
    for job, result, error in outcomes:
        by_loop.setdefault(job.loop, []).append((job.future, result, error))
    for loop, resolved in by_loop.items():
        loop.call_soon_threadsafe(_resolve, resolved)


class MicroBatcher:
    def __init__(self, max_batch: int, max_wait_ms: float, queue_size: int, metrics: ServerMetrics):
        self.max_batch = max_batch
        self.max_wait = max_wait_ms / 1000.0
        self.metrics = metrics
        self._queue: queue.Queue = queue.Queue(maxsize=queue_size)
        self._carry: _Job | None = None  # a job that did not fit the previous batch
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

    def start(self) -> None:
        self._thread = threading.Thread(target=self._run, name="harmony-inference", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        if self._thread is not None:
            self._queue.put(_STOP)  # blocks only until the worker drains a slot
            self._thread.join(timeout=10)
            self._thread = None

    async def infer(self, features: np.ndarray, model: ServedModel) -> Prediction:
        loop = asyncio.get_running_loop()
        job = _Job(features, model, loop.create_future(), loop, time.perf_counter_ns())
        # counted up before the put and down when the worker takes the job (so never below 0): a
        # callback gauge would be read in the scraped process only, and with several workers a
        # scrape must sum every worker's queue
        self.metrics.queue_depth.inc()
        try:
            self._queue.put_nowait(job)
        except queue.Full:
            self.metrics.queue_depth.dec()
            self.metrics.queue_full.inc()
            raise QueueFull(f"the inference queue is full ({self._queue.maxsize} requests waiting)") from None
        return await job.future

    # ---------------------------------------------------------------- worker thread

    def _take(self, timeout: float | None = None) -> object:
        """The next job (or _STOP) off the queue; queue.Empty after `timeout` (0: do not wait)."""
        if timeout is None:
            job = self._queue.get()
        else:
            job = self._queue.get(timeout=timeout) if timeout > 0 else self._queue.get_nowait()
        if job is not _STOP:
            self.metrics.queue_depth.dec()
        return job

    def _next_batch(self) -> list[_Job] | None:
        first = self._carry if self._carry is not None else self._take()
        self._carry = None
        if first is _STOP:
            return None
        batch, rows = [first], first.rows
        deadline = time.monotonic() + self.max_wait
        while rows < self.max_batch:
            remaining = deadline - time.monotonic()
            try:
                job = self._take(max(remaining, 0.0))
            except queue.Empty:
                break
            if job is _STOP or rows + job.rows > self.max_batch:
                self._carry = job
                break
            batch.append(job)
            rows += job.rows
        return batch

    def _run(self) -> None:
        while (batch := self._next_batch()) is not None:
            by_model: dict[int, list[_Job]] = {}
            for job in batch:
                by_model.setdefault(id(job.model), []).append(job)
            for jobs in by_model.values():
                self._execute(jobs)

    def _execute(self, jobs: list[_Job]) -> None:
        model = jobs[0].model
        started = time.perf_counter_ns()
        try:
            features = torch.from_numpy(np.concatenate([j.features for j in jobs]))
            slot_scores, top_slot, confidence = (t.numpy() for t in predict(model, features))
        except Exception as error:  # a bug must fail these requests, not kill the worker
            self._count(model.version, jobs, started, failed=True)
            _hand_back([(job, None, error) for job in jobs])
            return
        self.metrics.batches.inc()
        self.metrics.batch_rows.observe(features.shape[0])
        self.metrics.inferred_rows.inc(features.shape[0])
        self._count(model.version, jobs, started, failed=False)
        outcomes, start = [], 0
        for job in jobs:
            end = start + job.rows
            result = Prediction(
                model.version, slot_scores[start:end], top_slot[start:end], confidence[start:end]
            )
            outcomes.append((job, result, None))
            start = end
        _hand_back(outcomes)

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
