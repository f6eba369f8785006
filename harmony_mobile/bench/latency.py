"""The latency side of the trade-off: what a query costs a phone on average.

    E[t] = exit rate * t_device + fallback rate * (t_device + RTT + t_server)
         = t_device + fallback rate * (RTT + t_server)

t_device: the median batch-1 latency of the tier's front-end exported to ExecuTorch (.pte, XNNPACK,
the same `build_pte` the export ships), run by the ExecuTorch runtime in this process with one
thread; t_server: the median batch-1 time of the back-end g in eager PyTorch with one thread (the
server's compute per fallback, no queueing); RTT: stated, not measured (a phone's network).
Measured on this machine's CPU, not on a phone: the numbers compare methods, they do not predict a
handset's absolute latency.
"""

from __future__ import annotations

import math
from pathlib import Path

import torch

from harmony_mobile.run_dir import RunDir


def expected_latency_ms(exit_rate: float, device_ms: float, server_ms: float, rtt_ms: float) -> float:
    """Expected time per query; a NaN exit rate (no queries) gives NaN."""
    if math.isnan(exit_rate):
        return math.nan
    fallback_rate = 1.0 - exit_rate
    return exit_rate * device_ms + fallback_rate * (device_ms + rtt_ms + server_ms)


@torch.no_grad()
def measure_run(run_path: str | Path, quantization: str = "fp32", runs: int = 50) -> dict:
    """Median batch-1 latency of each tier's exported front-end (its first client's) and of g."""
    from harmony_mobile.export.steps import build_pte, load_method, set_threads, wrap_front_end
    from harmony_mobile.export.verify import median_latency_ms

    set_threads(1)
    run = RunDir(run_path)
    info = run.info
    shape = tuple(info.input_shape)
    dataset = run.dataset() if quantization == "int8" else None
    tiers = {}
    for tier in info.tiers.tiers:
        client = run.representative_client(tier.name)
        module = wrap_front_end(run.front_end(client), shape, info.num_classes)
        calibration = dataset.images[client.train_idx[:64]] if dataset is not None else None
        built = build_pte(module, shape, quantization, calibration)
        method = load_method(built.buffer)
        example = torch.zeros(1, *shape)
        tiers[tier.name] = {
            "family": tier.family,
            "split_depth": tier.split_depth,
            "device_ms": median_latency_ms(lambda x, m=method: m.execute([x]), example, runs=runs),
            "pte_bytes": len(built.buffer),
        }
    backend = run.backend().backend
    features = torch.zeros(1, *backend.interface.shape)
    server_ms = median_latency_ms(backend, features, runs=runs)
    return {"tiers": tiers, "server_ms": server_ms, "quantization": quantization, "runs": runs}


def latency_table(results: dict, setting: str, methods: list[str], key: str = "p=0.2") -> list[dict]:
    """Per split method and tier: the mean exit rate over seeds at OOD fraction `key` and the
    expected ms per query from the measured times; plus a query-weighted mean over tiers."""
    latency = results.get("latency") or {}
    if "tiers" not in latency:
        return []
    rows = []
    for method in methods:
        runs = [
            r
            for r in results["runs"]
            if r["setting"] == setting and r["method"] == method and r.get("per_tier")
        ]
        if not runs or not _is_split(runs[0]):
            continue
        per_tier = {}
        for tier, timing in latency["tiers"].items():
            rates = [r["per_tier"][tier][key]["exit_rate"] for r in runs if tier in r["per_tier"]]
            exit_rate = sum(rates) / len(rates) if rates else math.nan
            per_tier[tier] = {
                "exit_rate": exit_rate,
                "expected_ms": expected_latency_ms(
                    exit_rate, timing["device_ms"], latency["server_ms"], latency["rtt_ms"]
                ),
            }
        defined = [v["expected_ms"] for v in per_tier.values() if not math.isnan(v["expected_ms"])]
        rows.append(
            {
                "method": method,
                "tiers": per_tier,
                "mean_ms": sum(defined) / len(defined) if defined else math.nan,
            }
        )
    return rows


def _is_split(run: dict) -> bool:
    return "server_fallback_accuracy" in run["mean"].get("p=0.5", {})
