"""Background loops through a store outage: the default-version follower (server/app.py) and the
alignment lease heartbeat (server/services/alignment.py). While the database is unreachable a process logs
one warning line when the outage starts and one info line when the store answers again, never a
traceback per attempt; an unexpected error keeps its traceback, once per run of it. The store and
registry are stand-ins that fail on cue; the last test stops a real PostgreSQL under a running
server."""

from __future__ import annotations

import asyncio
import logging
import signal
import threading
import time
from contextlib import ExitStack
from types import SimpleNamespace

import pytest
from harmony_mobile.server.app import _follow_default_version
from harmony_mobile.server.services.rounds import AlignmentWorker
from sqlalchemy.exc import OperationalError

from tests.helpers.fallback_server import make_model_dir
from tests.postgres import create_database, running_postgres
from tests.server_process import serve_process

LOGGER = "harmony_mobile.server"
POLL_SECONDS = 0.005
# what psycopg says when PostgreSQL is down: two lines, the second tab-indented
REFUSED = (
    'connection failed: connection to server at "127.0.0.1", port 5432 failed: Connection refused\n'
    "\tIs the server running on that host and accepting TCP/IP connections?"
)


class FlakyStore:
    """`default_version` raises the errors in `failures` one per poll, then answers `version`."""

    def __init__(self, failures: list[Exception], version: str = "v1"):
        self.failures, self.version, self.polls = list(failures), version, 0

    def default_version(self) -> str:
        self.polls += 1
        if self.failures:
            raise self.failures.pop(0)
        return self.version


class Registry:
    def __init__(self, store: FlakyStore):
        self.store, self.current = store, SimpleNamespace(version="v1")

    def default(self) -> SimpleNamespace:
        return self.current

    def load_default(self) -> None:
        self.current = SimpleNamespace(version=self.store.default_version())


def store_down() -> OperationalError:
    return OperationalError("SELECT value FROM settings", {}, Exception(REFUSED))


async def follow_for(store: FlakyStore, polls: int) -> None:
    state = SimpleNamespace(
        settings=SimpleNamespace(default_refresh_seconds=POLL_SECONDS), registry=Registry(store), store=store
    )
    follower = asyncio.create_task(_follow_default_version(state))
    while store.polls < polls:
        await asyncio.sleep(POLL_SECONDS)
    follower.cancel()
    with pytest.raises(asyncio.CancelledError):
        await follower


def records(caplog, level: int, logger: str = LOGGER) -> list[logging.LogRecord]:
    return [r for r in caplog.records if r.name == logger and r.levelno == level]


def test_an_outage_is_one_warning_line_and_the_recovery_one_info_line(caplog):
    caplog.set_level(logging.INFO, logger=LOGGER)
    store = FlakyStore([store_down() for _ in range(20)], version="v2")
    asyncio.run(follow_for(store, polls=25))
    [warning] = records(caplog, logging.WARNING)
    assert warning.exc_info is None and "\n" not in warning.getMessage()
    assert "store unreachable" in warning.getMessage() and "Connection refused" in warning.getMessage()
    assert "Traceback" not in caplog.text
    infos = [r.getMessage() for r in records(caplog, logging.INFO)]
    assert any("store reachable again" in m for m in infos), infos
    assert any("now serving v2 by default" in m for m in infos), infos  # and it follows again


def test_an_unexpected_error_keeps_one_traceback_per_streak(caplog):
    caplog.set_level(logging.INFO, logger=LOGGER)
    failures = [RuntimeError("bug") for _ in range(5)] + [store_down() for _ in range(5)]
    asyncio.run(follow_for(FlakyStore(failures), polls=15))
    warnings = records(caplog, logging.WARNING)
    assert len(warnings) == 2, [w.getMessage() for w in warnings]
    assert warnings[0].exc_info is not None and caplog.text.count("Traceback") == 1
    assert warnings[1].exc_info is None and "store unreachable" in warnings[1].getMessage()


class FlakyLeaseStore:
    """`renew_round_leases` raises the errors in `failures` one per beat, then renews nothing."""

    def __init__(self, failures: list[Exception]):
        self.failures, self.beats = list(failures), 0

    def renew_round_leases(self, owner: str, lease_seconds: float) -> set[int]:
        self.beats += 1
        if self.failures:
            raise self.failures.pop(0)
        return set()

    def interrupt_expired_rounds(self) -> int:
        return 0

    def interrupt_rounds_of(self, owner: str) -> int:
        return 0


def test_the_lease_heartbeat_logs_an_outage_once(caplog):
    logger = "harmony_mobile.server.alignment"
    caplog.set_level(logging.INFO, logger=logger)
    store = FlakyLeaseStore([store_down() for _ in range(10)])
    worker = AlignmentWorker(store, None, None, None, lease_seconds=3 * POLL_SECONDS)
    heartbeat = threading.Thread(target=worker._beat_until_stopped)
    heartbeat.start()
    deadline = time.monotonic() + 10
    while store.beats < 14 and time.monotonic() < deadline:
        time.sleep(POLL_SECONDS)
    worker.stop()
    heartbeat.join(timeout=5)
    [warning] = records(caplog, logging.WARNING, logger)
    assert warning.exc_info is None and "store unreachable" in warning.getMessage()
    assert "Traceback" not in caplog.text
    [recovered] = records(caplog, logging.INFO, logger)
    assert "store reachable again" in recovered.getMessage()


def test_a_server_logs_a_postgresql_outage_once_per_loop_and_stops_cleanly(tmp_path):
    # its own PostgreSQL (not the session's): this test stops it
    database = ExitStack()
    url = create_database(database.enter_context(running_postgres()))
    fast = {"HARMONY_DEFAULT_REFRESH_SECONDS": "0.2", "HARMONY_ROUND_LEASE_SECONDS": "0.6"}
    try:
        with serve_process(
            tmp_path / "data", make_model_dir(tmp_path), "--database-url", url, env=fast
        ) as server:
            database.close()
            time.sleep(3)  # some 15 polls of the follower and 15 lease heartbeats
    finally:
        database.close()
    # serve_process has checked that the output holds no traceback
    assert server.process.returncode in (0, -signal.SIGTERM), server.output
    assert "shutdown failed" not in server.output, server.output
    # one line each: the follower, the heartbeat, the stop (which cannot mark its rounds)
    assert server.output.count("store unreachable") == 3, server.output
