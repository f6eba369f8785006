"""Compare `harmony demo` runs of two code versions over several seeds, paired by seed.

One demo runs one phone per tier on 130-190 test images, so a single seed moves its accuracy by
several points; this script puts the runs side by side and gives the paired difference with a
95 % t interval, which is what "no worse beyond seed noise" means here.

    harmony demo --seed S --out DIR          # once per seed, with each code version
    python benchmarks/demo_seeds.py --before-results OLD/results.json --after B0 B1 B2 --out DIR
    python benchmarks/demo_seeds.py --before-label "U-shaped (23ecaad)" --before A0 A1 A2 \
        --after-label "slot space (90f6026)" --after B0 B1 B2 --out benchmarks/results/demo_seeds

Per run and phase (deployed, drifted, aligned) it takes the mean over tiers of the phones'
accuracy with OOD and of the server's accuracy on their OOD samples, and the training run's own
evaluation over all its clients (`train.summary`, less noisy than four phones).
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import numpy as np

from harmony_mobile.bench.stats import paired_ci

PHASES = ("deployed", "drifted", "aligned")
PHONE_METRICS = {
    "accuracy_with_ood": "phones' accuracy with OOD",
    "server_accuracy_ood": "server's accuracy on the phones' OOD samples",
}


def summarize(report_dir: Path) -> dict:
    """One demo run reduced to the numbers compared: seed, per-phase tier means, training's own."""
    report = json.loads((report_dir / "demo-report.json").read_text())
    row = {"dir": str(report_dir), "seed": report["config"]["seed"]}
    for phase in PHASES:
        for metric in PHONE_METRICS:
            values = [tier[phase][metric] for tier in report["results"].values()]
            row[f"{phase}/{metric}"] = float(np.mean(values))
    row["train/accuracy_with_ood"] = report["train"]["summary"]["accuracy_with_ood"]
    row["train/accuracy_without_ood"] = report["train"]["summary"]["accuracy_without_ood"]
    return row


def compare(before: list[dict], after: list[dict]) -> dict:
    """Paired by seed: every metric's after - before difference with its t interval."""
    by_seed = {row["seed"]: row for row in before}
    pairs = [(by_seed[row["seed"]], row) for row in after if row["seed"] in by_seed]
    if len(pairs) < 2:
        raise SystemExit("need at least two seeds run with both versions")
    metrics = [key for key in after[0] if "/" in key]
    return {
        metric: {
            "seeds": [a["seed"] for _, a in pairs],
            **paired_ci([a[metric] - b[metric] for b, a in pairs]),
        }
        for metric in metrics
    }


def markdown(labels: tuple[str, str], before: list[dict], after: list[dict], diffs: dict) -> str:
    lines = [
        "# `harmony demo` over seeds, two code versions",
        "",
        f"Before: **{labels[0]}**; after: **{labels[1]}**. Numbers in percent; each row of the first",
        "table is the mean over the four tiers' phones (one phone per tier).",
        "",
        "| version | seed | metric | deployed | drifted | aligned |",
        "|---|---|---|---|---|---|",
    ]
    for label, rows in zip(labels, (before, after), strict=True):
        for row in sorted(rows, key=lambda r: r["seed"]):
            for metric, name in PHONE_METRICS.items():
                cells = " | ".join(f"{100 * row[f'{p}/{metric}']:.1f}" for p in PHASES)
                lines.append(f"| {label} | {row['seed']} | {name} | {cells} |")
    lines += ["", "After - before, paired by seed (points, mean and 95 % t interval):", ""]
    lines += ["| metric | mean | 95 % CI | n | CI excludes zero |", "|---|---|---|---|---|"]
    for metric, d in diffs.items():
        ci = f"[{100 * d['low']:+.1f}, {100 * d['high']:+.1f}]"
        lines.append(f"| {metric} | {100 * d['mean']:+.1f} | {ci} | {d['n']} | {d['excludes_zero']} |")
    lines.append("")
    lines.append("`train/...`: the training run's own evaluation over all of its clients, before export.")
    return "\n".join(lines) + "\n"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    before_source = parser.add_mutually_exclusive_group(required=True)
    before_source.add_argument("--before", nargs="+", type=Path, help="demo output folders")
    before_source.add_argument(
        "--before-results",
        type=Path,
        help="an earlier comparison's results.json: its 'before' rows and label, or its 'after' ones "
        "with --before-from after (the runs' folders need not exist any more)",
    )
    parser.add_argument("--before-from", choices=("before", "after"), default="before")
    parser.add_argument("--after", nargs="+", type=Path, required=True)
    parser.add_argument("--before-label", default="before")
    parser.add_argument("--after-label", default="after")
    parser.add_argument("--out", type=Path, required=True, help="folder for report.md and results.json")
    parser.add_argument("--note", default="", help="how the runs were made (machine, load), for the report")
    args = parser.parse_args()
    if args.before_results:
        earlier = json.loads(args.before_results.read_text())
        side = args.before_from
        before, args.before_label = earlier[side], earlier["labels"][0 if side == "before" else 1]
    else:
        before = [summarize(d) for d in args.before]
    after = [summarize(d) for d in args.after]
    diffs = compare(before, after)
    args.out.mkdir(parents=True, exist_ok=True)
    labels = (args.before_label, args.after_label)
    results = {
        "labels": labels,
        "before": before,
        "after": after,
        "after_minus_before": diffs,
        "note": args.note,
    }
    (args.out / "results.json").write_text(json.dumps(results, indent=1))
    note = f"\n{args.note}\n" if args.note else ""
    (args.out / "report.md").write_text(markdown(labels, before, after, diffs) + note)
    print((args.out / "report.md").read_text())


if __name__ == "__main__":
    main()
