"""One end-to-end run against a real `harmony serve` (uvicorn) process on a free loopback port."""

from __future__ import annotations

import os
import signal
import subprocess
import sys

import httpx
import numpy as np

from harmony_mobile.protocol.wire import encode_tensor
from tests.helpers.fallback_server import (
    ADMIN,
    ADMIN_TOKEN,
    LABEL_EPOCH,
    bearer,
    class_features,
    make_model_dir,
    sealed_upload,
)
from tests.helpers.ports import free_port
from tests.helpers.processes import stop, wait_until_ready


def test_real_uvicorn_process(tmp_path):
    port = free_port()
    command = [
        sys.executable, "-m", "harmony_mobile.cli", "serve",
        "--host", "127.0.0.1", "--port", str(port),
        "--data-dir", str(tmp_path / "data"), "--model-dir", str(make_model_dir(tmp_path)),
        "--torch-threads", "1", "--log-level", "warning",
    ]  # fmt: skip
    env = {**os.environ, "HARMONY_ADMIN_TOKEN": ADMIN_TOKEN}
    process = subprocess.Popen(command, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    base = f"http://127.0.0.1:{port}"
    try:
        with httpx.Client(base_url=base, timeout=10) as client:
            wait_until_ready(process, f"{base}/v2/health/ready", 60)

            device = client.post("/v1/devices", json={"tier": "entry-android"}, headers=ADMIN).json()
            auth = bearer(device["token"])
            x = class_features(np.array([1, 5, 9]), seed=2)
            binary = client.post(
                "/v2/models/harmony-backend/infer",
                content=encode_tensor(x),
                headers={
                    **auth,
                    "content-type": "application/octet-stream",
                    "X-Harmony-Tier": "entry-android",
                },
            )
            assert binary.status_code == 200, binary.text
            outputs = {o["name"]: o for o in binary.json()["outputs"]}
            assert outputs["slot_scores"]["shape"] == [3, 10] and len(outputs["top_slot"]["data"]) == 3

            body = sealed_upload(device, LABEL_EPOCH, [1, 5, 9], tier="entry-android")
            stored = client.post("/v1/uploads", json=body, headers=auth)
            assert stored.status_code == 201, stored.text
            assert client.post("/v1/uploads", json=body, headers=auth).json()["duplicate"] is True

            too_big = client.post(
                "/v2/models/harmony-backend/infer",
                content=b"\0" * (9 * 1024 * 1024),
                headers={**auth, "content-type": "application/octet-stream"},
            )
            assert too_big.status_code == 413
            assert "harmony_fallback_rows_total" in client.get("/metrics").text
    finally:
        stop(process, timeout=20)
    # uvicorn shuts down gracefully, then re-raises SIGTERM so the exit status says how it ended
    output = process.stdout.read()
    assert process.returncode in (0, -signal.SIGTERM), output
    assert "Traceback" not in output
