"""Evaluation-only study of the exit gate over finished runs: each run's accuracy-vs-fallback curve
for every gate score (harmony_mobile/bench/gates.py), on validation and on test; beside it the
run's validation accuracy with and without OOD at its calibrated thresholds and the back-end's
accuracy on each family's unseen classes (what the benchmark records for its runs).

    python benchmarks/gate_study.py RUN_DIR [RUN_DIR ...] [--out FILE.json]
    python benchmarks/gate_study.py --runs-under WORK/eval --report DIR --jobs 2

With `--runs-under`, every split run of a benchmark work folder (<setting>/<method>/seed-<n>) is
studied and `--report` writes DIR/report.md and DIR/study.json: each method's curve by the score
it exits by and by every method gated alike by each score, with paired differences by seed.
Nothing is retrained; the runs' files must still be on disk (they are not committed).
"""

from __future__ import annotations

import argparse
import json
import multiprocessing
import time
from pathlib import Path

import torch

from harmony_mobile.algorithms.registry import build_algorithm
from harmony_mobile.bench.gate_report import curve_rows, gate_score_table, study_rows
from harmony_mobile.bench.gates import FALLBACK_GRID, gate_studies
from harmony_mobile.bench.hooks import unseen_class_accuracy, validation_metrics
from harmony_mobile.bench.saved_runs import load_finished_run
from harmony_mobile.evaluation import client_answers
from harmony_mobile.run_dir import RunDir


def study_run(path: Path) -> dict:
    run = load_finished_run(path)
    answers = client_answers(run.clients, run.served, run.images)
    args = (answers, run.labels, run.partition, run.seed)
    validation = validation_metrics(*args, run.exit_rule)
    unseen = unseen_class_accuracy(*args)
    return {
        "val_accuracy_with_ood": validation["accuracy_with_ood"],
        "val_accuracy_without_ood": validation["accuracy_without_ood"],
        "unseen_family": unseen["family_mean"],
        **gate_studies(answers, run.served, run.labels, run.partition, run.seed, run.exit_rule, run.replay),
    }


def print_table(name: str, study: dict) -> None:
    shown = [i for i, r in enumerate(FALLBACK_GRID) if r in (0.0, 0.1, 0.2, 0.3, 0.5, 1.0)]
    print(
        f"{name}: validation accuracy with OOD {study['val_accuracy_with_ood']:.3f}, without "
        f"{study['val_accuracy_without_ood']:.3f}; back-end on unseen classes {study['unseen_family']:.3f}"
    )
    for on in ("val", "test"):
        for p, row in study[on].items():
            if not p.startswith("p="):
                continue
            print(f"{name} {on} {p}: oracle {row['oracle']:.3f} server-only {row['server_only']:.3f}")
            for gate, curve in row["curve"].items():
                points = " ".join(f"{FALLBACK_GRID[i]:.1f}:{curve[i]:.3f}" for i in shown)
                print(f"  {gate:12s} auroc {row['auroc'][gate]:.3f}  {points}")


def split_runs_under(root: Path, method: str = "*") -> list[Path]:
    """The finished runs of split methods (of `method` only, if named) in a work folder laid out
    <setting>/<method>/seed-<n>."""
    found = []
    for path in sorted(root.glob(f"*/{method}/seed-*")):
        if not (path / "final_metrics.json").is_file():
            continue  # unfinished (training writes it last), or a training twin's record alone
        config = RunDir(path).info.train_config
        if build_algorithm(config["algorithm"], config.get("algorithm_config")).uses_split:
            found.append(path)
    return found


def _studied(path: Path) -> dict:
    return {
        "setting": path.parent.parent.name,
        "method": path.parent.name,
        "seed": int(path.name.removeprefix("seed-")),
        "gates": study_run(path),
    }


def study_all(paths: list[Path], jobs: int) -> list[dict]:
    if jobs == 1:
        return [_studied(path) for path in paths]
    with multiprocessing.get_context("spawn").Pool(jobs, torch.set_num_threads, (1,)) as pool:
        return pool.map(_studied, paths)


def gated_alike(records: list[dict], rule: str) -> list[dict]:
    """The records as if every method exited by `rule` (records without that score are left out)."""
    alike = []
    for record in records:
        rows = [r for k, r in record["gates"]["test"].items() if k.startswith("p=")]
        if rows and all(rule in row["curve"] for row in rows):
            alike.append({**record, "gates": {**record["gates"], "exit_rule": rule}})
    return alike


def write_report(records: list[dict], out_dir: Path, seconds: float) -> None:
    out_dir.mkdir(parents=True, exist_ok=True)
    (out_dir / "study.json").write_text(json.dumps(records, indent=1) + "\n")
    methods = list(dict.fromkeys(r["method"] for r in records))
    lines = [
        "# Exit gate study over finished benchmark runs",
        "",
        f"`python benchmarks/gate_study.py --runs-under ... --report ...` over {len(records)} runs "
        f"({seconds / 60:.0f} CPU-minutes, evaluation only: nothing retrained); each run's own gate is "
        "the score its method exits by. Test curves are the mean of OOD fractions 0.2 and 0.5.",
        "",
    ]
    for setting in dict.fromkeys(r["setting"] for r in records):
        mine = {"runs": [r for r in records if r["setting"] == setting]}
        lines += [f"## {setting}", "", "### Each method by its own gate", ""]
        lines += curve_rows(mine, setting, methods)
        rules = list(next(row for r in mine["runs"] for row in study_rows(r, "test"))["curve"])
        for rule in rules:
            lines += [f"### Every method gated by `{rule}`", ""]
            lines += curve_rows({"runs": gated_alike(mine["runs"], rule)}, setting, methods)
        for method in methods:
            lines += gate_score_table(mine, setting, method)
    (out_dir / "report.md").write_text("\n".join(lines) + "\n")


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("runs", nargs="*", type=Path)
    parser.add_argument("--out", type=Path)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--runs-under", type=Path, help="a benchmark work folder's eval (or tune) folder")
    parser.add_argument("--report", type=Path, help="folder for report.md and study.json (with --runs-under)")
    parser.add_argument(
        "--jobs", type=int, default=1, help="runs studied at once, 1 thread each (with --runs-under)"
    )
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    if args.runs_under is not None:
        if args.report is None:
            parser.error("--runs-under needs --report")
        paths = split_runs_under(args.runs_under)
        if not paths:
            parser.error(f"no finished split run under {args.runs_under}")
        started = time.process_time() + _children_cpu_seconds()
        records = study_all(paths, args.jobs)
        # with --jobs > 1 the work is in reaped worker processes, whose CPU counts as children's
        seconds = time.process_time() + _children_cpu_seconds() - started
        write_report(records, args.report, seconds)
        return
    studies = {}
    for path in args.runs:
        studies[str(path)] = study_run(path)
        print_table(str(path), studies[str(path)])
    if args.out:
        args.out.write_text(json.dumps(studies, indent=1))


def _children_cpu_seconds() -> float:
    import resource

    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


if __name__ == "__main__":
    main()
