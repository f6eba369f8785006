"""HARMONY configurations side by side over many seeds, paired by seed, on one profile's setting.

A benchmark profile runs each method on a few seeds; at the `quick` budget the seed spread (several
points) is as large as the effects of HARMONY's knobs, so a 3-seed ablation can show an effect
that is not there. This script runs named variants of HARMONY's configuration (overrides of the
profile's HARMONY config) on as many seeds as asked and reports each variant against a reference
with a paired 95 % t interval: test accuracy with OOD, validation accuracy with OOD (what a choice
may be made on), the server's accuracy on each family's unseen classes, and accuracy without OOD.

    python benchmarks/harmony_variants.py --profile quick --seeds 0-7 --reference no-supcon \\
        --variant 'cross-family={}' --variant 'no-supcon={"contrastive_weight": 0}' \\
        --variant 'token={"contrastive": "token"}' --work-dir /tmp/variants \\
        --out benchmarks/results/supcon_variants

Runs are `harmony bench` runs (same settings, budget, one torch thread per job); with the same
--work-dir an interrupted call resumes, reusing every finished run of the same configuration; a
variant whose folder holds runs of another configuration is refused before any run (give it a new
name, or delete WORK_DIR/NAME).
"""

from __future__ import annotations

import argparse
import json
import shlex
import statistics
import sys
import time
from pathlib import Path

from harmony_mobile.bench.profile import BenchProfile, load_profile
from harmony_mobile.bench.runner import RunSpec, code_version, execute, machine_info
from harmony_mobile.bench.stats import paired_ci

METRICS = {
    "test_with_ood": ("test accuracy with OOD", lambda r: r["summary"]["accuracy_with_ood"]),
    "val_with_ood": ("validation accuracy with OOD", lambda r: r["validation"]["accuracy_with_ood"]),
    "unseen": ("server accuracy on each family's unseen classes", lambda r: r["unseen"]["family_mean"]),
    "test_without_ood": ("test accuracy without OOD", lambda r: r["summary"]["accuracy_without_ood"]),
}


def seed_list(text: str) -> list[int]:
    """'0-7' or '0,2,5'."""
    if "-" in text:
        first, last = (int(part) for part in text.split("-"))
        return list(range(first, last + 1))
    return [int(part) for part in text.split(",")]


def command_text() -> str:
    """This invocation as a shell command: the script named from the repository root, the arguments
    as given (so the work dir is the one this machine kept the runs in)."""
    return shlex.join(["python", "benchmarks/harmony_variants.py", *sys.argv[1:]])


def seed_text(seeds: list[int]) -> str:
    """'0-7' for a contiguous range, else the seeds listed ('100, 103, 104')."""
    if len(seeds) > 1 and seeds == list(range(seeds[0], seeds[-1] + 1)):
        return f"{seeds[0]}-{seeds[-1]}"
    return ", ".join(str(seed) for seed in seeds)


def parse_variant(text: str) -> tuple[str, dict]:
    name, _, overrides = text.partition("=")
    if not name or not overrides:
        raise argparse.ArgumentTypeError(f"--variant {text!r}: expected NAME=JSON")
    return name, json.loads(overrides)


def variant_specs(
    profile: BenchProfile, overrides: dict, seeds: list[int], setting: str | None = None
) -> list[RunSpec]:
    """HARMONY on one of the profile's settings (by name; default its first) at its budget there,
    its config with `overrides`, one run per seed."""
    chosen = profile.settings_named([setting])[0] if setting else profile.settings[0]
    config = {**profile.method_config("harmony", setting=chosen), **overrides}
    rounds = profile.method_budget("harmony", chosen).rounds
    return [RunSpec("eval", chosen, "harmony", seed, rounds, config) for seed in seeds]


# how diverse the simulated extractors were (algorithms/harmony.py), each summarized over the run's
# rounds and then over seeds: a round whose CE is already fit has a near-zero CE gradient and an
# exploding ratio, so the ratio by its median (per run over rounds, then over seeds; the benchmark
# report takes one median over all rounds of all seeds), the others by the mean
DIVERSITY = {
    "path_to_noise": statistics.mean,
    "variant_spread": statistics.mean,
    "contrastive_grad_ratio": statistics.median,
}


def round_summary(record: dict) -> dict[str, float]:
    """Each diversity measure over the run's rounds (the ratio's median, the others' mean)."""
    rows = record["round_metrics"]
    return {
        key: summarize([row[key] for row in rows if key in row])
        for key, summarize in DIVERSITY.items()
        if any(key in row for row in rows)
    }


def slim(record: dict) -> dict:
    """What the report needs from a run record (the full one stays in the work directory)."""
    keys = ("seed", "train_config", "wall_seconds", "cpu_seconds", "summary", "validation", "unseen")
    return {key: record[key] for key in keys} | {"round_summary": round_summary(record)}


def compare(records: dict[str, dict[int, dict]], reference: str) -> dict:
    """Per variant and metric: the mean over seeds and the paired difference to the reference."""
    table = {}
    for name, by_seed in records.items():
        row = {}
        for key, (_, value) in METRICS.items():
            row[key] = {"mean": sum(value(r) for r in by_seed.values()) / len(by_seed)}
            if name != reference:
                seeds = sorted(set(by_seed) & set(records[reference]))
                diffs = [value(by_seed[s]) - value(records[reference][s]) for s in seeds]
                row[key]["minus_reference"] = paired_ci(diffs)
        summaries = [round_summary(r) for r in by_seed.values()]
        for key in DIVERSITY:
            values = [m[key] for m in summaries if key in m]
            row[key] = {"summary": DIVERSITY[key](values) if values else None}
        table[name] = row
    return table


def markdown(args, variants: dict, table: dict, seconds: float, run_seconds: float) -> str:
    setting = f"`{args.setting}`" if args.setting else "the profile's first"
    lines = [
        f"# HARMONY variants over {len(args.seeds)} seeds (profile `{args.profile}`)",
        "",
        f"Made by `{command_text()}`.",
        "",
        f"Setting {setting}; seeds {seed_text(args.seeds)}; each variant overrides the profile's HARMONY config; "
        f"reference **{args.reference}**. Numbers in percent; differences paired by seed with a 95 % t "
        f"interval. {len(variants) * len(args.seeds)} runs, {run_seconds / 60:.1f} min of training summed over "
        f"them (1 torch thread each, {args.jobs} at a time), {seconds / 60:.1f} min wall in this call "
        "(runs reused from the work directory count as zero).",
        "",
        "| variant | overrides | "
        + " | ".join(title for title, _ in METRICS.values())
        + " | path / noise | variant spread | SupCon / CE gradient at z |",
        "|---|---|" + "---|" * (len(METRICS) + len(DIVERSITY)),
    ]
    for name, row in table.items():
        cells = []
        for key in METRICS:
            cell = f"{100 * row[key]['mean']:.1f}"
            d = row[key].get("minus_reference")
            if d:
                cell += f" ({100 * d['mean']:+.1f} [{100 * d['low']:+.1f}, {100 * d['high']:+.1f}])"
            cells.append(cell)
        cells += [
            f"{row[key]['summary']:.3f}" if row[key]["summary"] is not None else "-" for key in DIVERSITY
        ]
        lines.append(f"| {name} | `{json.dumps(variants[name])}` | " + " | ".join(cells) + " |")
    lines += [
        "",
        "In parentheses: variant minus reference, mean [95 % CI]. The last three columns summarize over "
        "rounds and seeds what each round measures (the gradient ratio by its median, a round whose CE "
        "is already fit has a near-zero CE gradient; the others by their mean): the personalization "
        "path's length over the "
        "weight noise drawn (how far the simulated extractors move along theta' - theta compared to "
        "their noise), how far a class's mean feature moves across the variants relative to the "
        "class's spread, and the weighted SupCon gradient at z over the CE's.",
    ]
    return "\n".join(lines) + "\n"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--profile", default="quick")
    parser.add_argument("--setting", help="one of the profile's settings by name (default: its first)")
    parser.add_argument("--seeds", type=seed_list, required=True)
    parser.add_argument("--variant", type=parse_variant, action="append", required=True)
    parser.add_argument("--reference", required=True, help="the variant every other is compared to")
    parser.add_argument("--jobs", type=int, default=2)
    parser.add_argument("--work-dir", type=Path, required=True)
    parser.add_argument("--out", type=Path, required=True)
    args = parser.parse_args()
    variants = dict(args.variant)
    if args.reference not in variants:
        parser.error(f"--reference {args.reference!r} is not one of the variants {sorted(variants)}")
    profile = load_profile(args.profile)
    started = time.perf_counter()
    records: dict[str, dict[int, dict]] = {}
    for name, overrides in variants.items():  # each variant's runs under WORK_DIR/NAME, resumable
        runs = execute(
            variant_specs(profile, overrides, args.seeds, args.setting),
            profile.train,
            args.work_dir / name,
            data_root=None,
            resume=True,
            jobs=args.jobs,
            log=print,
        )
        records[name] = dict(zip(args.seeds, runs, strict=True))
    seconds = time.perf_counter() - started
    table = compare(records, args.reference)
    args.out.mkdir(parents=True, exist_ok=True)
    results = {
        "profile": args.profile,
        "setting": args.setting,
        "seeds": args.seeds,
        "reference": args.reference,
        "variants": variants,
        "table": table,
        "code": code_version(),
        "machine": {**machine_info(), "jobs": args.jobs},
        "runs": {name: [slim(r) for r in by_seed.values()] for name, by_seed in records.items()},
    }
    (args.out / "results.json").write_text(json.dumps(results, indent=1))
    run_seconds = sum(r["wall_seconds"] for by_seed in records.values() for r in by_seed.values())
    (args.out / "report.md").write_text(markdown(args, variants, table, seconds, run_seconds))
    print((args.out / "report.md").read_text())


if __name__ == "__main__":
    main()
