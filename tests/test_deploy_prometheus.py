"""deploy/: a real Prometheus, configured from deploy/prometheus.yml, scrapes a running
`harmony serve --workers 2` while phones infer, upload and an alignment round publishes; every
query of the Grafana dashboard (deploy/grafana/harmony-dashboard.json) must then return at least
one series with a number in it. A panel whose metric the server does not export, or whose label
does not exist, comes back empty and fails the test.

Needs Debian's `prometheus` binary: outside CI a machine without it skips (with the reason); in CI
(`CI` set, as .ci/run does, which installs it) a missing binary fails."""

from __future__ import annotations

import json
import math
import os
import shutil
import subprocess
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import httpx
import numpy as np
import pytest
import yaml

from harmony_mobile.protocol.wire import encode_tensor
from tests.helpers.fallback_server import (
    ADMIN,
    LABEL_EPOCH,
    TIER_FAMILIES,
    bearer,
    class_features,
    enrol,
    json_infer_body,
    make_model_dir,
    sealed_upload,
)
from tests.server_process import free_port, serve_process

ROOT = Path(__file__).resolve().parents[1]
DASHBOARD = ROOT / "deploy" / "grafana" / "harmony-dashboard.json"
SCRAPE_CONFIG = ROOT / "deploy" / "prometheus.yml"
INFER = "/v2/models/harmony-backend/infer"
# what Grafana puts in place of the dashboard's variables: all instances, a window of many scrapes
VARIABLES = {"$__rate_interval": "30s", "$instance": ".*"}
ROUND = {"steps": 12, "batch_size": 32}


def prometheus_binary() -> str:
    binary = shutil.which("prometheus")
    if binary is None:
        reason = "no prometheus binary (apt-get install prometheus)"
        if os.environ.get("CI"):
            pytest.fail(f"{reason} (required in CI)")
        pytest.skip(reason)
    return binary


def dashboard_queries() -> list[tuple[str, str]]:
    """(panel title, PromQL) of every target of every panel, the variables filled in."""
    queries = []
    for panel in json.loads(DASHBOARD.read_text())["panels"]:
        for target in panel.get("targets", []):
            expr = target["expr"]
            for name, value in VARIABLES.items():
                expr = expr.replace(name, value)
            queries.append((panel["title"], expr))
    return queries


@contextmanager
def prometheus(tmp_path: Path, target: str) -> Iterator[str]:
    """Prometheus scraping `target` every second, with deploy/prometheus.yml's job; yields its URL."""
    config = yaml.safe_load(SCRAPE_CONFIG.read_text())
    config["global"]["scrape_interval"] = "1s"
    [job] = config["scrape_configs"]
    job["static_configs"] = [{"targets": [target]}]
    config_file = tmp_path / "prometheus.yml"
    config_file.write_text(yaml.safe_dump(config))
    address = f"127.0.0.1:{free_port()}"
    command = [
        prometheus_binary(), f"--config.file={config_file}", f"--storage.tsdb.path={tmp_path / 'tsdb'}",
        f"--web.listen-address={address}", "--log.level=warn",
    ]  # fmt: skip
    process = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    try:
        wait_for(lambda: httpx.get(f"http://{address}/-/ready").status_code == 200, "Prometheus ready")
        yield f"http://{address}"
    finally:
        process.terminate()
        process.wait(timeout=30)


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


def query(prometheus_url: str, expr: str) -> list[dict]:
    answer = httpx.get(f"{prometheus_url}/api/v1/query", params={"query": expr}, timeout=10).json()
    assert answer["status"] == "success", (expr, answer)
    return answer["data"]["result"]


def phone_traffic(base: str, tokens: dict[str, str], stop: threading.Event) -> None:
    """Phones of every tier infer (binary with the tier header, JSON with the tier parameter) until
    `stop`."""
    tiers = sorted(tokens)
    with httpx.Client(base_url=base, timeout=30) as client:
        i = 0
        while not stop.is_set():
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


def test_every_dashboard_query_returns_series_from_a_real_prometheus(tmp_path):
    prometheus_binary()
    model_dir = make_model_dir(tmp_path, fit_steps=20)  # confident, so a round can publish
    with serve_process(tmp_path / "data", model_dir, "--workers", "2", "--max-wait-ms", "1") as server:
        with prometheus(tmp_path, f"127.0.0.1:{server.port}") as prometheus_url:
            up = 'up{job="harmony"} == 1'
            wait_for(lambda: len(query(prometheus_url, up)) == 1, "the first scrape")
            with httpx.Client(base_url=server.base, timeout=30) as client:
                tokens = {tier: enrol(client, tier=tier)["token"] for tier in TIER_FAMILIES}
                device = enrol(client, tier="mid-android")
                stop = threading.Event()
                traffic = threading.Thread(target=phone_traffic, args=(server.base, tokens, stop))
                traffic.start()
                try:
                    store_uploads(client, device)
                    publish_a_round(client)
                    time.sleep(4)  # a few scrapes with traffic after the round
                    missing = [
                        (title, expr)
                        for title, expr in dashboard_queries()
                        if not any(math.isfinite(float(s["value"][1])) for s in query(prometheus_url, expr))
                    ]
                finally:
                    stop.set()
                    traffic.join()
    assert not missing, "dashboard queries without data:\n" + "\n".join(f"{t}: {e}" for t, e in missing)
