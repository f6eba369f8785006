"""Load benchmark of the fallback server, every figure from one run on one machine:

  * ceilings: the raw batched forward of the back-end (no HTTP, no queue) at batch 1 and at the
    server's max_batch, in this process; the floor, `GET /v2/health/live`, an async route with
    nothing to do in the same app behind the same middleware (routing, metrics, body limit); and
    the bare HTTP server, uvicorn as the server runs it answering a fixed body with no app: with
    the raw forward it bounds what any app could carry with one row per request;
  * throughput: closed-loop keep-alive clients (`--clients`, 64) against the floor, binary (HMFT)
    infer of 1-row requests (what phones send) and of `--rows` rows per request, and 1-row infer
    on a second server with batching off (max_batch 1): what the dynamic batcher earns;
  * latency: an open loop with Poisson arrivals at a fraction of the measured 1-row throughput,
    repeated (`--repeats`) so the spread of p99 is visible; latency counts from the scheduled send
    time, so waiting for a connection is included (no coordinated omission).

    .venv/bin/python benchmarks/server_load.py                  # 8 s per measurement
    .venv/bin/python benchmarks/server_load.py --duration 3

Writes benchmarks/results/server_load.md and .json. The load generator runs on the same machine.
With one server process on a machine of 2+ CPUs (`--pin`, the default there) the server and the
raw forward run on CPU 0 and the load generator on the others, so the ceilings and the server get
the same one core and the generator never takes the server's; otherwise they share every CPU. The
report records the core count, the pinning and what other work was running.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import functools
import gc
import json
import multiprocessing
import os
import platform
import random
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import httpx
import numpy as np
import torch

from harmony_mobile.models import Backend, InterfaceSpec, ProjectionHead
from harmony_mobile.onnx_backend import load_onnx_backend
from harmony_mobile.protocol.digests import sha256_file
from harmony_mobile.protocol.label_tokens import class_tokens, epoch_key
from harmony_mobile.protocol.slots import SlotTable
from harmony_mobile.protocol.wire import encode_tensor
from harmony_mobile.run_dir import backend_onnx_bytes, save_backend, save_backend_onnx

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))  # the server helpers the tests use

from tests.helpers.ports import free_port  # noqa: E402
from tests.helpers.processes import stop, wait_until_ready  # noqa: E402

ADMIN_TOKEN = "benchmark-admin-token-0123456789"
INFER = "/v2/models/harmony-backend/infer"
RESULTS = Path(__file__).resolve().parent / "results"
CLASS_NAMES = tuple("0123456789")
TARGET_RAW_RATIO = 0.5  # 1-row infer rows/s at 64 clients against the raw batched forward
TARGET_FLOOR_RATIO = 0.6  # 1-row infer requests/s against the async floor's
POOL_LIMIT = 256  # connections per Poisson load-generator process
SERVER_CPU = 0  # with --pin: the server's and the raw forward's core; the load generator gets the rest


def server_cpus(args: argparse.Namespace) -> set[int] | None:
    return {SERVER_CPU} if args.pin else None


def load_cpus(args: argparse.Namespace) -> set[int] | None:
    return set(range(os.cpu_count() or 1)) - {SERVER_CPU} if args.pin else None


@contextlib.contextmanager
def on_cpus(cpus: set[int] | None):
    """Run the block on `cpus` (None: wherever it runs now); processes started inside inherit them."""
    if cpus is None:
        yield
        return
    before = os.sched_getaffinity(0)
    os.sched_setaffinity(0, cpus)
    try:
        yield
    finally:
        os.sched_setaffinity(0, before)


def make_model_dir(root: Path, runtime: str) -> Path:
    """A model dir with a random back-end, and its backend.onnx when the onnx runtime serves it."""
    torch.manual_seed(0)
    backend = Backend(InterfaceSpec(), 10)
    pt_file = root / "model" / "backend" / "backend.pt"
    table = SlotTable(
        "bench", len(CLASS_NAMES), class_tokens(epoch_key(os.urandom(32), "bench"), CLASS_NAMES)
    )
    save_backend(pt_file, backend, ProjectionHead(backend.feature_dim, 128), "bench", CLASS_NAMES, table)
    if runtime == "onnx":
        sample = torch.randn(4, *InterfaceSpec().shape)
        save_backend_onnx(
            pt_file.with_name("backend.onnx"), backend, "bench", table, sha256_file(pt_file), 0, sample
        )
    return root / "model"


@functools.cache  # one export per runtime: every ceiling measurement reuses it
def raw_forward(runtime: str):
    """The back-end's forward on one thread, as the server's runtime runs it: numpy in, numpy out."""
    torch.manual_seed(0)
    backend = Backend(InterfaceSpec(), 10).eval()
    if runtime == "onnx":
        sample = torch.randn(4, *InterfaceSpec().shape)
        content, _ = backend_onnx_bytes(backend, "bench", SlotTable("bench", 10), "0" * 64, 0, sample)
        return load_onnx_backend(content, threads=1).forward

    def forward(features: np.ndarray) -> np.ndarray:
        with torch.inference_mode():
            return backend(torch.from_numpy(features)).numpy()

    return forward


def raw_forward_rows_per_second(
    runtime: str, batch: int, seconds: float = 3.0, cpus: set[int] | None = None
) -> float:
    """The back-end alone: rows/s of back-to-back forward passes at one batch size (no HTTP, no queue)."""
    with on_cpus(cpus):
        return _forward_rows_per_second(runtime, batch, seconds)


def _forward_rows_per_second(runtime: str, batch: int, seconds: float) -> float:
    forward = raw_forward(runtime)
    x = np.random.default_rng(0).standard_normal((batch, *InterfaceSpec().shape), dtype=np.float32)
    for _ in range(20):
        forward(x)
    rows, started = 0, time.perf_counter()
    while time.perf_counter() - started < seconds:
        forward(x)
        rows += batch
    return rows / (time.perf_counter() - started)


BARE_BODY = b'{"live":true}'


async def bare_http_app(scope: dict, receive, send) -> None:
    """An ASGI app that answers every request with one fixed body: what the HTTP server itself
    (uvicorn, httptools, uvloop) costs per request, with no app in front of it."""
    if scope["type"] == "lifespan":
        while (await receive())["type"] != "lifespan.shutdown":
            await send({"type": "lifespan.startup.complete"})
        await send({"type": "lifespan.shutdown.complete"})
        return
    headers = [(b"content-type", b"application/json"), (b"content-length", b"%d" % len(BARE_BODY))]
    await send({"type": "http.response.start", "status": 200, "headers": headers})
    await send({"type": "http.response.body", "body": BARE_BODY})


class BareHttpServer:
    """`bare_http_app` under uvicorn with the fallback server's HTTP stack and settings (httptools,
    uvloop, no access log, no proxy headers), on the server's core."""

    def __init__(self, args: argparse.Namespace):
        self.port = free_port()
        self.max_batch = 0
        command = [
            sys.executable, "-m", "uvicorn", "--app-dir", str(Path(__file__).resolve().parent),
            "server_load:bare_http_app", "--host", "127.0.0.1", "--port", str(self.port),
            "--http", "httptools", "--loop", "uvloop", "--no-access-log", "--no-proxy-headers",
            "--timeout-keep-alive", "5", "--log-level", "warning",
        ]  # fmt: skip
        with on_cpus(server_cpus(args)):
            self.process = subprocess.Popen(command, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
        self.url = f"http://127.0.0.1:{self.port}"

    def wait_ready(self, timeout: float = 90) -> None:
        wait_until_ready(self.process, f"{self.url}/", timeout)

    def metrics(self) -> str:
        return ""  # no batches: the run's rows per forward is 0

    def stop(self) -> None:
        stop(self.process, timeout=20)


class Server:
    def __init__(self, model_dir: Path, data_dir: Path, args: argparse.Namespace, max_batch: int):
        self.port = free_port()
        self.max_batch = max_batch
        command = [
            sys.executable, "-m", "harmony_mobile.cli", "serve",
            "--host", "127.0.0.1", "--port", str(self.port), "--workers", str(args.workers),
            "--data-dir", str(data_dir), "--model-dir", str(model_dir),
            "--max-batch", str(max_batch), "--max-wait-ms", str(args.max_wait_ms),
            "--torch-threads", str(args.torch_threads), "--onnx-threads", str(args.torch_threads),
            "--runtime", args.runtime, "--log-level", "warning",
        ]  # fmt: skip
        if args.runtime == "onnx":
            command.append("--no-alignment")
        env = {
            **os.environ,
            "HARMONY_ADMIN_TOKEN": ADMIN_TOKEN,
            "HARMONY_MAX_REQUEST_ROWS": str(max(64, args.rows)),
            "HARMONY_RATE_LIMIT_PER_SECOND": "1000000",  # one token drives all the load
            "HARMONY_RATE_LIMIT_BURST": "1000000",
        }
        with on_cpus(server_cpus(args)):  # every thread of the server inherits it
            self.process = subprocess.Popen(
                command, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE
            )
        self.url = f"http://127.0.0.1:{self.port}"

    def wait_ready(self, timeout: float = 90) -> None:
        wait_until_ready(self.process, f"{self.url}/v2/health/ready", timeout)

    def metrics(self) -> str:
        return httpx.get(f"{self.url}/metrics").text

    def stop(self) -> None:
        stop(self.process, timeout=20)


# ---------------------------------------------------------------- load generator
#
# A raw asyncio HTTP/1.1 keep-alive client: the request bytes are built once, a response is read by
# its Content-Length. httpx costs a few hundred microseconds of Python per request, which on a
# shared 2-core machine is CPU taken from the server under test.


def raw_request(method: str, path: str, headers: dict[str, str], body: bytes = b"") -> bytes:
    lines = [f"{method} {path} HTTP/1.1", "Host: bench"]
    lines += [f"{name}: {value}" for name, value in headers.items()]
    lines.append(f"Content-Length: {len(body)}")
    return ("\r\n".join(lines) + "\r\n\r\n").encode() + body


class Connection:
    def __init__(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter):
        self.reader, self.writer = reader, writer

    @classmethod
    async def open(cls, host: str, port: int) -> Connection:
        return cls(*await asyncio.open_connection(host, port))

    async def exchange(self, request: bytes) -> int:
        self.writer.write(request)
        head = await self.reader.readuntil(b"\r\n\r\n")
        status = int(head[9:12])
        length = 0
        for line in head.split(b"\r\n")[1:]:
            if line[:15].lower() == b"content-length:":
                length = int(line[15:])
        await self.reader.readexactly(length)
        return status

    def close(self) -> None:
        self.writer.close()


async def closed_loop(port: int, requests: list[bytes], clients: int, duration: float) -> dict:
    """`clients` connections, each sending its next request as soon as the last one is answered."""
    connections = [await Connection.open("127.0.0.1", port) for _ in range(clients)]
    latencies, statuses = [], {}
    started = time.perf_counter()
    deadline = started + duration

    async def run(index: int, connection: Connection) -> None:
        i = index
        while time.perf_counter() < deadline:
            sent = time.perf_counter()
            status = await connection.exchange(requests[i % len(requests)])
            latencies.append(time.perf_counter() - sent)
            statuses[status] = statuses.get(status, 0) + 1
            i += clients

    await asyncio.gather(*(run(i, c) for i, c in enumerate(connections)))
    elapsed = time.perf_counter() - started
    for connection in connections:
        connection.close()
    return {"latencies": latencies, "statuses": statuses, "seconds": elapsed}


async def poisson_loop(port: int, requests: list[bytes], rate: float, duration: float, seed: int) -> dict:
    """Requests with exponential gaps (Poisson arrivals at `rate`) whatever the answers do; each one
    takes an idle connection, or opens one (up to POOL_LIMIT, then waits for one), and its latency
    counts from its scheduled send time. A connection the server closed while idle (keep-alive
    timeout) is reopened and the request sent again, as HTTP clients do."""
    idle: asyncio.Queue[Connection] = asyncio.Queue()
    opened = 0
    latencies, statuses, tasks = [], {}, []
    gaps = random.Random(seed)

    async def connection() -> Connection:
        nonlocal opened
        if idle.empty() and opened < POOL_LIMIT:
            opened += 1
            return await Connection.open("127.0.0.1", port)
        return await idle.get()

    async def one(index: int, scheduled: float) -> None:
        conn = await connection()
        try:
            status = await conn.exchange(requests[index % len(requests)])
        except (asyncio.IncompleteReadError, ConnectionError):
            conn.close()
            conn = await Connection.open("127.0.0.1", port)
            status = await conn.exchange(requests[index % len(requests)])
        latencies.append(time.perf_counter() - scheduled)
        statuses[status] = statuses.get(status, 0) + 1
        idle.put_nowait(conn)

    started = time.perf_counter()
    scheduled, index = started, 0
    while (scheduled := scheduled + gaps.expovariate(rate)) < started + duration:
        delay = scheduled - time.perf_counter()
        if delay > 0:
            await asyncio.sleep(delay)
        tasks.append(asyncio.create_task(one(index, scheduled)))
        index += 1
    await asyncio.gather(*tasks)
    elapsed = time.perf_counter() - started
    while not idle.empty():
        idle.get_nowait().close()
    return {"latencies": latencies, "statuses": statuses, "seconds": elapsed}


def route_requests(kind: str, rows: int, count: int = 32) -> list[bytes]:
    if kind == "floor":
        return [raw_request("GET", "/v2/health/live", {})]
    headers = {"Authorization": f"Bearer {ADMIN_TOKEN}", "Content-Type": "application/octet-stream"}
    tensors = [np.random.default_rng(i).random((rows, 64, 8, 8), dtype=np.float32) for i in range(count)]
    return [raw_request("POST", INFER, headers, encode_tensor(x)) for x in tensors]


def _driver(
    port: int, kind: str, rows: int, mode: str, load: float, duration: float, seed: int, results
) -> None:
    requests = route_requests(kind, rows)
    # the generator's own garbage collections would stall its loop and count as server latency (its
    # heap grows with every request it keeps); a process of seconds can do without (as timeit does)
    gc.disable()
    if mode == "closed":
        part = asyncio.run(closed_loop(port, requests, int(load), duration))
    else:
        part = asyncio.run(poisson_loop(port, requests, load, duration, seed))
    results.put(part)


def measure(port: int, kind: str, rows: int, mode: str, load: float, duration: float, processes: int) -> dict:
    """`load` = connections (closed loop) or requests/s (Poisson), split over `processes`."""
    results = multiprocessing.Queue()
    workers = [
        multiprocessing.Process(
            target=_driver, args=(port, kind, rows, mode, load / processes, duration, seed, results)
        )
        for seed in range(processes)
    ]
    for worker in workers:
        worker.start()
    parts = [results.get(timeout=duration + 120) for _ in workers]
    for worker in workers:
        worker.join()
    return summarize(parts, kind, rows, mode, load)


def summarize(parts: list[dict], kind: str, rows: int, mode: str, load: float) -> dict:
    latencies = [latency for part in parts for latency in part["latencies"]]
    statuses: dict[int, int] = {}
    for part in parts:
        for code, count in part["statuses"].items():
            statuses[code] = statuses.get(code, 0) + count
    elapsed = max(part["seconds"] for part in parts)
    ok = statuses.get(200, 0)
    return {
        "route": kind,
        "rows_per_request": rows if kind != "floor" else 0,
        "mode": mode,
        "offered": load,
        "requests": sum(statuses.values()),
        "statuses": {str(k): v for k, v in sorted(statuses.items())},
        "seconds": elapsed,
        "requests_per_second": ok / elapsed,
        "rows_per_second": ok * rows / elapsed if kind != "floor" else 0.0,
        "latency_p50_ms": 1000 * statistics.median(latencies),
        "latency_p99_ms": 1000 * float(np.percentile(latencies, 99)),
        "latency_p999_ms": 1000 * float(np.percentile(latencies, 99.9)),
    }


def metric_value(text: str, name: str) -> float:
    for line in text.splitlines():
        if line.startswith(name + " "):
            return float(line.split()[1])
    return 0.0


def batch_rows_delta(before: str, after: str) -> float:
    """Mean rows per executed forward between two scrapes."""
    batches = metric_value(after, "harmony_inference_batches_total") - metric_value(
        before, "harmony_inference_batches_total"
    )
    rows = metric_value(after, "harmony_inference_rows_total") - metric_value(
        before, "harmony_inference_rows_total"
    )
    return rows / batches if batches else 0.0


def saturate(server: Server, kind: str, rows: int, args: argparse.Namespace, label: str) -> dict:
    measure(server.port, kind, rows, "closed", args.clients, 1.0, args.driver_processes)  # warm-up
    before = server.metrics()
    run = measure(server.port, kind, rows, "closed", args.clients, args.duration, args.driver_processes)
    run.update(
        label=label, max_batch=server.max_batch, mean_batch_rows=batch_rows_delta(before, server.metrics())
    )
    print(f"{label}: {run['requests_per_second']:.0f} req/s, {run['rows_per_second']:.0f} rows/s, "
          f"p50 {run['latency_p50_ms']:.1f} ms, p99 {run['latency_p99_ms']:.1f} ms, "
          f"{run['mean_batch_rows']:.1f} rows/forward, {run['statuses']}", flush=True)  # fmt: skip
    return run


def poisson(server: Server, kind: str, rate: float, args: argparse.Namespace, label: str) -> dict:
    before = server.metrics()
    run = measure(server.port, kind, 1, "poisson", rate, args.duration, args.driver_processes)
    run.update(
        label=label, max_batch=server.max_batch, mean_batch_rows=batch_rows_delta(before, server.metrics())
    )
    print(f"{label}: offered {rate:.0f}/s, p50 {run['latency_p50_ms']:.1f} ms, p99 {run['latency_p99_ms']:.1f} ms, "
          f"p99.9 {run['latency_p999_ms']:.1f} ms, {run['statuses']}", flush=True)  # fmt: skip
    return run


def with_adjacent_ceiling(run, args: argparse.Namespace) -> dict:
    """The run, with the raw batched forward measured just before and just after it (the machine's
    speed drifts when others share it): the mean of the two is that run's ceiling."""
    cpus = server_cpus(args)
    before = raw_forward_rows_per_second(args.runtime, args.max_batch, 2.0, cpus)
    result = run()
    after = raw_forward_rows_per_second(args.runtime, args.max_batch, 2.0, cpus)
    return result | {"adjacent_raw_forward": [before, after], "ceiling": (before + after) / 2}


def floor_pair(floor: dict, infer: dict) -> dict:
    """One floor run and the 1-row infer run right after it: the machine's speed drifts between
    runs, so the verdict takes the median of such adjacent pairs, not one run."""
    ratio = infer["requests_per_second"] / floor["requests_per_second"]
    return {"floor": floor["requests_per_second"], "infer": infer["requests_per_second"], "ratio": ratio}


def batching_server_runs(model_dir: Path, scratch: Path, args: argparse.Namespace) -> list[dict]:
    """Floor and infer at saturation, then the Poisson latency runs, on the batching server."""
    server = Server(model_dir, scratch / "data-batching", args, args.max_batch)
    try:
        server.wait_ready()
        floor = saturate(server, "floor", 0, args, "floor")
        one_row = with_adjacent_ceiling(lambda: saturate(server, "binary", 1, args, "infer, 1 row"), args)
        many_rows = with_adjacent_ceiling(
            lambda: saturate(server, "binary", args.rows, args, f"infer, {args.rows} rows"), args
        )
        pairs = [floor_pair(floor, one_row)] + [
            floor_pair(saturate(server, "floor", 0, args, f"floor, pair {k + 2}"),
                       saturate(server, "binary", 1, args, f"infer, 1 row, pair {k + 2}"))
            for k in range(args.pairs - 1)
        ]  # fmt: skip
        runs = [floor, one_row, many_rows, {"mode": "pairs", "pairs": pairs}]
        for fraction in args.poisson_fractions:
            for repeat in range(args.repeats):
                rate = fraction * one_row["requests_per_second"]
                label = f"infer, 1 row, Poisson at {fraction:.0%} (repeat {repeat + 1})"
                runs.append(poisson(server, "binary", rate, args, label) | {"fraction": fraction})
        return runs
    finally:
        server.stop()


def unbatched_server_run(model_dir: Path, scratch: Path, args: argparse.Namespace) -> dict:
    server = Server(model_dir, scratch / "data-unbatched", args, 1)
    try:
        server.wait_ready()
        return saturate(server, "binary", 1, args, "infer, 1 row, batching off")
    finally:
        server.stop()


def bare_http_run(args: argparse.Namespace) -> dict:
    server = BareHttpServer(args)
    try:
        server.wait_ready()
        return with_adjacent_ceiling(lambda: saturate(server, "floor", 0, args, "bare HTTP server"), args)
    finally:
        server.stop()


def raw_ceilings(args: argparse.Namespace) -> dict[str, float]:
    cpus = server_cpus(args)
    return {
        "batch_1": raw_forward_rows_per_second(args.runtime, 1, cpus=cpus),
        f"batch_{args.max_batch}": raw_forward_rows_per_second(args.runtime, args.max_batch, cpus=cpus),
    }


def busy_cpu_share(seconds: float = 2.0) -> float | None:
    """The share of all CPUs busy over `seconds` (from /proc/stat): what other work was using just
    before the run. The load average cannot say it: it trails by a minute."""

    def totals() -> tuple[int, int]:
        fields = [int(v) for v in Path("/proc/stat").read_text().split("\n", 1)[0].split()[1:]]
        idle = fields[3] + fields[4]  # idle + iowait
        return sum(fields) - idle, sum(fields)

    try:
        busy_0, all_0 = totals()
        time.sleep(seconds)
        busy_1, all_1 = totals()
    except (OSError, ValueError, IndexError):  # not Linux
        return None
    return (busy_1 - busy_0) / max(all_1 - all_0, 1)


def setup_record(args: argparse.Namespace, load_at_start: float, busy_before: float | None) -> dict:
    return {
        "machine": platform.machine(),
        "cpus": os.cpu_count(),
        "torch": torch.__version__,
        "torch_threads": args.torch_threads,
        "runtime": args.runtime,
        "workers": args.workers,
        "pinned": args.pin,
        "clients": args.clients,
        "rows": args.rows,
        "driver_processes": args.driver_processes,
        "duration_s": args.duration,
        "max_batch": args.max_batch,
        "max_wait_ms": args.max_wait_ms,
        "repeats": args.repeats,
        "load_average_at_start": round(load_at_start, 2),
        "busy_cpu_share_before": None if busy_before is None else round(busy_before, 3),
        "load_average_at_end": round(os.getloadavg()[0], 2),
    }


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--duration", type=float, default=8.0, help="seconds per measurement")
    parser.add_argument("--clients", type=int, default=64, help="closed-loop connections at saturation")
    parser.add_argument("--rows", type=int, default=16, help="rows per request of the multi-row run")
    parser.add_argument("--driver-processes", type=int, default=2, help="load-generator processes")
    parser.add_argument("--workers", type=int, default=1, help="server processes")
    parser.add_argument("--torch-threads", type=int, default=1, help="server and raw forward")
    parser.add_argument(
        "--runtime",
        choices=["torch", "onnx"],
        default="onnx",
        help="what runs the back-end (serve --runtime)",
    )
    parser.add_argument("--max-batch", type=int, default=64)
    parser.add_argument("--max-wait-ms", type=float, default=2.0)
    parser.add_argument("--repeats", type=int, default=3, help="repeats of each Poisson latency run")
    parser.add_argument(
        "--pairs",
        type=int,
        default=3,
        help="adjacent floor / 1-row infer runs the floor verdict takes the median of",
    )
    parser.add_argument(
        "--poisson-fractions", type=float, nargs="+", default=[0.25, 0.5], help="of the 1-row saturated rate"
    )
    parser.add_argument(
        "--pin",
        action=argparse.BooleanOptionalAction,
        default=None,
        help="server and raw forward on CPU 0, load generator on the others (default: with 1 worker on 2+ CPUs)",
    )
    args = parser.parse_args()
    if args.pin is None:
        args.pin = args.workers == 1 and (os.cpu_count() or 1) >= 2
    return args


def main() -> None:
    args = parse_args()
    torch.set_num_threads(args.torch_threads)
    load_at_start = os.getloadavg()[0]
    busy_before = busy_cpu_share()
    raw_before = raw_ceilings(args)
    with tempfile.TemporaryDirectory() as scratch:
        model_dir = make_model_dir(Path(scratch), args.runtime)
        with on_cpus(load_cpus(args)):  # the load generator's processes inherit it
            runs = batching_server_runs(model_dir, Path(scratch), args)
            runs.append(unbatched_server_run(model_dir, Path(scratch), args))
            runs.append(bare_http_run(args))
    raw_after = raw_ceilings(args)
    result = {
        "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
        "setup": setup_record(args, load_at_start, busy_before),
        # the higher of the two measurements (before and after the HTTP runs) is the ceiling
        "raw_forward_rows_per_second": {k: max(raw_before[k], raw_after[k]) for k in raw_before},
        "raw_forward_measurements": {"before": raw_before, "after": raw_after},
        "runs": runs,
    }
    write_server_load_report(result)


def _saturation_table(result: dict) -> list[str]:
    raw = result["raw_forward_rows_per_second"]
    max_batch = result["setup"]["max_batch"]
    runs = [r for r in result["runs"] if r.get("mode") == "closed"]
    floor = runs[0]["requests_per_second"]
    lines = [
        "| run | max_batch | requests/s | rows/s | x floor (requests/s) | x raw forward (rows/s) | rows per forward | p50 ms | p99 ms | statuses |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    for run in runs:
        ceiling = run.get("ceiling") or (
            raw[f"batch_{max_batch}"] if run["max_batch"] > 1 else raw["batch_1"]
        )
        to_raw = (
            f"{run['rows_per_second'] / ceiling:.2f} (of batch {run['max_batch']})"
            if run["route"] != "floor"
            else ""
        )
        lines.append(
            f"| {run['label']} | {run['max_batch'] or '-'} | {run['requests_per_second']:.0f} | {run['rows_per_second']:.0f} | "
            f"{run['requests_per_second'] / floor:.2f} | {to_raw} | {run['mean_batch_rows']:.1f} | "
            f"{run['latency_p50_ms']:.1f} | {run['latency_p99_ms']:.1f} | {run['statuses']} |"
        )
    return lines


def _latency_table(result: dict) -> list[str]:
    lines = [
        "| run | offered requests/s | answered requests/s | p50 ms | p99 ms | p99.9 ms | rows per forward | statuses |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for run in (r for r in result["runs"] if r.get("mode") == "poisson"):
        lines.append(
            f"| {run['label']} | {run['offered']:.0f} | {run['requests_per_second']:.0f} | {run['latency_p50_ms']:.1f} | "
            f"{run['latency_p99_ms']:.1f} | {run['latency_p999_ms']:.1f} | {run['mean_batch_rows']:.1f} | {run['statuses']} |"
        )
    spreads = {}
    for run in result["runs"]:
        if "fraction" in run:
            spreads.setdefault(run["fraction"], []).append(run["latency_p99_ms"])
    lines.append("")
    lines.append(
        "p99 across the repeats: "
        + "; ".join(f"at {f:.0%} of saturation {min(v):.1f} to {max(v):.1f} ms" for f, v in spreads.items())
        + "."
    )
    return lines


def _targets(result: dict) -> list[str]:
    setup = result["setup"]
    by_label = {r["label"]: r for r in result["runs"] if "label" in r}
    floor, one_row = by_label["floor"], by_label["infer, 1 row"]
    many = by_label[f"infer, {setup['rows']} rows"]
    off = by_label["infer, 1 row, batching off"]
    ceiling = one_row["ceiling"]
    pairs = next((r["pairs"] for r in result["runs"] if r.get("mode") == "pairs"), None)
    to_floor = one_row["requests_per_second"] / floor["requests_per_second"]
    measured = f"{one_row['requests_per_second']:.0f} vs {floor['requests_per_second']:.0f} requests/s"
    if pairs:  # older results had one pair: the first run's ratio
        to_floor = statistics.median(p["ratio"] for p in pairs)
        measured = "median of adjacent floor / infer pairs " + ", ".join(
            f"{p['ratio']:.2f} ({p['infer']:.0f} vs {p['floor']:.0f})" for p in pairs
        )
    to_raw = one_row["rows_per_second"] / ceiling

    def verdict(value: float, target: float) -> str:
        return "met" if value >= target else "not met"

    return [
        f"Targets, from this one run: 1-row infer against the async floor at {setup['clients']} clients "
        f"**{to_floor:.2f} x** (target {TARGET_FLOOR_RATIO} x: {verdict(to_floor, TARGET_FLOOR_RATIO)}; "
        f"{measured}); 1-row infer rows/s "
        f"against the raw batch-{setup['max_batch']} forward measured just before and after it **{to_raw:.2f} x** "
        f"(target {TARGET_RAW_RATIO} x: {verdict(to_raw, TARGET_RAW_RATIO)}; {one_row['rows_per_second']:.0f} vs "
        f"{ceiling:.0f} rows/s). The floor route, which does nothing, answers "
        f"{floor['requests_per_second'] / ceiling:.2f} x as many requests per second as the raw forward computes "
        f"rows. With {setup['rows']} rows per request the route carries {many['rows_per_second']:.0f} "
        f"rows/s, **{many['rows_per_second'] / many['ceiling']:.2f} x** the raw forward (same adjacent "
        "measurement). The batcher earns "
        f"{one_row['rows_per_second'] / off['rows_per_second']:.2f} x the 1-row throughput of the same server with "
        f"batching off ({off['rows_per_second']:.0f} rows/s, max_batch 1).",
        *_http_bound(by_label.get("bare HTTP server"), one_row),
    ]


def _http_bound(bare: dict | None, one_row: dict) -> list[str]:
    """What any app could carry on this HTTP server: per 1-row request, the core pays the bare
    server's cost per request plus the raw forward's cost per row, and nothing else."""
    if bare is None:  # results from before the bare server was measured
        return []
    per_row_s = 1 / bare["requests_per_second"] + 1 / bare["ceiling"]
    bound = 1 / per_row_s
    return [
        "",
        f"The bare HTTP server (uvicorn, httptools and uvloop as the fallback server runs them, answering a "
        f"fixed body with no app) answers {bare['requests_per_second']:.0f} requests/s on the same core. An app "
        f"that added nothing to it, batching 1-row requests perfectly, would carry at most {bound:.0f} rows/s: "
        f"**{bound / bare['ceiling']:.2f} x** the raw forward measured beside that run "
        f"({bare['ceiling']:.0f} rows/s). The 1-row infer route carries "
        f"{one_row['rows_per_second'] / bound:.2f} x that bound: per request the app spends "
        f"{1e6 * (1 / one_row['rows_per_second'] - per_row_s):.0f} µs beyond the bare server and the forward; "
        f"{TARGET_RAW_RATIO} x the raw forward needs that below "
        f"{1e6 * max(0.0, 1 / (TARGET_RAW_RATIO * bare['ceiling']) - per_row_s):.0f} µs.",
    ]


def _other_work(setup: dict) -> str:
    busy = setup.get("busy_cpu_share_before")
    load = f"1-min load average {setup['load_average_at_start']} at start and {setup['load_average_at_end']} at end"
    if busy is None:  # older results, or not Linux: the load average is all there is
        return load
    return f"other work kept {100 * busy:.0f} % of the CPUs busy in the 2 s before the run ({load})"


def _placement(setup: dict) -> str:
    if setup.get("pinned"):
        return (f"the server and the raw forward run on CPU {SERVER_CPU}, the load generator on the "
                "other CPUs")  # fmt: skip
    return "the load generator runs on the same CPUs as the server"


def write_server_load_report(result: dict) -> None:
    RESULTS.mkdir(parents=True, exist_ok=True)
    (RESULTS / "server_load.json").write_text(json.dumps(result, indent=2) + "\n")
    setup, raw = result["setup"], result["raw_forward_rows_per_second"]
    measured = result["raw_forward_measurements"]
    batched = f"batch_{setup['max_batch']}"
    lines = [
        "# Fallback server load benchmark",
        "",
        f"Generated by `benchmarks/server_load.py` on {result['date']} ({setup['machine']}, {setup['cpus']} CPUs, "
        f"torch {setup['torch']}, runtime {setup.get('runtime', 'torch')} on {setup['torch_threads']} thread(s); "
        f"{_other_work(setup)}; {_placement(setup)}). One run: real `harmony serve` processes "
        f"({setup['workers']} worker process(es), max_wait_ms {setup['max_wait_ms']}) on 127.0.0.1; saturation = "
        f"{setup['clients']} closed-loop keep-alive connections over {setup['driver_processes']} load-generator "
        f"processes for {setup['duration_s']:g} s after a 1 s warm-up; the floor is `GET /v2/health/live`, an async "
        "route of the same app behind the same middleware.",
        "",
        f"Raw back-end forward in the benchmark process (no HTTP, no queue; the higher of a measurement before and "
        f"one after the HTTP runs): {raw['batch_1']:.0f} rows/s at batch 1, {raw[batched]:.0f} "
        f"rows/s at batch {setup['max_batch']} (before: {measured['before'][batched]:.0f}, "
        f"after: {measured['after'][batched]:.0f}).",
        "",
        "## Throughput at saturation",
        "",
        "x raw forward: rows/s against the raw batch-max_batch forward measured just before and just after that run "
        "(their mean); batching off: against the batch-1 forward above.",
        "",
        *_saturation_table(result),
        "",
        *_targets(result),
        "",
        "## Latency under Poisson arrivals",
        "",
        f"Open loop: exponential gaps between requests at a fraction of the 1-row saturated rate, {setup['repeats']} "
        "repeats each; latency from each request's scheduled send time (a request waiting for a connection "
        "waits on the clock).",
        "",
        *_latency_table(result),
    ]
    (RESULTS / "server_load.md").write_text("\n".join(lines) + "\n")


if __name__ == "__main__":
    main()
