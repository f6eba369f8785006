"""Alignment rounds across processes: the queue, the leases and the worker thread of each process.

Every process sweeps expired leases (a round whose process died is marked interrupted), also one
that runs no round itself; training a round is server/services/alignment.py, imported only when a round runs,
so a serving replica without torch keeps this module's part.
"""

from __future__ import annotations

import logging
import os
import secrets
import socket
import threading
from concurrent.futures import ThreadPoolExecutor

from harmony_mobile.server.core.errors import FailureRun, first_line
from harmony_mobile.server.core.metrics import ServerMetrics
from harmony_mobile.server.core.schemas import AlignmentParams
from harmony_mobile.server.services.registry import ModelRegistry
from harmony_mobile.server.services.round_outcomes import NotEnoughRows, RoundCancelled
from harmony_mobile.server.services.store import Store
from sqlalchemy.exc import OperationalError

log = logging.getLogger("harmony_mobile.server.alignment")


def process_identity() -> str:
    """host:pid:random: unique per process, also for a restarted container that gets the same pid."""
    return f"{socket.gethostname()}:{os.getpid()}:{secrets.token_hex(4)}"


class AlignmentWorker:
    """Runs this process's rounds one at a time on a background thread (training is CPU-bound), and
    keeps their leases alive on a heartbeat thread (docs/PROTOCOL.md, "Rounds across processes").

    Every `lease_seconds / 3` the heartbeat renews the leases of this process's unfinished rounds and
    marks interrupted any round (of any process) whose lease expired. So a process starting beside a
    live one leaves that one's round alone, and a round whose process died is marked interrupted
    within about one lease. A round that lost its lease (this process froze past it) stops at its
    next step and is not published. Across processes at most one round runs at a time: a round
    stays queued while another one holds a live lease."""

    def __init__(
        self, store: Store, registry: ModelRegistry, server_key, metrics: ServerMetrics, lease_seconds: float
    ):
        self.store, self.registry, self.server_key, self.metrics = store, registry, server_key, metrics
        self.lease_seconds = lease_seconds
        self.owner = process_identity()
        self._executor = ThreadPoolExecutor(max_workers=1, thread_name_prefix="harmony-alignment")
        self._stopping = threading.Event()
        self._heartbeat: threading.Thread | None = None
        self._submitted: set[int] = set()
        self._lost: set[int] = set()  # rounds whose lease a renewal found gone (marked interrupted)

    @property
    def heartbeat_seconds(self) -> float:
        return self.lease_seconds / 3

    def start(self) -> None:
        """Sweep expired leases once (rounds of a process that died), then keep beating."""
        self.beat()
        self._heartbeat = threading.Thread(target=self._beat_until_stopped, name="harmony-lease", daemon=True)
        self._heartbeat.start()

    def beat(self) -> None:
        submitted = set(self._submitted)  # before renewing: a round created later is not judged yet
        renewed = self.store.renew_round_leases(self.owner, self.lease_seconds)
        self._lost |= submitted - renewed  # (a round that finished here is in it too: harmless)
        interrupted = self.store.interrupt_expired_rounds()
        if interrupted:
            log.warning(
                "marked %d alignment round(s) interrupted: their process stopped renewing its lease",
                interrupted,
            )

    def _beat_until_stopped(self) -> None:
        failures = FailureRun(log, "renewing alignment round leases")
        while not self._stopping.wait(self.heartbeat_seconds):
            try:
                self.beat()
            except Exception as error:  # a store outage must not end the heartbeat; the next one retries
                failures.failed(error)
            else:
                failures.succeeded()

    def submit(self, params: AlignmentParams) -> int:
        round_id = self.store.create_round(params.model_dump(), self.owner, self.lease_seconds)
        self._submitted.add(round_id)
        self._executor.submit(self._run, round_id, params)
        return round_id

    def stop(self) -> None:
        """Cancel queued rounds and ask a running one to stop at its next step (it ends `interrupted`)."""
        self._stopping.set()
        self._executor.shutdown(wait=True, cancel_futures=True)
        if self._heartbeat is not None:
            self._heartbeat.join()
        # Only this process's rounds: another process's running round is none of its business.
        try:
            self.store.interrupt_rounds_of(self.owner)
        except OperationalError as error:  # a stop must not fail because the database is down
            log.warning(
                "store unreachable: this process's unfinished rounds stay as they are until their"
                " leases expire and another process marks them interrupted (%s)",
                first_line(error.orig or error),
            )

    def _cancelled(self, round_id: int) -> bool:
        return self._stopping.is_set() or round_id in self._lost

    def _wait_for_start(self, round_id: int) -> bool:
        """Start the round once no other process's round is running; False if it was interrupted or
        this process is stopping first."""
        while not self.store.start_round(round_id):
            record = self.store.round(round_id)
            if record is None or record.status != "queued":
                return False
            if self._stopping.wait(min(1.0, self.heartbeat_seconds)):
                return False
        return True

    def _run(self, round_id: int, params: AlignmentParams) -> None:
        if not self._wait_for_start(round_id):
            return
        try:
            # imported here: it imports torch, which a replica that runs no round may not have
            from harmony_mobile.server.services.alignment import align_and_publish

            align_and_publish(self, round_id, params)
        except RoundCancelled:  # stopping (a lost lease already made the round interrupted)
            self._finish(round_id, "interrupted", {}, error="the server stopped during this round")
        except NotEnoughRows as error:
            log.warning("alignment round %d failed: %s", round_id, error)
            self._finish(round_id, "failed", {}, error=f"{type(error).__name__}: {error}")
        except Exception as error:  # the message names the step, never feature values or tokens
            # Finishing matters: a round left running under a live lease would hold back every other.
            log.exception("alignment round %d failed", round_id)
            self._finish(round_id, "failed", {}, error=f"{type(error).__name__}: {error}")

    def _trained_through(self, version: str) -> int:
        """Newest upload id the round that published `version` trained on (0 for an imported version:
        after a new export every stored row is new to the back-end)."""
        record = self.store.version(version)
        if record is None or record.source != "alignment":
            return 0
        return int(record.metrics.get("trained_through_upload_id", 0))

    def _finish(self, round_id: int, status: str, metrics: dict, new_version=None, error=None) -> None:
        if self.store.finish_round(round_id, status, metrics, new_version, error):
            self.metrics.rounds.labels(status).inc()
