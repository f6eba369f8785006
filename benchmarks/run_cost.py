"""What one benchmark run costs, side by side in two checkouts of this repository: each method of a
profile trains one evaluation run (one setting, one seed, the profile's budget) in both checkouts
at the same time, one torch thread each, so both see the same load on a 2-core machine. Reports
the wall and CPU seconds of every run, the ratio (this checkout / baseline) and whether the two
runs gave the same accuracies (a speed-up must not change what is measured).

    .venv/bin/python benchmarks/run_cost.py --baseline /path/to/other/checkout \\
        --out benchmarks/results/run_cost

Each checkout runs with its own `.venv/bin/python`, so its own code. Every worker loads the
dataset before the timed run: `harmony bench` workers are long-lived processes that load it once,
so a run's cost is training and evaluation; the one-off load is reported separately.
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parent.parent


def worker(args: argparse.Namespace) -> None:
    """In the checkout under test: load the dataset, then train and evaluate one run; print its record."""
    import torch

    from harmony_mobile.bench.profile import load_profile
    from harmony_mobile.bench.runner import RunSpec, run_one
    from harmony_mobile.data import load_dataset

    torch.set_num_threads(1)
    profile = load_profile(args.profile)
    setting = next(s for s in profile.settings if s.name == args.setting)
    started = time.perf_counter()
    load_dataset(setting.dataset, limit=setting.dataset_limit)
    load_seconds = time.perf_counter() - started
    try:
        budget = profile.method_budget(args.method, setting)
        config = profile.method_config(args.method, setting=setting)
    except TypeError:  # a baseline checkout from before a setting could give a method its own rounds
        budget, config = profile.method_budget(args.method), profile.method_config(args.method)
    spec = RunSpec("eval", setting, args.method, args.seed, budget.rounds, config)
    record = run_one(spec, profile.train, Path(args.work_dir))
    print(
        json.dumps(
            {
                "method": args.method,
                "load_seconds": load_seconds,
                "wall_seconds": record["wall_seconds"],
                "cpu_seconds": record["cpu_seconds"],
                "summary": record["summary"],
            }
        )
    )


def checkout_version(path: Path) -> str:
    def git(*args: str) -> str:
        return subprocess.run(["git", "-C", str(path), *args], capture_output=True, text=True).stdout.strip()

    dirty = " with uncommitted changes" if git("status", "--porcelain", "--untracked-files=no") else ""
    return git("rev-parse", "--short", "HEAD") + dirty


def run_in(checkout: Path, method: str, args: argparse.Namespace, work_dir: Path) -> dict:
    command = [
        str(checkout / ".venv/bin/python"),
        str(REPO_ROOT / "benchmarks/run_cost.py"),
        "--worker",
        f"--method={method}",
        f"--profile={args.profile}",
        f"--setting={args.setting}",
        f"--seed={args.seed}",
        f"--work-dir={work_dir}",
    ]
    done = subprocess.run(command, cwd=checkout, capture_output=True, text=True)
    if done.returncode != 0:
        raise SystemExit(f"{method} failed in {checkout}:\n{done.stderr[-3000:]}")
    return json.loads(done.stdout.strip().splitlines()[-1])


def measure(args: argparse.Namespace, methods: list[str]) -> list[dict]:
    """Per method: the baseline's run and this checkout's run, started together."""
    checkouts = {"baseline": Path(args.baseline).resolve(), "this": REPO_ROOT}
    rows = []
    with tempfile.TemporaryDirectory() as tmp, ThreadPoolExecutor(max_workers=2) as pool:
        for method in methods:
            futures = {
                name: pool.submit(run_in, path, method, args, Path(tmp) / name)
                for name, path in checkouts.items()
            }
            runs = {name: future.result() for name, future in futures.items()}
            rows.append({"method": method, **runs})
            print(
                f"{method}: {runs['baseline']['wall_seconds']:.0f} s -> {runs['this']['wall_seconds']:.0f} s"
            )
    return rows


def _same(a: dict, b: dict) -> bool:
    """Equal results, NaN included (NaN != NaN, but its JSON text is the same)."""
    return json.dumps(a, sort_keys=True) == json.dumps(b, sort_keys=True)


def render(rows: list[dict], args: argparse.Namespace, versions: dict[str, str]) -> str:
    lines = [
        "# Cost of one benchmark run, two checkouts side by side",
        "",
        f"Made by `benchmarks/run_cost.py`: profile `{args.profile}`, setting `{args.setting}`, seed {args.seed}, "
        "one evaluation run per method at the profile's budget; the baseline's and this checkout's run of a "
        "method trained at the same time (2 processes on 2 cores, 1 torch thread each, as `harmony bench "
        f"--jobs 2`). Baseline: `{versions['baseline']}`; this checkout: `{versions['this']}`.",
        "",
        "| method | baseline wall s | this wall s | this / baseline | baseline CPU s | this CPU s "
        "| same accuracies |",
        "|---|---|---|---|---|---|---|",
    ]
    for row in rows:
        old, new = row["baseline"], row["this"]
        same = "yes" if _same(old["summary"], new["summary"]) else "**no**"
        lines.append(
            f"| {row['method']} | {old['wall_seconds']:.1f} | {new['wall_seconds']:.1f} "
            f"| {new['wall_seconds'] / old['wall_seconds']:.2f} | {old['cpu_seconds']:.1f} "
            f"| {new['cpu_seconds']:.1f} | {same} |"
        )
    total = {name: sum(r[name]["wall_seconds"] for r in rows) for name in ("baseline", "this")}
    loads = {name: statistics.median(r[name]["load_seconds"] for r in rows) for name in ("baseline", "this")}
    lines += [
        "",
        f"All methods: {total['baseline']:.0f} s -> {total['this']:.0f} s of training runs "
        f"(this / baseline {total['this'] / total['baseline']:.2f}). Dataset load, once per worker process "
        f"(median over the workers): {loads['baseline']:.2f} s -> {loads['this']:.2f} s.",
        "",
    ]
    return "\n".join(lines)


def checked_methods(profile_name: str, setting: str, methods: str | None) -> list[str]:
    """The methods to measure (comma-separated, or every method of the profile); a ValueError naming
    an unknown setting or method."""
    from harmony_mobile.algorithms.registry import check_algorithm
    from harmony_mobile.bench.profile import load_profile

    profile = load_profile(profile_name)
    profile.settings_named([setting])
    named = [m.strip() for m in methods.split(",")] if methods else list(profile.methods)
    for method in named:
        check_algorithm(method)
    return named


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--baseline", help="another checkout of this repository, with its own .venv")
    parser.add_argument("--profile", default="standard")
    parser.add_argument("--setting", default="mnist5k-family")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--methods", help="comma-separated (default: every method of the profile)")
    parser.add_argument("--out", type=Path, default=REPO_ROOT / "benchmarks/results/run_cost")
    parser.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--method", help=argparse.SUPPRESS)
    parser.add_argument("--work-dir", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.worker:
        return worker(args)
    if not args.baseline:
        parser.error("--baseline CHECKOUT is required")
    if not (Path(args.baseline) / ".venv/bin/python").is_file():
        parser.error(f"{args.baseline} has no .venv/bin/python (run `make .venv/.installed` there)")
    try:  # checked here, not in the workers: the baseline checkout's code may predate these checks
        methods = checked_methods(args.profile, args.setting, args.methods)
    except (FileNotFoundError, ValueError) as error:
        parser.error(str(error))
    versions = {"baseline": checkout_version(Path(args.baseline)), "this": checkout_version(REPO_ROOT)}
    rows = measure(args, methods)
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "report.md").write_text(render(rows, args, versions))
    (args.out / "results.json").write_text(json.dumps({"versions": versions, "runs": rows}, indent=1))
    print(f"wrote {args.out / 'report.md'}")


if __name__ == "__main__":
    sys.exit(main())
