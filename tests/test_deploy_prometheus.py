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
import pytest
import yaml

from tests.helpers.fallback_server import (
    TIER_FAMILIES,
    enrol,
    make_model_dir,
)
from tests.helpers.operator_traffic import phone_traffic, publish_a_round, store_uploads, wait_for
from tests.helpers.ports import free_port
from tests.server_process import serve_process

ROOT = Path(__file__).resolve().parents[1]
DASHBOARD = ROOT / "deploy" / "grafana" / "harmony-dashboard.json"
SCRAPE_CONFIG = ROOT / "deploy" / "prometheus.yml"
# what Grafana puts in place of the dashboard's variables: all instances, a window of many scrapes
VARIABLES = {"$__rate_interval": "30s", "$instance": ".*"}


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


def query(prometheus_url: str, expr: str) -> list[dict]:
    answer = httpx.get(f"{prometheus_url}/api/v1/query", params={"query": expr}, timeout=10).json()
    assert answer["status"] == "success", (expr, answer)
    return answer["data"]["result"]


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
                keep_going = lambda: not stop.is_set()  # noqa: E731
                traffic = threading.Thread(target=phone_traffic, args=(server.base, tokens, keep_going))
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
