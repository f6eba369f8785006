"""`harmony serve --workers 2` counts the whole server: `/metrics` and the status page sum what every
worker served (prometheus-client's multiprocess mode), whichever worker answers the scrape. The
per-device rate limit is per worker process, as docs/OPERATIONS.md says: each worker holds its own
token bucket, so a device gets at most `workers x burst` requests at once. Which worker answered is
read from the OS (tests/server_process.py), not from anything the server says."""

from __future__ import annotations

import re
import time

import httpx
import numpy as np

from tests.helpers.fallback_server import (
    ADMIN,
    bearer,
    class_features,
    enrol,
    json_infer_body,
    make_model_dir,
)
from tests.server_process import RunningServer, answering_pid, serve_process, worker_pids

INFER = "/v2/models/harmony-backend/infer"
INFER_OK = 'harmony_http_requests_total{method="POST",route="/v2/models/{name}/infer",status="200"}'
BURST = 3
NEW_CONNECTIONS_AT_MOST = 60


def on_new_connection(server: RunningServer, workers: set[int], method: str, path: str, **kwargs):
    """One request over a connection of its own (the kernel picks the worker); returns the response
    and the worker that answered it."""
    with httpx.Client(base_url=server.base, timeout=30) as client:
        response = client.request(method, path, **kwargs)
        return response, answering_pid(server, response, workers)


def sample(text: str, name_and_labels: str) -> float:
    match = re.search(rf"^{re.escape(name_and_labels)} (\S+)$", text, re.MULTILINE)
    return float(match.group(1)) if match else 0.0


def wait_until_every_worker_accepts(server: RunningServer, workers: set[int], timeout: float = 90) -> None:
    """Readiness is one worker's answer: the other may still be loading torch and the back-end, and
    until it accepts, every new connection goes to the first. Waits on a route that counts toward
    no rate limit and no metric the tests read."""
    seen: set[int] = set()
    deadline = time.monotonic() + timeout
    while seen != workers:
        assert time.monotonic() < deadline, f"only {seen} of {workers} accepted within {timeout} s"
        _, pid = on_new_connection(server, workers, "GET", "/v2/health/live")
        if pid in seen:
            time.sleep(0.05)
        seen.add(pid)


def infer_until_both_workers_answered(server: RunningServer, workers: set[int]) -> dict[int, int]:
    served = dict.fromkeys(workers, 0)
    body = json_infer_body(class_features(np.array([2, 7]), seed=0))  # two rows per request
    for _ in range(NEW_CONNECTIONS_AT_MOST):
        response, pid = on_new_connection(server, workers, "POST", INFER, json=body, headers=ADMIN)
        assert response.status_code == 200, response.text
        served[pid] += 1
        if all(served.values()) and sum(served.values()) >= 6:
            break
    assert all(served.values()), f"not every worker answered: {served}"
    return served


def test_metrics_and_the_status_page_sum_every_worker(tmp_path):
    flags = ["--workers", "2", "--max-wait-ms", "0"]
    with serve_process(tmp_path / "data", make_model_dir(tmp_path), *flags) as server:
        workers = worker_pids(server)
        assert len(workers) == 2, workers
        wait_until_every_worker_accepts(server, workers)
        served = infer_until_both_workers_answered(server, workers)
        total = sum(served.values())
        scraped_by = set()
        for _ in range(NEW_CONNECTIONS_AT_MOST):
            scrape, pid = on_new_connection(server, workers, "GET", "/metrics")
            text = scrape.text
            # each worker served only its share; every scrape must report the sum
            assert sample(text, INFER_OK) == total, (served, pid, text)
            assert sample(text, "harmony_inference_rows_total") == 2 * total
            assert sample(text, 'harmony_fallback_rows_total{tier="other"}') == 2 * total
            assert sample(text, "harmony_inference_queue_depth") == 0
            page, page_pid = on_new_connection(server, workers, "GET", "/")
            assert f"<td>inferred rows</td><td>{2 * total}</td>" in page.text, page.text
            scraped_by |= {pid, page_pid}
            if scraped_by == workers:
                break
        assert scraped_by == workers, f"only {scraped_by} answered a scrape or the status page"
        metrics_dirs = list((tmp_path / "data" / "prometheus-multiproc").iterdir())
        assert [d.name for d in metrics_dirs] == [str(server.process.pid)]  # one per running server


def test_the_rate_limit_is_per_worker_process(tmp_path):
    """What docs/OPERATIONS.md documents: with N workers a device may send N x burst at once."""
    flags = ["--workers", "2", "--max-wait-ms", "0"]
    env = {"HARMONY_RATE_LIMIT_BURST": str(BURST), "HARMONY_RATE_LIMIT_PER_SECOND": "0.001"}
    with serve_process(tmp_path / "data", make_model_dir(tmp_path), *flags, env=env) as server:
        workers = worker_pids(server)
        wait_until_every_worker_accepts(server, workers)
        with httpx.Client(base_url=server.base, headers=ADMIN) as admin:
            auth = bearer(enrol(admin)["token"])
        statuses: dict[int, list[int]] = {pid: [] for pid in workers}
        for _ in range(NEW_CONNECTIONS_AT_MOST):
            response, pid = on_new_connection(
                server, workers, "GET", "/v2/models/harmony-backend", headers=auth
            )
            statuses[pid].append(response.status_code)
            if all(len(s) > BURST for s in statuses.values()):
                break
        for seen in statuses.values():
            # each worker's own bucket: BURST answered, then 429 (the refill is 1 per 1000 s)
            assert seen[:BURST] == [200] * BURST and set(seen[BURST:]) == {429}, statuses
        metrics = httpx.get(f"{server.base}/metrics").text
        refused = sum(seen.count(429) for seen in statuses.values())
        assert sample(metrics, "harmony_rate_limited_total") == refused
