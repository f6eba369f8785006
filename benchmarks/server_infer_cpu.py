"""CPU time per binary single-row infer request, in process: requests go straight into the ASGI app
(no sockets, no HTTP client, no uvicorn), `--concurrency` at a time, so micro-batching works as
under load. Prints process CPU per request (event loop + inference thread + torch), the event-loop
thread's share, and wall time per request. `--profile` adds a cProfile of the event-loop thread
in CPU time (time.thread_time: waiting for the GIL is not counted against a function).

    .venv/bin/python benchmarks/server_infer_cpu.py --requests 1500 --rounds 3

A micro-benchmark of the Python path, not a load test (benchmarks/server_load.py is that). To
compare two versions of the server, run it on both checkouts alternately on the same machine.
"""

from __future__ import annotations

import argparse
import asyncio
import cProfile
import json
import pstats
import tempfile
import time
from pathlib import Path

import numpy as np
import torch
from harmony_mobile.server import Settings, create_app
from server_load import ADMIN_TOKEN, INFER, make_model_dir

from harmony_mobile.protocol.wire import encode_tensor


def infer_scope(body: bytes) -> dict:
    headers = [
        (b"host", b"bench"),
        (b"authorization", f"Bearer {ADMIN_TOKEN}".encode()),
        (b"content-type", b"application/octet-stream"),
        (b"content-length", str(len(body)).encode()),
        (b"x-harmony-tier", b"mid-android"),
    ]
    return {
        "type": "http", "asgi": {"version": "3.0"}, "http_version": "1.1", "method": "POST",
        "scheme": "http", "path": INFER, "raw_path": INFER.encode(), "query_string": b"",
        "root_path": "", "headers": headers, "client": ("127.0.0.1", 1), "server": ("bench", 80),
    }  # fmt: skip


async def one_request(app, body: bytes, target=None) -> None:
    """One infer request through `target`: the app, or one of its inner ASGI layers, which find the
    app in the scope where Starlette puts it."""
    delivered = False
    statuses = []

    async def receive() -> dict:
        nonlocal delivered
        if not delivered:
            delivered = True
            return {"type": "http.request", "body": body, "more_body": False}
        await asyncio.Event().wait()  # no disconnect while the app answers

    async def send(message: dict) -> None:
        if message["type"] == "http.response.start":
            statuses.append(message["status"])

    await (target or app)({**infer_scope(body), "app": app}, receive, send)
    if statuses != [200]:
        raise RuntimeError(f"infer answered {statuses}")


async def drive(app, bodies: list[bytes], requests: int, concurrency: int) -> int:
    per_client = requests // concurrency

    async def client(k: int) -> None:
        for i in range(per_client):
            await one_request(app, bodies[(k + i) % len(bodies)])

    await asyncio.gather(*(client(k) for k in range(concurrency)))
    return per_client * concurrency


async def measure(args: argparse.Namespace) -> list[dict]:
    root = Path(tempfile.mkdtemp(prefix="harmony-infer-cpu-"))
    settings = Settings(
        data_dir=root / "data",
        model_dir=make_model_dir(root, "torch"),
        admin_token=ADMIN_TOKEN,
        rate_limit_per_second=1e6,
        rate_limit_burst=1_000_000,
        torch_threads=1,
    )
    app = create_app(settings)
    rows = [np.random.default_rng(i).random((1, 64, 8, 8), dtype=np.float32) for i in range(32)]
    bodies = [encode_tensor(x) for x in rows]
    results = []
    async with app.router.lifespan_context(app):
        await drive(app, bodies, 800, args.concurrency)  # warm-up
        for _ in range(args.rounds):
            profile = cProfile.Profile(time.thread_time) if args.profile else None
            cpu, loop_cpu, wall = time.process_time(), time.thread_time(), time.perf_counter()
            if profile:
                profile.enable()
            done = await drive(app, bodies, args.requests, args.concurrency)
            if profile:
                profile.disable()
                pstats.Stats(profile).sort_stats("tottime").print_stats(30)
            results.append(
                {
                    "requests": done,
                    "cpu_us_per_request": round((time.process_time() - cpu) / done * 1e6),
                    "event_loop_cpu_us_per_request": round((time.thread_time() - loop_cpu) / done * 1e6),
                    "wall_us_per_request": round((time.perf_counter() - wall) / done * 1e6),
                }
            )
    return results


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--requests", type=int, default=1500)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--concurrency", type=int, default=16)
    parser.add_argument("--profile", action="store_true")
    args = parser.parse_args()
    torch.set_num_threads(1)
    for result in asyncio.run(measure(args)):
        print(json.dumps(result))


if __name__ == "__main__":
    main()
