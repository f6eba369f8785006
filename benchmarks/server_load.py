"""Load benchmark of the fallback server: a real `harmony serve` process on a loopback port, driven by
N concurrent HTTP clients for a bounded time, with dynamic micro-batching on (max_batch 32) and off
(max_batch 1). Also measures the raw batched back-end forward in this process, so the report can
say how much of the model's throughput the HTTP path delivers.

    .venv/bin/python benchmarks/server_load.py                    # 10 s per config, 16 clients
    .venv/bin/python benchmarks/server_load.py --duration 3 --clients 8

Writes benchmarks/results/server_load.md and .json. The load generator runs on the same machine
as the server and competes with it for CPU; the report records the core count.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import multiprocessing
import os
import platform
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import httpx
import numpy as np
import torch

from harmony_mobile.federation.wire import encode_tensor
from harmony_mobile.models import Backend, InterfaceSpec, ProjectionHead
from harmony_mobile.run_dir import save_backend

ADMIN_TOKEN = "benchmark-admin-token-0123456789"
INFER = "/v2/models/harmony-backend/infer"
RESULTS = Path(__file__).resolve().parent / "results"


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def make_model_dir(root: Path) -> Path:
    torch.manual_seed(0)
    backend = Backend(InterfaceSpec(), 10)
    model_dir = root / "model"
    save_backend(
        model_dir / "backend" / "backend.pt",
        backend,
        ProjectionHead(backend.feature_dim, 128),
        "bench",
        tuple("0123456789"),
    )
    return model_dir


def raw_forward_rows_per_second(batch: int, seconds: float = 3.0) -> float:
    """The back-end alone: rows/s of back-to-back forward passes at one batch size (no HTTP, no queue)."""
    torch.manual_seed(0)
    backend = Backend(InterfaceSpec(), 10).eval()
    x = torch.randn(batch, *InterfaceSpec().shape)
    with torch.inference_mode():
        for _ in range(20):
            backend(x)
        rows, started = 0, time.perf_counter()
        while time.perf_counter() - started < seconds:
            backend(x)
            rows += batch
    return rows / (time.perf_counter() - started)


class Server:
    def __init__(
        self, model_dir: Path, data_dir: Path, max_batch: int, max_wait_ms: float, torch_threads: int
    ):
        self.port = free_port()
        command = [
            sys.executable, "-m", "harmony_mobile.cli", "serve",
            "--host", "127.0.0.1", "--port", str(self.port),
            "--data-dir", str(data_dir), "--model-dir", str(model_dir),
            "--max-batch", str(max_batch), "--max-wait-ms", str(max_wait_ms),
            "--torch-threads", str(torch_threads), "--log-level", "warning",
        ]  # fmt: skip
        env = {**os.environ, "HARMONY_ADMIN_TOKEN": ADMIN_TOKEN}
        self.process = subprocess.Popen(command, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
        self.url = f"http://127.0.0.1:{self.port}"

    def wait_ready(self, timeout: float = 60) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                raise RuntimeError(f"server exited: {self.process.stderr.read().decode()}")
            try:
                if httpx.get(f"{self.url}/v2/health/ready", timeout=1).status_code == 200:
                    return
            except httpx.TransportError:
                pass
            time.sleep(0.2)
        raise RuntimeError("server did not become ready")

    def stop(self) -> None:
        self.process.send_signal(signal.SIGTERM)
        try:
            self.process.wait(timeout=20)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait()


async def _drive_one_process(url: str, clients: int, duration: float, max_requests: int, rows: int) -> dict:
    """One load-generator process: `clients` keep-alive connections in one asyncio loop."""
    bodies = [
        encode_tensor(np.random.default_rng(i).random((rows, 64, 8, 8), dtype=np.float32)) for i in range(64)
    ]
    headers = {"Authorization": f"Bearer {ADMIN_TOKEN}", "content-type": "application/octet-stream"}
    latencies: list[float] = []
    statuses: dict[int, int] = {}
    issued = 0
    limits = httpx.Limits(max_connections=clients, max_keepalive_connections=clients)
    async with httpx.AsyncClient(base_url=url, limits=limits, timeout=30) as client:
        for body in bodies[:clients]:  # warm-up: open the connections
            await client.post(INFER, content=body, headers=headers)
        started = time.perf_counter()
        deadline = started + duration

        async def worker(index: int) -> None:
            nonlocal issued
            while time.perf_counter() < deadline and issued < max_requests:
                issued += 1
                body = bodies[(index + issued) % len(bodies)]
                sent = time.perf_counter()
                response = await client.post(INFER, content=body, headers=headers)
                latencies.append(time.perf_counter() - sent)
                statuses[response.status_code] = statuses.get(response.status_code, 0) + 1

        await asyncio.gather(*(worker(i) for i in range(clients)))
        elapsed = time.perf_counter() - started
    return {"latencies": latencies, "statuses": statuses, "seconds": elapsed}


def _driver_process(url: str, clients: int, duration: float, max_requests: int, rows: int, results) -> None:
    results.put(asyncio.run(_drive_one_process(url, clients, duration, max_requests, rows)))


def drive(url: str, clients: int, processes: int, duration: float, max_requests: int, rows: int) -> dict:
    """`clients` connections spread over `processes` load-generator processes: one Python process
    cannot issue requests fast enough to saturate the server on its own."""
    results = multiprocessing.Queue()
    per_process = [clients // processes + (i < clients % processes) for i in range(processes)]
    workers = [
        multiprocessing.Process(
            target=_driver_process, args=(url, n, duration, max_requests // processes, rows, results)
        )
        for n in per_process
    ]
    for worker in workers:
        worker.start()
    parts = [results.get(timeout=duration + 120) for _ in workers]
    for worker in workers:
        worker.join()
    latencies = [latency for part in parts for latency in part["latencies"]]
    statuses: dict[int, int] = {}
    for part in parts:
        for code, count in part["statuses"].items():
            statuses[code] = statuses.get(code, 0) + count
    elapsed = max(part["seconds"] for part in parts)
    metrics = httpx.get(f"{url}/metrics").text
    ok = statuses.get(200, 0)
    batches = _metric(metrics, "harmony_inference_batches_total")
    inferred = _metric(metrics, "harmony_inference_rows_total")
    return {
        "requests": sum(statuses.values()),
        "ok": ok,
        "statuses": {str(k): v for k, v in sorted(statuses.items())},
        "seconds": elapsed,
        "requests_per_second": ok / elapsed,
        "rows_per_second": ok * rows / elapsed,
        "latency_p50_ms": 1000 * statistics.median(latencies),
        "latency_p99_ms": 1000 * float(np.percentile(latencies, 99)),
        "mean_batch_rows": inferred / batches if batches else 0.0,
    }


def _metric(text: str, name: str) -> float:
    for line in text.splitlines():
        if line.startswith(name + " "):
            return float(line.split()[1])
    return 0.0


def _mean_run(runs: list[dict]) -> dict:
    keys = ("requests_per_second", "rows_per_second", "latency_p50_ms", "latency_p99_ms", "mean_batch_rows")
    return {k: statistics.mean(r[k] for r in runs) for k in keys}


def write_report(result: dict) -> None:
    RESULTS.mkdir(parents=True, exist_ok=True)
    (RESULTS / "server_load.json").write_text(json.dumps(result, indent=2) + "\n")
    setup = result["setup"]
    lines = [
        "# Fallback server load benchmark",
        "",
        f"Generated by `benchmarks/server_load.py` on {result['date']} ({setup['machine']}, {setup['cpus']} CPUs, "
        f"torch {setup['torch']}, torch threads {setup['torch_threads']}, 1-min load average "
        f"{setup['load_average_at_start']} at start). A real `harmony serve` (uvicorn, one "
        f"process) on 127.0.0.1, {setup['clients']} concurrent keep-alive httpx connections spread over "
        f"{setup['driver_processes']} load-generator processes, "
        f"{setup['duration_s']:g} s per config (at most {setup['max_requests']} requests), each request one "
        f"binary HMFT body of {setup['rows_per_request']} x 64x8x8 float32 rows (16 KiB + 24 B per row); "
        "the load generator shares the CPUs with the server.",
        "",
        "| config | run | max_batch | requests/s | rows/s | p50 ms | p99 ms | mean rows per forward | statuses | served / raw batched forward |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    raw = result["raw_forward_rows_per_second"]
    for run in result["runs"]:
        lines.append(
            f"| {run['name']} | {run['repeat']} | {run['max_batch']} | {run['requests_per_second']:.0f} | {run['rows_per_second']:.0f} | "
            f"{run['latency_p50_ms']:.1f} | {run['latency_p99_ms']:.1f} | {run['mean_batch_rows']:.1f} | "
            f"{run['statuses']} | {run['rows_per_second'] / raw['batch_32']:.1%} |"
        )
    on = _mean_run([r for r in result["runs"] if r["max_batch"] > 1])
    off = _mean_run([r for r in result["runs"] if r["max_batch"] == 1])
    forward_ms = 1000 / raw["batch_1"]
    lines += [
        "",
        f"Raw back-end forward in the benchmark process (same torch threads, no HTTP): "
        f"{raw['batch_32']:.0f} rows/s at batch 32, {raw['batch_1']:.0f} rows/s at batch 1.",
        "",
        "Reading: the last column is served rows/s divided by the raw batch-32 forward rows/s. One forward of "
        f"one row costs about {forward_ms:.2f} ms, while the HTTP path (request parsing, auth, the hand-off to "
        "the inference thread and back, the JSON response) costs several ms of Python per request, in one "
        "process that shares the CPUs with the load generators. So the server is HTTP-bound: the queue seldom "
        f"holds many requests (mean {on['mean_batch_rows']:.1f} rows per forward with batching on), and "
        f"micro-batching changes mean throughput by {on['requests_per_second'] / off['requests_per_second'] - 1:+.0%} "
        f"({on['requests_per_second']:.0f} vs {off['requests_per_second']:.0f} requests/s; compare the spread "
        "between repeats of one config before reading anything into that). "
        "Batching pays off when the back-end forward dominates (a larger g, or several rows per request); "
        "the HTTP ceiling rises with uvloop + httptools (`uvicorn[standard]`) or more uvicorn workers.",
    ]
    (RESULTS / "server_load.md").write_text("\n".join(lines) + "\n")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--duration", type=float, default=10.0, help="seconds of load per config")
    parser.add_argument("--clients", type=int, default=16, help="concurrent HTTP connections in total")
    parser.add_argument("--driver-processes", type=int, default=3, help="load-generator processes")
    parser.add_argument("--max-requests", type=int, default=50_000, help="upper bound on requests per config")
    parser.add_argument("--rows-per-request", type=int, default=1)
    parser.add_argument("--repeats", type=int, default=2, help="runs per config, interleaved")
    parser.add_argument("--torch-threads", type=int, default=1, help="server and raw forward")
    parser.add_argument("--max-wait-ms", type=float, default=2.0)
    args = parser.parse_args()
    torch.set_num_threads(args.torch_threads)
    load_at_start = os.getloadavg()[0]  # other work on the machine skews every number below

    raw = {"batch_1": raw_forward_rows_per_second(1), "batch_32": raw_forward_rows_per_second(32)}
    runs = []
    with tempfile.TemporaryDirectory() as scratch:
        model_dir = make_model_dir(Path(scratch))
        # Alternate the configs (on, off, on, off, ...): on a shared machine the load drifts, and
        # interleaving keeps that drift from favouring one config.
        configs = [("micro-batching on", 32), ("micro-batching off", 1)] * args.repeats
        for index, (name, max_batch) in enumerate(configs):
            server = Server(
                model_dir,
                Path(scratch) / f"data-{index}",
                max_batch,
                args.max_wait_ms,
                args.torch_threads,
            )
            try:
                server.wait_ready()
                run = drive(
                    server.url,
                    args.clients,
                    args.driver_processes,
                    args.duration,
                    args.max_requests,
                    args.rows_per_request,
                )
            finally:
                server.stop()
            run.update(name=name, max_batch=max_batch, repeat=index // 2 + 1)
            runs.append(run)
            print(
                f"{name}: {run['requests_per_second']:.0f} req/s, p50 {run['latency_p50_ms']:.1f} ms, "
                f"p99 {run['latency_p99_ms']:.1f} ms, mean batch {run['mean_batch_rows']:.1f}, {run['statuses']}"
            )
    print(f"raw forward: {raw['batch_32']:.0f} rows/s at batch 32, {raw['batch_1']:.0f} at batch 1")
    write_report(
        {
            "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
            "setup": {
                "machine": platform.machine(),
                "cpus": os.cpu_count(),
                "torch": torch.__version__,
                "torch_threads": args.torch_threads,
                "clients": args.clients,
                "driver_processes": args.driver_processes,
                "duration_s": args.duration,
                "repeats": args.repeats,
                "max_requests": args.max_requests,
                "rows_per_request": args.rows_per_request,
                "max_wait_ms": args.max_wait_ms,
                "load_average_at_start": round(load_at_start, 2),
            },
            "raw_forward_rows_per_second": raw,
            "runs": runs,
        }
    )


if __name__ == "__main__":
    main()
