"""`harmony serve --workers 2` as real processes on one port: both workers answer, the flags given on
the command line are in force in each of them (not the environment's values), and SIGTERM stops
every process with each acknowledged upload in the store. Which worker answered is read from the
OS (the process holding the server end of the connection), not from anything the server says."""

from __future__ import annotations

import signal
import time

import httpx
import numpy as np
from harmony_mobile.server.services.store import Store

from tests.helpers.fallback_server import (
    ADMIN,
    LABEL_EPOCH,
    bearer,
    class_features,
    enrol,
    json_infer_body,
    make_model_dir,
    sealed_upload,
)
from tests.server_process import RunningServer, answering_pid, is_running, serve_process, worker_pids

MAX_WAIT_MS = 300  # a lone row waits this long for its micro-batch to fill: visible in the latency
NEW_CONNECTIONS_AT_MOST = 60  # new connections, by which both workers must have answered one
# what the flags below must override in every worker
ENVIRONMENT = {
    "HARMONY_ADMIN_TOKEN": "token-from-the-environment-the-flag-overrides",
    "HARMONY_MAX_BATCH": "64",
    "HARMONY_MAX_WAIT_MS": "0",
    "HARMONY_RUN_ALIGNMENT": "true",
}


def one_connection(
    client: httpx.Client, server: RunningServer, workers: set[int]
) -> tuple[int, tuple[str, str]]:
    """Enrol, upload, infer and check the flags over one kept-alive connection; returns the worker
    that served it and the (device, message id) of the acknowledged upload."""
    device = enrol(client)  # the admin token given by --admin-token, not the environment's
    environment_admin = bearer(ENVIRONMENT["HARMONY_ADMIN_TOKEN"])
    refused_admin = client.post("/v1/devices", json={"tier": "mid-android"}, headers=environment_admin)
    assert refused_admin.status_code == 401
    pid = answering_pid(server, client.get("/v2/health/ready"), workers)
    auth = bearer(device["token"])
    body = sealed_upload(device, LABEL_EPOCH, [1, 5, 9])
    stored = client.post("/v1/uploads", json=body, headers=auth)
    assert stored.status_code == 201, stored.text

    started = time.monotonic()
    row = json_infer_body(class_features(np.array([3]), seed=0))
    answer = client.post("/v2/models/harmony-backend/infer", json=row, headers=auth)
    waited = time.monotonic() - started
    assert answer.status_code == 200 and answer.json()["outputs"], answer.text
    assert waited >= MAX_WAIT_MS / 1000, f"answered in {waited:.3f} s: --max-wait-ms not in force"

    batching = client.get("/v2/models/harmony-backend/config", headers=auth).json()["dynamic_batching"]
    assert batching["preferred_batch_size"] == [3]
    assert batching["max_queue_delay_microseconds"] == MAX_WAIT_MS * 1000
    refused = client.post("/v1/alignment/rounds", json={}, headers=ADMIN)  # --no-alignment
    assert refused.status_code == 409 and "does not run alignment rounds" in refused.json()["detail"]
    assert answering_pid(server, refused, workers) == pid  # all of it over the one connection
    return pid, (device["device_id"], body["message_id"])


def test_two_worker_processes_share_the_port_the_flags_and_the_store(tmp_path, database_url):
    flags = ["--workers", "2", "--admin-token", ADMIN["Authorization"].removeprefix("Bearer ")]
    flags += ["--max-batch", "3", "--max-wait-ms", str(MAX_WAIT_MS), "--no-alignment"]
    flags += ["--log-level", "info"]  # (the last --log-level wins) to see each worker's shutdown
    flags += ["--database-url", database_url] if database_url else []
    data_dir = tmp_path / "data"
    answered_by, acknowledged = set(), []
    with serve_process(data_dir, make_model_dir(tmp_path), *flags, env=ENVIRONMENT) as server:
        workers = worker_pids(server)
        assert len(workers) == 2, workers
        for _ in range(NEW_CONNECTIONS_AT_MOST):
            with httpx.Client(base_url=server.base, timeout=30) as client:  # a new connection
                pid, upload = one_connection(client, server, workers)
            answered_by.add(pid)
            acknowledged.append(upload)
            if answered_by == workers:
                break
        assert answered_by == workers, f"only {answered_by} of {workers} answered"
        registry = httpx.get(f"{server.base}/v1/registry/versions", headers=ADMIN).json()
        assert [v["version"] for v in registry["versions"]] == ["v1"]  # imported once, by one worker

    assert server.process.returncode in (0, -signal.SIGTERM)
    assert not any(is_running(pid) for pid in workers)
    for pid in workers:  # each worker ran its shutdown (lifespan: batcher, rounds, store closed)
        assert f"Finished server process [{pid}]" in server.output, server.output
    assert server.output.count("Application shutdown complete") == len(workers), server.output
    store = Store(data_dir, database_url)
    try:
        for device_id, message_id in acknowledged:
            assert store.find_upload(device_id, message_id) is not None
        assert store.upload_stats()["uploads"] == len(acknowledged)
    finally:
        store.close()
