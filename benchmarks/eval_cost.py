"""Cost of a benchmark run's final evaluation, with the clients' answers shared and without.

A benchmark run ends by scoring its personalized clients several ways: the test mixes at every OOD
fraction and the alignment score (`evaluation.evaluate`), then validation, the unseen classes and
the gate study (`bench/hooks.py`). Their samples overlap, and `evaluation.ClientAnswers` computes
each image's answer once per client for all of them. This script times that path against the same
measurements with every request computing its own forward pass (as the code did before the answers
were shared), in turns on the same finished run, and lists every number the two ways disagree on
(a request computed apart can move a confidence by float rounding, and a sample sitting on the exit
threshold then flips; anything more is a bug in the cache). The
unshared way is a little dearer than the old code was: its alignment score's requests also run the
back-end's slot scores, where the old code ran the front-end and `g`'s features only.

    .venv/bin/python benchmarks/eval_cost.py RUN_DIR [--turns 3]

RUN_DIR: a finished run with its model files (`harmony train`, or a benchmark work dir's run).
Writes benchmarks/results/eval_cost.md and .json.
"""

from __future__ import annotations

import argparse
import json
import math
import platform
import statistics
import time
from pathlib import Path

import numpy as np
import torch

from harmony_mobile.bench.gates import gate_studies
from harmony_mobile.bench.hooks import unseen_class_accuracy, validation_metrics
from harmony_mobile.bench.saved_runs import FinishedRun, load_finished_run
from harmony_mobile.evaluation import ClientAnswers, EvaluationSetting, evaluate

RESULTS = Path(__file__).parent / "results"


class Unshared(ClientAnswers):
    """Every request answered by its own forward pass: the evaluation before answers were shared."""

    def _gather(self, index) -> tuple[torch.Tensor, ...]:
        return self._answer(self.images[np.asarray(index, dtype=np.int64).reshape(-1)])


def measurements(run: FinishedRun, shared: bool) -> dict:
    """Everything a benchmark run's final evaluation computes; `shared`: one answer cache per client
    for all of it, else a forward pass per request."""
    setting = EvaluationSetting(run.images, run.labels, run.partition, run.seed, run.exit_rule)
    kind = ClientAnswers if shared else Unshared
    answers = {client.client_id: kind(client, run.served, run.images) for client in run.clients}
    args = (run.labels, run.partition, run.seed)
    return {
        "evaluate": evaluate(run.clients, run.served, setting, answers),
        "validation": validation_metrics(answers, *args, run.exit_rule),
        "unseen": unseen_class_accuracy(answers, *args),
        "gates": gate_studies(answers, run.served, *args, run.exit_rule, run.replay),
    }


def timed(run: FinishedRun, shared: bool) -> tuple[float, dict]:
    started = time.process_time()
    out = measurements(run, shared)
    return time.process_time() - started, out


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("run_dir", type=Path)
    parser.add_argument("--turns", type=int, default=3)
    parser.add_argument("--out", type=Path, default=RESULTS / "eval_cost")
    args = parser.parse_args(argv)
    torch.set_num_threads(1)
    run = load_finished_run(args.run_dir)
    seconds = {"shared": [], "unshared": []}
    outputs = {}
    for _ in range(args.turns):  # in turns: a load that comes and goes hits both alike
        for mode in seconds:
            cpu, outputs[mode] = timed(run, mode == "shared")
            seconds[mode].append(cpu)
    differences = differing_numbers(outputs["shared"], outputs["unshared"])
    medians = {mode: statistics.median(values) for mode, values in seconds.items()}
    info = json.loads((args.run_dir / "run.json").read_text())
    report = {
        "run": {
            k: info["train_config"].get(k)
            for k in ("algorithm", "dataset", "partition", "alpha", "seed", "rounds")
        },
        "clients": len(run.clients),
        "machine": {"platform": platform.platform(), "torch": torch.__version__, "torch_threads": 1},
        "cpu_seconds": seconds,
        "median_cpu_seconds": medians,
        "ratio": medians["shared"] / medians["unshared"],
        "identical_results": not differences,
        # (path, shared, unshared) of every number that differs: a forward pass batched apart can move
        # a confidence by float rounding, and a sample whose confidence is the exit threshold (the
        # calibration puts it on a validation sample's) then flips between exiting and falling back
        "differences": differences,
        "largest_difference": max((gap(a, b) for _, a, b in differences), default=0.0),
    }
    write(report, args.out)


def differing_numbers(a, b, path: str = "") -> list[tuple[str, object, object]]:
    """Every leaf of two measurement trees that differs (NaN equals NaN; a missing or extra key, a
    list of another length, a number against a non-number: a difference too)."""
    if isinstance(a, dict) and isinstance(b, dict):
        keys = sorted(set(a) | set(b), key=str)
        return [d for key in keys for d in differing_numbers(a.get(key), b.get(key), f"{path}/{key}")]
    if isinstance(a, list | tuple) and isinstance(b, list | tuple) and len(a) == len(b):
        return [
            d
            for i, (x, y) in enumerate(zip(a, b, strict=True))
            for d in differing_numbers(x, y, f"{path}[{i}]")
        ]
    if isinstance(a, int | float) and isinstance(b, int | float):
        same = a == b or (math.isnan(a) and math.isnan(b))
        return [] if same else [(path, a, b)]
    return [] if a == b else [(path, a, b)]


def gap(a, b) -> float:
    """How far apart two differing leaves are: their distance for two numbers, else infinity."""
    if isinstance(a, int | float) and isinstance(b, int | float) and not (math.isnan(a) or math.isnan(b)):
        return abs(a - b)
    return math.inf


def write(report: dict, out: Path) -> None:
    out.parent.mkdir(parents=True, exist_ok=True)
    out.with_suffix(".json").write_text(json.dumps(report, indent=1) + "\n")
    med = report["median_cpu_seconds"]
    text = (
        "# Final evaluation of a benchmark run: shared answers against a forward pass per request\n\n"
        "Made by `benchmarks/eval_cost.py` on one finished run "
        f"({report['clients']} clients; {json.dumps(report['run'])}), 1 torch thread, "
        f"{report['machine']['platform']}, torch {report['machine']['torch']}. CPU seconds of everything the "
        "run's final evaluation computes (test at every OOD fraction with the alignment score, validation, "
        "unseen classes, gate study), the two ways timed in turns, median of "
        f"{len(report['cpu_seconds']['shared'])} turns.\n\n"
        "| answers | CPU s per turn | median |\n|---|---|---|\n"
        + "".join(
            f"| {mode} | {', '.join(f'{v:.1f}' for v in report['cpu_seconds'][mode])} | {med[mode]:.1f} |\n"
            for mode in ("shared", "unshared")
        )
        + f"\nShared / unshared: **{report['ratio']:.2f} x**. Identical results both ways: "
        f"**{'yes' if report['identical_results'] else 'no'}**"
        + (
            f" ({len(report['differences'])} numbers differ, at most by {report['largest_difference']:.4f}: "
            "a sample whose confidence is the exit threshold flips with the float rounding of a forward "
            "pass batched apart)"
            if report["differences"]
            else ""
        )
        + ".\n\n"
        "The unshared way is a little dearer than the code before the change was: its alignment score's "
        "requests also run the back-end's slot scores, where that code ran the front-end and `g`'s "
        "features only.\n"
    )
    out.with_suffix(".md").write_text(text)
    print(text)


if __name__ == "__main__":
    main()
