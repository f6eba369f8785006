"""Evaluation-only screening: is the phones' calibration target (the local accuracy their exit
threshold is set to reach on their ID validation samples, 98 % by default) a lever on the headline?
Each finished run of a method is evaluated again, as training ends, with its thresholds calibrated
to each target (`bench.saved_runs.evaluate_saved_run`, the training twins' path); the benchmark's
observer adds validation accuracy. Validation picks; test confirms. The runs' files must be on disk.

    python benchmarks/calibration_targets.py --runs-under benchmarks/results/fashion/work/eval \
        --method harmony --report benchmarks/results/calibration_targets
"""

from __future__ import annotations

import argparse
import json
import multiprocessing
import sys
from pathlib import Path

import numpy as np
import torch

from harmony_mobile.bench.hooks import BenchObserver, RunExtras, UplinkCounter
from harmony_mobile.bench.saved_runs import evaluate_saved_run
from harmony_mobile.bench.stats import paired_ci

sys.path.insert(0, str(Path(__file__).resolve().parent))  # the sibling script
from gate_study import split_runs_under  # noqa: E402

TARGETS = (0.9, 0.95, 0.97, 0.98, 0.99)
DEFAULT_TARGET = 0.98


def measure(job: tuple[Path, str, float]) -> dict:
    path, exit_rule, target = job
    torch.set_num_threads(1)
    seed = int(path.name.removeprefix("seed-"))
    extras = RunExtras()
    results = evaluate_saved_run(path, exit_rule, target, BenchObserver(UplinkCounter(), extras, seed))
    return {
        "setting": path.parent.parent.name,
        "seed": seed,
        "target": target,
        "test": results["summary"]["accuracy_with_ood"],
        "val": extras.validation["accuracy_with_ood"],
        "fallback_p05": results["mean"]["p=0.5"]["fallback_rate"],
    }


def table(rows: list[dict], setting: str) -> list[str]:
    mine = [r for r in rows if r["setting"] == setting]
    seeds = sorted({r["seed"] for r in mine})
    at = {(r["seed"], r["target"]): r for r in mine}
    lines = [
        f"## {setting} ({len(seeds)} seeds)",
        "",
        f"| target | val | test | test - {DEFAULT_TARGET:g} (paired 95 % t) | fallback at p=0.5 |",
        "|---|---|---|---|---|",
    ]
    for target in sorted({r["target"] for r in mine}):
        val = 100 * np.mean([at[s, target]["val"] for s in seeds])
        test = 100 * np.mean([at[s, target]["test"] for s in seeds])
        diff = paired_ci([100 * (at[s, target]["test"] - at[s, DEFAULT_TARGET]["test"]) for s in seeds])
        fallback = 100 * np.mean([at[s, target]["fallback_p05"] for s in seeds])
        lines.append(
            f"| {target:g} | {val:.2f} | {test:.2f} | {diff['mean']:+.2f} [{diff['low']:+.2f}, "
            f"{diff['high']:+.2f}] | {fallback:.1f} % |"
        )
    return lines + [""]


def picked(rows: list[dict]) -> float:
    """The target with the best validation accuracy averaged over every setting and seed."""
    targets = sorted({r["target"] for r in rows})
    return max(targets, key=lambda t: np.mean([r["val"] for r in rows if r["target"] == t]))


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--runs-under", type=Path, required=True)
    parser.add_argument("--method", default="harmony")
    parser.add_argument("--exit-rule", default="slot_margin")
    parser.add_argument("--targets", type=float, nargs="+", default=list(TARGETS))
    parser.add_argument("--jobs", type=int, default=2)
    parser.add_argument("--report", type=Path, required=True)
    args = parser.parse_args()
    targets = sorted({*args.targets, DEFAULT_TARGET})
    runs = split_runs_under(args.runs_under, args.method)
    if not runs:
        parser.error(f"no finished {args.method!r} run with its files under {args.runs_under}")
    jobs = [(path, args.exit_rule, target) for path in runs for target in targets]
    with multiprocessing.get_context("spawn").Pool(args.jobs) as pool:
        rows = pool.map(measure, jobs)
    best = picked(rows)
    lines = [
        f"# Calibration target of `{args.method}`'s phones (evaluation only)",
        "",
        f"`python benchmarks/calibration_targets.py --runs-under {args.runs_under} --method "
        f"{args.method}`: each saved run evaluated again with its phones' thresholds ({args.exit_rule}) "
        "calibrated to each target local accuracy on their ID validation samples; accuracy with OOD "
        "(mean of p = 0.2 and 0.5), mean over seeds; nothing retrained. "
        f"Validation picks **{best:g}** (best mean over every setting and seed; the default is "
        f"{DEFAULT_TARGET:g}).",
        "",
    ]
    for setting in sorted({r["setting"] for r in rows}):
        lines += table(rows, setting)
    args.report.mkdir(parents=True, exist_ok=True)
    (args.report / "report.md").write_text("\n".join(lines))
    (args.report / "rows.json").write_text(json.dumps(rows, indent=1) + "\n")
    print("\n".join(lines))


if __name__ == "__main__":
    main()
