"""PyTorch against ONNX Runtime for serving the back-end g, side by side in one run, one thread each
(torch.set_num_threads(1), ORT intra-op threads 1):

  * the back-end's forward alone, rows/s at batch 1 and batch 64 (backend.pt in eager PyTorch
    under inference_mode; the export's backend.onnx in an ONNX Runtime session);
  * the served route: binary single-row V2 infer requests straight into the ASGI app (no sockets,
    as benchmarks/server_infer_cpu.py), `--concurrency` at a time so micro-batching works as under
    load, on a replica started with `runtime=torch` and one with `runtime=onnx` (both --no-alignment).

Rounds alternate the two runtimes so a change in the machine's load hits both; each row is the
median of the rounds. Writes benchmarks/results/serving_runtime.{json,md}.

    .venv/bin/python benchmarks/serving_runtime.py [--rounds 5] [--requests 1500]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import platform
import statistics
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from harmony_mobile.export import steps  # noqa: E402
from harmony_mobile.server import Settings, create_app  # noqa: E402
from server_infer_cpu import drive  # noqa: E402
from server_load import ADMIN_TOKEN, RESULTS, make_model_dir  # noqa: E402

from harmony_mobile.onnx_backend import load_onnx_backend  # noqa: E402
from harmony_mobile.protocol.wire import encode_tensor  # noqa: E402
from harmony_mobile.run_dir import load_backend_file  # noqa: E402

RUNTIMES = ("torch", "onnx")
BATCHES = (1, 64)


def forward_rows_per_second(forward, batch: int, seconds: float) -> float:
    """Rows/s of `forward` on one (batch, 64, 8, 8) array, repeated for about `seconds`."""
    features = np.random.default_rng(batch).random((batch, 64, 8, 8), dtype=np.float32)
    for _ in range(5):  # warm-up: first calls allocate
        forward(features)
    calls, started = 0, time.perf_counter()
    while (elapsed := time.perf_counter() - started) < seconds:
        forward(features)
        calls += 1
    return calls * batch / elapsed


def forwards(export_dir: Path) -> dict:
    """runtime -> features -> logits, each on one thread."""
    backend = load_backend_file(export_dir / "backend" / "backend.pt").backend

    def torch_forward(features: np.ndarray) -> np.ndarray:
        with torch.inference_mode():
            return backend(torch.from_numpy(features)).numpy()

    onnx = load_onnx_backend((export_dir / "backend" / "backend.onnx").read_bytes(), threads=1)
    return {"torch": torch_forward, "onnx": onnx.forward}


async def served_rows_per_second(app, requests: int, concurrency: int) -> float:
    bodies = [
        encode_tensor(np.random.default_rng(i).random((1, 64, 8, 8), dtype=np.float32)) for i in range(32)
    ]
    started = time.perf_counter()
    done = await drive(app, bodies, requests, concurrency)
    return done / (time.perf_counter() - started)


def warm_up(model, max_batch: int) -> None:
    """One forward at every batch size micro-batching can form: the first forward of a shape sets
    up its kernels (oneDNN primitives in PyTorch: docs/DECISIONS.md), which a long-running server
    has long paid."""
    for rows in range(1, max_batch + 1):
        for _ in range(3):
            model.forward(np.zeros((rows, 64, 8, 8), np.float32))


async def measure_served(export_dir: Path, root: Path, args: argparse.Namespace) -> dict[str, list[float]]:
    apps = {}
    for runtime in RUNTIMES:
        settings = Settings(
            data_dir=root / f"data-{runtime}",
            model_dir=export_dir,
            admin_token=ADMIN_TOKEN,
            rate_limit_per_second=1e6,
            rate_limit_burst=1_000_000,
            run_alignment=False,
            runtime=runtime,
            torch_threads=1,
            onnx_threads=1,
        )
        apps[runtime] = create_app(settings)
        warm_up(apps[runtime].state.harmony.registry.default(), settings.max_batch)
    rates: dict[str, list[float]] = {runtime: [] for runtime in RUNTIMES}
    for app in apps.values():
        async with app.router.lifespan_context(app):
            await served_rows_per_second(app, 400, args.concurrency)
    for _ in range(args.rounds):
        for runtime, app in apps.items():  # alternated: load changes hit both runtimes
            async with app.router.lifespan_context(app):
                rates[runtime].append(await served_rows_per_second(app, args.requests, args.concurrency))
    return rates


def measure(args: argparse.Namespace) -> dict:
    root = Path(tempfile.mkdtemp(prefix="harmony-serving-runtime-"))
    source = make_model_dir(root, "torch")
    export_dir = root / "export"
    facts = steps.export_backend(source / "backend" / "backend.pt", export_dir / "backend")
    runners = forwards(export_dir)
    forward_rates: dict[str, dict[int, list[float]]] = {r: {b: [] for b in BATCHES} for r in RUNTIMES}
    for _ in range(args.rounds):
        for batch in BATCHES:
            for runtime in RUNTIMES:
                rate = forward_rows_per_second(runners[runtime], batch, args.seconds)
                forward_rates[runtime][batch].append(rate)
    served = asyncio.run(measure_served(export_dir, root, args))
    return {
        "onnx_max_abs_vs_eager": facts["onnx_max_abs_vs_eager"],
        "forward_rows_per_second": {
            runtime: {str(batch): rates for batch, rates in by_batch.items()}
            for runtime, by_batch in forward_rates.items()
        },
        "served_rows_per_second_batch1": served,
    }


def median(values: list[float]) -> float:
    return round(statistics.median(values), 1)


def markdown(report: dict) -> str:
    forward, served = report["forward_rows_per_second"], report["served_rows_per_second_batch1"]
    lines = [
        "# Serving runtime: PyTorch against ONNX Runtime",
        "",
        "Written by `benchmarks/serving_runtime.py`; every number below is measured by it, in one run, on",
        f"{report['machine']} (load average {report['load_average']} at the start; the machine is shared).",
        "One thread each: torch.set_num_threads(1) and ONNX Runtime's intra-op threads 1. The back-end",
        "is the server's g (64x8x8 interface, 10 classes): backend.pt in eager PyTorch, and the",
        "backend.onnx `harmony export` writes from it (ONNX Runtime"
        f" {report['onnxruntime']}, max |logit difference| {report['onnx_max_abs_vs_eager']:.1e}).",
        f"Rows/s, median of {report['rounds']} rounds, the runtimes alternated in each round:",
        "",
        "| | PyTorch | ONNX Runtime | ONNX / PyTorch |",
        "| --- | ---: | ---: | ---: |",
    ]
    for batch in BATCHES:
        t, o = median(forward["torch"][str(batch)]), median(forward["onnx"][str(batch)])
        lines.append(f"| back-end forward, batch {batch} | {t:,.0f} | {o:,.0f} | {o / t:.2f} |")
    t, o = median(served["torch"]), median(served["onnx"])
    lines.append(
        f"| served V2 infer, 1-row binary requests, {report['concurrency']} concurrent (in-process ASGI)"
        f" | {t:,.0f} | {o:,.0f} | {o / t:.2f} |"
    )
    lines += [
        "",
        "Every round (rows/s):",
        "",
    ]
    for runtime in RUNTIMES:
        for batch in BATCHES:
            values = ", ".join(f"{v:,.0f}" for v in forward[runtime][str(batch)])
            lines.append(f"- {runtime} forward, batch {batch}: {values}")
        lines.append(f"- {runtime} served: " + ", ".join(f"{v:,.0f}" for v in served[runtime]))
    lines.append("")
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--seconds", type=float, default=2.0, help="per forward measurement")
    parser.add_argument("--requests", type=int, default=1500, help="served requests per round and runtime")
    parser.add_argument("--concurrency", type=int, default=16)
    parser.add_argument("--out", type=Path, default=RESULTS)
    args = parser.parse_args()
    torch.set_num_threads(1)
    import onnxruntime

    report = {
        "machine": f"{platform.machine()}, {os.cpu_count()} cores, Python {platform.python_version()}",
        "load_average": round(os.getloadavg()[0], 1),
        "measured_at": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
        "torch": torch.__version__,
        "onnxruntime": onnxruntime.__version__,
        "rounds": args.rounds,
        "concurrency": args.concurrency,
        "requests_per_round": args.requests,
    }
    report.update(measure(args))
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "serving_runtime.json").write_text(json.dumps(report, indent=2) + "\n")
    (args.out / "serving_runtime.md").write_text(markdown(report))
    print(markdown(report))


if __name__ == "__main__":
    main()
