"""Does a change to what the benchmark trains (narrower tiers, a learning-rate schedule) change the
ranking of the methods? Compares two sets of committed run records (bench.json) run by run on
validation accuracy with OOD (the only number tuning looks at), pairs them by setting, method, seed
and rounds, and says per setting whether the methods' order by mean is the same.

    python benchmarks/compare_records.py \
        --baseline benchmarks/results/fashion-width2/work/budget --baseline-label "ResNet width 2.0" \
        --candidate benchmarks/results/fashion-width-check/work/eval --candidate-label "width 1.0" \
        --out benchmarks/results/fashion-width-check/comparison.md
"""

from __future__ import annotations

import argparse
import json
import statistics
from pathlib import Path


def load_records(folder: Path) -> dict[tuple[str, str, int, int], dict]:
    """(setting, method, seed, rounds) -> record, for every bench.json under `folder`."""
    records = {}
    for path in sorted(folder.rglob("bench.json")):
        record = json.loads(path.read_text())
        key = (record["setting"], record["method"], record["seed"], record["train_config"]["rounds"])
        if key in records:  # tuning trials, or a folder holding two studies: say which, not pick one
            raise SystemExit(f"{path}: a second run of {key} under {folder}; point at one stage's folder")
        records[key] = record
    return records


def val_score(record: dict) -> float:
    return 100 * record["validation"]["accuracy_with_ood"]


def ranking(scores: dict[str, list[float]]) -> list[str]:
    return sorted(scores, key=lambda method: -statistics.fmean(scores[method]))


def compare(baseline: dict, candidate: dict, labels: tuple[str, str]) -> tuple[list[str], dict]:
    """Markdown lines and a JSON summary over the keys both sets hold."""
    shared = sorted(set(baseline) & set(candidate))
    if not shared:
        raise SystemExit("the two folders share no (setting, method, seed, rounds) run")
    lines = [
        f"| setting | method | seeds | rounds | {labels[0]} | {labels[1]} | difference | CPU ratio |",
        "|---|---|---|---|---|---|---|---|",
    ]
    summary: dict = {"settings": {}, "commits": {}}
    for label, records in zip(labels, (baseline, candidate), strict=True):
        summary["commits"][label] = sorted({records[k]["code"]["commit"] for k in shared})
    for setting in sorted({k[0] for k in shared}):
        keys = [k for k in shared if k[0] == setting]
        per_method: dict[str, tuple[list[float], list[float], list[float]]] = {}
        for key in keys:
            a, b = baseline[key], candidate[key]
            base, cand, cpu = per_method.setdefault(key[1], ([], [], []))
            base.append(val_score(a))
            cand.append(val_score(b))
            cpu.append(b["cpu_seconds"] / a["cpu_seconds"])
        for method, (base, cand, cpu) in sorted(per_method.items()):
            seeds = sorted({k[2] for k in keys if k[1] == method})
            rounds = sorted({k[3] for k in keys if k[1] == method})
            mean_a, mean_b = statistics.fmean(base), statistics.fmean(cand)
            lines.append(
                f"| {setting} | {method} | {', '.join(map(str, seeds))} | {', '.join(map(str, rounds))} "
                f"| {mean_a:.1f} | {mean_b:.1f} | {mean_b - mean_a:+.1f} | {statistics.fmean(cpu):.2f}x |"
            )
        order_a = ranking({m: v[0] for m, v in per_method.items()})
        order_b = ranking({m: v[1] for m, v in per_method.items()})
        summary["settings"][setting] = {
            "ranking": {labels[0]: order_a, labels[1]: order_b},
            "same_ranking": order_a == order_b,
            "mean_val_acc_with_ood": {
                m: [statistics.fmean(v[0]), statistics.fmean(v[1])] for m, v in per_method.items()
            },
            "cpu_ratio": {m: statistics.fmean(v[2]) for m, v in per_method.items()},
        }
    return lines, summary


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--baseline", type=Path, required=True)
    parser.add_argument("--candidate", type=Path, required=True)
    parser.add_argument("--baseline-label", default="baseline")
    parser.add_argument("--candidate-label", default="candidate")
    parser.add_argument("--out", type=Path, required=True, help="markdown report (and .json beside it)")
    args = parser.parse_args()
    labels = (args.baseline_label, args.candidate_label)
    lines, summary = compare(load_records(args.baseline), load_records(args.candidate), labels)
    text = [
        f"# {labels[1]} against {labels[0]}",
        "",
        f"Produced by `python benchmarks/compare_records.py --baseline {args.baseline} --candidate "
        f"{args.candidate}`. Validation accuracy with OOD (%), mean over the seeds both hold; CPU ratio = "
        f"{labels[1]}'s CPU time / {labels[0]}'s, per run, averaged. Records made at commits "
        + "; ".join(f"{label}: {', '.join(summary['commits'][label])}" for label in labels)
        + " (a ratio across commits also counts what changed between them).",
        "",
        *lines,
        "",
    ]
    for setting, row in summary["settings"].items():
        a, b = (row["ranking"][label] for label in labels)
        verdict = "same" if row["same_ranking"] else "**changed**"
        text.append(
            f"- {setting}: ranking {verdict}: {labels[0]} {' > '.join(a)}; {labels[1]} {' > '.join(b)}"
        )
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text("\n".join(text) + "\n")
    args.out.with_suffix(".json").write_text(json.dumps(summary, indent=2) + "\n")
    print("\n".join(text))


if __name__ == "__main__":
    main()
