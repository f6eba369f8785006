"""The dynamic batcher (server/services/inference.py): a batch leaves when it holds max_batch rows or when
its oldest request has waited max_wait_ms, never while the worker runs the previous one; requests
that arrive during a forward pass leave together in the next. The model configuration reports
the batcher's settings as Triton's dynamic_batching block."""

from __future__ import annotations

import asyncio
import threading
import time

import httpx
import numpy as np
import pytest
from fastapi.testclient import TestClient
from harmony_mobile.server import create_app

from harmony_mobile.protocol.wire import encode_tensor
from tests.helpers.fallback_server import ADMIN, ADMIN_TOKEN, class_features, make_model_dir, make_settings

INFER = "/v2/models/harmony-backend/infer"
HEADERS = {"Authorization": f"Bearer {ADMIN_TOKEN}", "content-type": "application/octet-stream"}


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
    return make_model_dir(tmp_path_factory.mktemp("batching"))


def run_requests(app, count: int, during=None) -> tuple[list[httpx.Response], float]:
    """`count` concurrent 1-row infer requests (and `during(client)` alongside); their responses (then
    what `during` returned) and the seconds until the last answer."""
    state = app.state.harmony

    async def scenario():
        state.batcher.start()
        transport = httpx.ASGITransport(app=app)
        async with httpx.AsyncClient(transport=transport, base_url="http://test", timeout=30) as client:
            bodies = [encode_tensor(class_features(np.array([i % 10]), seed=i)) for i in range(count)]
            started = time.monotonic()
            requests = [client.post(INFER, content=body, headers=HEADERS) for body in bodies]
            extra = [during(client)] if during else []
            responses = await asyncio.gather(*requests, *extra)
            return responses, time.monotonic() - started

    try:
        return asyncio.run(scenario())
    finally:
        state.batcher.stop()
        state.store.close()


def test_a_full_batch_leaves_without_waiting_for_the_delay(tmp_path, model_dir):
    app = create_app(make_settings(tmp_path, model_dir, max_batch=4, max_wait_ms=20_000))
    responses, seconds = run_requests(app, 4)
    assert all(r.status_code == 200 for r in responses)
    metrics = app.state.harmony.metrics
    assert metrics.counter_value(metrics.batches) == 1 and seconds < 10


def test_the_queue_delay_bounds_a_lone_requests_wait(tmp_path, model_dir):
    app = create_app(make_settings(tmp_path, model_dir, max_batch=64, max_wait_ms=300))
    [response], seconds = run_requests(app, 1)
    assert response.status_code == 200 and 0.3 <= seconds < 10


def test_requests_arriving_during_a_forward_leave_together_in_the_next_batch(tmp_path, model_dir):
    app = create_app(make_settings(tmp_path, model_dir, max_batch=64, max_wait_ms=0))
    batcher = app.state.harmony.batcher
    release, first_running = threading.Event(), threading.Event()
    execute, sizes = batcher._execute, []

    def held_execute(jobs):
        sizes.append(sum(job.rows for job in jobs))
        first_running.set()
        release.wait(10)  # the first batch holds the worker until ten more requests wait
        return execute(jobs)

    batcher._execute = held_execute

    async def ten_more(client):
        while not first_running.is_set():
            await asyncio.sleep(0.01)
        bodies = [encode_tensor(class_features(np.array([i]), seed=i)) for i in range(10)]
        more = [asyncio.create_task(client.post(INFER, content=b, headers=HEADERS)) for b in bodies]
        while batcher.waiting() < 10:
            await asyncio.sleep(0.01)
        release.set()
        return await asyncio.gather(*more)

    try:
        [first, more], _ = run_requests(app, 1, during=ten_more)
    finally:
        release.set()
    assert first.status_code == 200 and all(r.status_code == 200 for r in more)
    assert sizes == [1, 10]


def test_the_model_configuration_reports_the_batcher(tmp_path, model_dir):
    settings = make_settings(tmp_path, model_dir, max_batch=48, max_wait_ms=1.5, queue_size=99)
    with TestClient(create_app(settings)) as client:
        config = client.get("/v2/models/harmony-backend/config", headers=ADMIN).json()
    assert config["dynamic_batching"] == {
        "max_queue_delay_microseconds": 1500,
        "preferred_batch_size": [48],
        "default_queue_policy": {"max_queue_size": 99},
    }
