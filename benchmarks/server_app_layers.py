"""What the fallback server's app costs per 1-row infer request without any HTTP: the ASGI app is
called in process by 64 concurrent clients (coroutines on one uvloop loop, one core), through the
whole middleware stack, from the infer dispatch inwards, and its infer handler alone, beside the
raw batched forward of the same back-end on the same core. With HTTP out of the picture this bounds
what any HTTP server in front of this app could carry: `server_load.py`'s target (1-row infer at
64 clients >= 0.5 x the raw batch-64 forward) needs the app alone well above 0.5 x. Requests are
`server_infer_cpu.py`'s; their scope lacks the marker uvicorn's guarded protocol sets once a body
has arrived (a server internal), so each one through the whole app arms and cancels the body-read
timer the HTTP server would spare it (a few µs).

    .venv/bin/python benchmarks/server_app_layers.py            # 6 s per measurement

Writes benchmarks/results/server_app_layers.md and .json.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import platform
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import torch
import uvloop
from starlette.requests import Request

sys.path.insert(0, str(Path(__file__).resolve().parent))
from harmony_mobile.server import Settings, create_app  # noqa: E402
from server_infer_cpu import one_request  # noqa: E402
from server_load import ADMIN_TOKEN, make_model_dir, raw_forward_rows_per_second  # noqa: E402

from harmony_mobile.protocol.wire import encode_tensor  # noqa: E402

RESULTS = Path(__file__).resolve().parent / "results"
CPU = 0
MAX_BATCH = 64


async def saturate(target, app, body: bytes, clients: int, seconds: float) -> float:
    """Requests per second of `clients` closed-loop coroutines calling `target` for `seconds`."""
    done = 0
    stop = time.perf_counter() + seconds

    async def client() -> None:
        nonlocal done
        while time.perf_counter() < stop:
            await one_request(app, body, target)
            done += 1

    started = time.perf_counter()
    await asyncio.gather(*(client() for _ in range(clients)))
    return done / (time.perf_counter() - started)


def app_layers(app) -> dict:
    """The ASGI callables a request passes through, outermost first, by the label the report uses."""

    layers, layer = {}, app.middleware_stack
    while hasattr(layer, "app") and type(layer).__name__ != "ExceptionMiddleware":
        layers[type(layer).__name__] = layer
        layer = layer.app
    dispatch = layers["InferDispatch"]  # found by name: the server's internals are not imported here

    async def handler_only(scope, receive, send) -> None:
        response = await dispatch.handle(Request(scope, receive), "harmony-backend", None)
        await response(scope, receive, send)

    return {
        "whole app (every middleware)": app,
        "from the infer dispatch inwards": dispatch,
        "infer handler alone": handler_only,
    }


async def measure_app(model_dir: Path, data_dir: Path, args: argparse.Namespace) -> dict:
    settings = Settings(
        data_dir=data_dir, model_dir=model_dir, admin_token=ADMIN_TOKEN, run_alignment=False,
        runtime="onnx", onnx_threads=1, max_batch=MAX_BATCH, max_wait_ms=2.0, max_request_rows=64,
        rate_limit_per_second=1e6, rate_limit_burst=1_000_000,
    )  # fmt: skip
    app = create_app(settings)
    body = encode_tensor(np.random.default_rng(0).random((1, 64, 8, 8), dtype=np.float32))
    async with app.router.lifespan_context(app):
        await one_request(app, body)  # builds the middleware stack
        results = {}
        for label, target in app_layers(app).items():
            await saturate(target, app, body, args.clients, 1.0)  # warm-up
            rates = [
                await saturate(target, app, body, args.clients, args.duration) for _ in range(args.repeats)
            ]
            results[label] = max(rates)
            print(f"{label}: {results[label]:.0f} requests/s (best of {rates})", flush=True)
        return results


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--duration", type=float, default=6.0, help="seconds per measurement")
    parser.add_argument("--repeats", type=int, default=2, help="measurements per layer (the best counts)")
    parser.add_argument("--clients", type=int, default=64)
    args = parser.parse_args()
    torch.set_num_threads(1)
    if (os.cpu_count() or 1) >= 2:
        os.sched_setaffinity(0, {CPU})  # the app, its inference thread and the raw forward share one core
    raw_before = raw_forward_rows_per_second("onnx", MAX_BATCH)
    with tempfile.TemporaryDirectory() as scratch:
        model_dir = make_model_dir(Path(scratch), "onnx")
        rates = uvloop.run(measure_app(model_dir, Path(scratch) / "data", args))
    raw_after = raw_forward_rows_per_second("onnx", MAX_BATCH)
    result = {
        "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
        "machine": platform.machine(),
        "cpus": os.cpu_count(),
        "torch": torch.__version__,
        "clients": args.clients,
        "duration_s": args.duration,
        "raw_forward_rows_per_second": {"before": raw_before, "after": raw_after},
        "requests_per_second": rates,
    }
    write_report(result)


def write_report(result: dict) -> None:
    raw = np.mean(list(result["raw_forward_rows_per_second"].values()))
    lines = [
        "# The fallback server's app without HTTP",
        "",
        f"Generated by `benchmarks/server_app_layers.py` on {result['date']} ({result['machine']}, "
        f"{result['cpus']} CPUs, torch {result['torch']}, onnx runtime on 1 thread, this process "
        f"pinned to one core). {result['clients']} closed-loop clients call the ASGI app in process "
        f"(1-row binary infer, max_batch {MAX_BATCH}, max_wait_ms 2), {result['duration_s']:g} s per "
        "measurement, the best of its repeats; beside it the raw batch-64 forward on the same core "
        f"(mean of before and after: {raw:.0f} rows/s).",
        "",
        "| requests enter at | requests/s = rows/s | x raw forward | app µs per request beyond the forward |",
        "|---|---|---|---|",
    ]
    for label, rate in result["requests_per_second"].items():
        beyond = 1e6 / rate - 1e6 / raw
        lines.append(f"| {label} | {rate:.0f} | {rate / raw:.2f} | {beyond:.0f} |")
    whole = result["requests_per_second"]["whole app (every middleware)"]
    lines += [
        "",
        f"With no HTTP at all the whole app carries **{whole / raw:.2f} x** the raw forward. Any HTTP "
        "server adds its own per-request cost on the same core (uvicorn's, answering a fixed body "
        "with no app, is in `server_load.md`), so the HTTP route's 1-row throughput stays below this.",
        "",
    ]
    (RESULTS / "server_app_layers.md").write_text("\n".join(lines))
    (RESULTS / "server_app_layers.json").write_text(json.dumps(result, indent=1) + "\n")
    print("\n".join(lines))


if __name__ == "__main__":
    main()
