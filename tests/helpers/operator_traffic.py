"""Traffic for the operator-view tests (Prometheus, the status page in Chromium): phones of every
tier inferring, uploads and a published alignment round against a running `harmony serve`."""

from __future__ import annotations

import time
from collections.abc import Callable

import httpx
import numpy as np

from harmony_mobile.protocol.wire import encode_tensor
from tests.helpers.fallback_server import (
    ADMIN,
    LABEL_EPOCH,
    bearer,
    class_features,
    json_infer_body,
    sealed_upload,
)

INFER = "/v2/models/harmony-backend/infer"
ROUND = {"steps": 12, "batch_size": 32}


def wait_for(check, what: str, timeout: float = 60) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            if check():
                return
        except httpx.TransportError:
            pass
        time.sleep(0.5)
    raise AssertionError(f"timed out waiting for {what}")


def phone_traffic(base: str, tokens: dict[str, str], keep_going: Callable[[], bool]) -> None:
    """Phones of every tier (tier -> device token) infer, binary with the tier header and JSON with
    the tier parameter, while `keep_going()`."""
    tiers = sorted(tokens)
    with httpx.Client(base_url=base, timeout=30) as client:
        i = 0
        while keep_going():
            tier = tiers[i % len(tiers)]
            auth = bearer(tokens[tier])
            rows = class_features(np.array([i % 10]), seed=i)
            binary = {**auth, "Content-Type": "application/octet-stream", "X-Harmony-Tier": tier}
            answer = client.post(INFER, content=encode_tensor(rows), headers=binary)
            assert answer.status_code == 200, answer.text
            answer = client.post(INFER, json=json_infer_body(rows, parameters={"tier": tier}), headers=auth)
            assert answer.status_code == 200, answer.text
            i += 1
            time.sleep(0.05)


def store_uploads(client: httpx.Client, device: dict, count: int = 4, rows: int = 30) -> None:
    for i in range(count):
        classes = (np.arange(rows) + i) % 10
        # the one split depth a mid-android front-end extracts
        body = sealed_upload(device, LABEL_EPOCH, classes, seed=i, split_depths=(2,) * rows)
        stored = client.post("/v1/uploads", json=body, headers=bearer(device["token"]))
        assert stored.status_code == 201, stored.text


def publish_a_round(client: httpx.Client) -> None:
    started = client.post("/v1/alignment/rounds", json=ROUND, headers=ADMIN)
    assert started.status_code == 202, started.text
    url = f"/v1/alignment/rounds/{started.json()['id']}"
    wait_for(lambda: client.get(url, headers=ADMIN).json()["status"] not in ("queued", "running"), "round")
    assert client.get(url, headers=ADMIN).json()["status"] == "published"
