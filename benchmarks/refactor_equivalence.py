"""Did a series of refactoring commits keep training numbers? Trains the same configurations with the
same seeds and the same federation lineage at three commits and compares the run dirs byte for byte:

  * BASE vs HEAD for `fedavg` and `local`: no commit in between is meant to move them;
  * SPLIT vs HEAD for `harmony` and `splitgp`: SPLIT is the last commit meant to move split methods'
    numbers (their clients of a round run in lockstep), so nothing after it may;
  * BASE vs HEAD for `harmony`, for information only: how far the intended changes in between
    (meta-adaptation off by default, lockstep rounds) moved the numbers.

Each commit is checked out with `git worktree add` in a temporary folder and run with this Python
(the repo's venv) importing that worktree's code: the venv's editable-install finder is taken off
`sys.meta_path` and `harmony_mobile`, `harmony_mobile.export` and `harmony_mobile.server` are mapped
onto the worktree's folders; every run records the imported harmony_mobile modules that came from
anywhere else (there must be none). A run is `harmony train` (the CLI, in-process engine, one torch
thread); the first run of a method draws a lineage, every other run of that method takes it with
`--lineage-from`, so partition and label tokens are the same.

Compared per pair: metrics.jsonl (bytes), final_metrics.json (bytes apart from `train_seconds`, the
wall time) and every tensor of backend.pt and clients/*.pt. Writes
benchmarks/results/refactor_equivalence.md.

    .venv/bin/python benchmarks/refactor_equivalence.py BASE SPLIT HEAD [--seeds 1] [--jobs 2]

A difference where none is expected is bisected by running the script again on a narrower pair
(e.g. `... BASE BASE MID --methods fedavg`: pairs whose two commits are equal are left out).
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import shutil
import subprocess
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
REPORT = REPO / "benchmarks" / "results" / "refactor_equivalence.md"
WALL_TIME_KEYS = ("train_seconds",)
ROLES = ("base", "split", "head")
HEADLINE = ("accuracy_without_ood", "accuracy_with_ood", "exit_only_accuracy_with_ood")

# Runs `harmony train` from the worktree named by REQV_WORKTREE, not from the editable install.
BOOT = """
import importlib.util, json, os, sys
WT = os.environ["REQV_WORKTREE"]
sys.meta_path[:] = [f for f in sys.meta_path if "editable" not in getattr(f, "__module__", "")]
MAP = {"harmony_mobile": WT + "/harmony_mobile", "harmony_mobile.export": WT + "/export",
       "harmony_mobile.server": WT + "/server"}
class WorktreeFinder:
    @classmethod
    def find_spec(cls, name, path=None, target=None):
        if name in MAP:
            return importlib.util.spec_from_file_location(
                name, MAP[name] + "/__init__.py", submodule_search_locations=[MAP[name]])
        return None
sys.meta_path.insert(0, WorktreeFinder)
import torch
torch.set_num_threads(1)
from harmony_mobile.cli import app
try:
    app(sys.argv[2:], standalone_mode=False)
finally:
    files = [m.__file__ for n, m in list(sys.modules.items())
             if n.startswith("harmony_mobile") and getattr(m, "__file__", None)]
    outside = [f for f in files if not f.startswith(WT + "/")]
    with open(sys.argv[1], "w") as out:
        json.dump({"modules": len(files), "outside_worktree": outside}, out)
"""


@dataclass(frozen=True)
class Run:
    commit: str
    algorithm: str
    seed: int

    @property
    def name(self) -> str:
        return f"{self.algorithm}-s{self.seed}-{self.commit[:9]}"


@dataclass(frozen=True)
class Pair:
    a: Run
    b: Run
    expected_identical: bool
    why: str


def git(*args: str) -> str:
    return subprocess.run(["git", "-C", str(REPO), *args], check=True, capture_output=True, text=True).stdout


def pairs_for(base: str, split: str, head: str, methods: list[str], seeds: list[int]) -> list[Pair]:
    plan = [
        ("fedavg", base, head, True, "no commit in between is meant to change fedavg"),
        ("local", base, head, True, "no commit in between is meant to change local"),
        ("harmony", split, head, True, "split methods' last intended change is SPLIT"),
        ("splitgp", split, head, True, "split methods' last intended change is SPLIT"),
        ("harmony", base, head, False, "information: meta off by default + lockstep rounds in between"),
    ]
    return [
        Pair(Run(a, method, seed), Run(b, method, seed), same, why)
        for method, a, b, same, why in plan
        for seed in seeds
        if method in methods and a != b
    ]


def train(run: Run, worktree: Path, work: Path, config: Path, lineage: Path | None) -> dict:
    run_dir = work / "runs" / run.name
    log = work / "logs" / f"{run.name}.log"
    probe = work / "logs" / f"{run.name}.imports.json"
    command = [sys.executable, str(work / "boot.py"), str(probe), "train", str(run_dir)]
    command += ["--config", str(config), "--algorithm", run.algorithm, "--seed", str(run.seed)]
    if lineage is not None:
        command += ["--lineage-from", str(lineage)]
    env = dict(os.environ, REQV_WORKTREE=str(worktree), OMP_NUM_THREADS="1", MKL_NUM_THREADS="1")
    env.pop("PYTHONPATH", None)
    started = time.monotonic()
    with open(log, "w") as out:
        done = subprocess.run(command, env=env, stdout=out, stderr=subprocess.STDOUT, cwd=work)
    if done.returncode != 0:
        raise RuntimeError(f"{run.name} failed ({done.returncode}); see {log}")
    imports = json.loads(probe.read_text())
    if imports["outside_worktree"]:
        raise RuntimeError(f"{run.name} imported code outside {worktree}: {imports['outside_worktree']}")
    print(f"  {run.name}: {time.monotonic() - started:.0f} s", flush=True)
    return {"dir": run_dir, "modules": imports["modules"]}


def tensors(path: Path) -> dict:
    import torch

    found: dict = {}

    def walk(value, key: str) -> None:
        if isinstance(value, torch.Tensor):
            found[key] = value
        elif isinstance(value, dict):
            for k, v in value.items():
                walk(v, f"{key}.{k}")
        elif isinstance(value, (list, tuple)):
            for i, v in enumerate(value):
                walk(v, f"{key}[{i}]")

    walk(torch.load(path, map_location="cpu", weights_only=False), path.name)
    return found


def weights_identical(a: Path, b: Path) -> str:
    import torch

    files = ["backend.pt"] + sorted(f"clients/{p.name}" for p in (a / "clients").glob("*.pt"))
    for name in files:
        if not (b / name).is_file():
            return f"no {name} in b"
        ta, tb = tensors(a / name), tensors(b / name)
        if ta.keys() != tb.keys():
            return f"{name}: tensor names differ"
        for key in ta:
            if ta[key].shape != tb[key].shape or not torch.equal(ta[key], tb[key]):
                return f"differ ({key})"
    return f"identical ({len(files)} files)"


def final_metrics(run_dir: Path) -> dict:
    # NaN stays NaN: json reads and writes it the same way on both sides
    return json.loads((run_dir / "final_metrics.json").read_text())


def without_wall_time(metrics: dict) -> str:
    return json.dumps({k: v for k, v in metrics.items() if k not in WALL_TIME_KEYS}, sort_keys=True)


def first_difference(a: Path, b: Path) -> str:
    la, lb = a.read_text().splitlines(), b.read_text().splitlines()
    for i, (x, y) in enumerate(zip(la, lb, strict=False)):
        if x != y:
            return f"line {i + 1}"
    return f"{len(la)} vs {len(lb)} lines"


def compare(pair: Pair, dirs: dict[Run, Path]) -> dict:
    a, b = dirs[pair.a], dirs[pair.b]
    jsonl_same = (a / "metrics.jsonl").read_bytes() == (b / "metrics.jsonl").read_bytes()
    fa, fb = final_metrics(a), final_metrics(b)
    return {
        "metrics_jsonl": "identical"
        if jsonl_same
        else "differ at " + first_difference(a / "metrics.jsonl", b / "metrics.jsonl"),
        "final_metrics": "identical" if without_wall_time(fa) == without_wall_time(fb) else "differ",
        "weights": weights_identical(a, b),
        "headline": {key: (fa["summary"].get(key), fb["summary"].get(key)) for key in HEADLINE},
        "train_seconds": (fa.get("train_seconds"), fb.get("train_seconds")),
        "rounds_logged": len((a / "metrics.jsonl").read_text().splitlines()),
    }


def subject(commit: str) -> str:
    return git("log", "-1", "--format=%s", commit).strip()[:110]


def fmt(value) -> str:
    return "-" if value is None else f"{value:.6f}" if isinstance(value, float) else str(value)


def report_header(args, commits, config_text, load, started, elapsed) -> list[str]:
    lines = [
        "# Refactor equivalence: same seeds, same lineage, before and after",
        "",
        f"Measured {started} on {platform.node()} ({os.cpu_count()} CPUs), load average at the start "
        f"{load[0]:.2f} / {load[1]:.2f} / {load[2]:.2f} (1/5/15 min); {elapsed / 60:.1f} min in all, "
        f"runs {args.jobs} at a time. Python {platform.python_version()}, one torch thread per run.",
        "",
        "Reproduce:",
        "",
        "    .venv/bin/python benchmarks/refactor_equivalence.py "
        + " ".join(commits[k][:7] for k in ("base", "split", "head"))
        + f" --seeds {' '.join(map(str, args.seeds))} --methods {' '.join(args.methods)}"
        + f" --dataset {args.dataset} --dataset-limit {args.dataset_limit}"
        + f" --clients-per-tier {args.clients_per_tier} --rounds {args.rounds} --jobs {args.jobs}",
        "",
        "## Commits",
        "",
        "| role | commit | subject |",
        "|---|---|---|",
    ]
    labels = {
        "base": "BASE (refactors start)",
        "split": "SPLIT (lockstep split rounds)",
        "head": "HEAD",
    }
    for key, label in labels.items():
        lines.append(f"| {label} | `{commits[key]}` | {subject(commits[key])} |")
    lines += [
        "",
        "Each commit runs from its own `git worktree` with the repo's venv; the editable install's finder "
        "is removed so `harmony_mobile` (and its `export`, `server` packages) import from the worktree "
        "(checked per run: no harmony_mobile module came from elsewhere).",
        "",
        "## Configuration",
        "",
        "`harmony train RUN --config cfg.yaml --algorithm METHOD --seed SEED` (in-process engine), with "
        "cfg.yaml:",
        "",
        "```yaml",
        config_text.rstrip(),
        "```",
        "",
        "The first run of a method draws the federation secret and label epoch; all other runs of that "
        "method take them with `--lineage-from` (same partition, same label tokens).",
        "",
        "## Pairs",
        "",
        "`final_metrics.json` is compared as parsed JSON without `train_seconds` (wall time); "
        "`metrics.jsonl` byte for byte; weights are every tensor of backend.pt and clients/*.pt "
        "(`torch.equal`).",
        "",
        "| method | seed | a | b | why this pair | expected | metrics.jsonl | final_metrics.json | weights "
        "| verdict |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    return lines


def pair_rows(pairs, results) -> list[str]:
    lines = []
    for pair, res in zip(pairs, results, strict=True):
        same = res["metrics_jsonl"] == "identical" and res["final_metrics"] == "identical"
        same = same and res["weights"].startswith("identical")
        if pair.expected_identical:
            verdict = "**bit-identical, as expected**" if same else "**UNEXPECTED DIFFERENCE**"
        else:
            verdict = "identical (change expected)" if same else "differs (intended change)"
        lines.append(
            f"| {pair.a.algorithm} | {pair.a.seed} | `{pair.a.commit[:7]}` | `{pair.b.commit[:7]}` | {pair.why} | "
            f"{'identical' if pair.expected_identical else 'may differ'} | {res['metrics_jsonl']} | "
            f"{res['final_metrics']} | {res['weights']} | {verdict} |"
        )
    return lines


def headline_rows(pairs, results) -> list[str]:
    lines: list[str] = []
    lines += [
        "",
        "## Headline numbers side by side (final_metrics.json summary; a / b)",
        "",
        "| method | seed | a -> b | " + " | ".join(HEADLINE) + " | train_seconds |",
        "|---|---|---|" + "---|" * (len(HEADLINE) + 1),
    ]
    for pair, res in zip(pairs, results, strict=True):
        cells = [f"{fmt(x)} / {fmt(y)}" for x, y in res["headline"].values()]
        ta, tb = res["train_seconds"]
        lines.append(
            f"| {pair.a.algorithm} | {pair.a.seed} | `{pair.a.commit[:7]}` -> `{pair.b.commit[:7]}` | "
            + " | ".join(cells)
            + f" | {fmt(ta)} / {fmt(tb)} |"
        )

    return lines


def write_equivalence_report(
    args, commits, config_text, load, pairs, results, started, elapsed, out: Path
) -> None:
    lines = report_header(args, commits, config_text, load, started, elapsed)
    lines += pair_rows(pairs, results) + headline_rows(pairs, results) + [""]
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text("\n".join(lines))


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    parser.add_argument("base", help="commit where the refactors start")
    parser.add_argument("split", help="last commit meant to change split methods' numbers")
    parser.add_argument("head", help="commit after the refactors")
    parser.add_argument("--seeds", type=int, nargs="+", default=[1])
    parser.add_argument("--methods", nargs="+", default=["fedavg", "local", "harmony", "splitgp"])
    parser.add_argument("--dataset", default="digits")
    parser.add_argument("--dataset-limit", type=int, default=900)
    parser.add_argument("--clients-per-tier", type=int, default=2)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--jobs", type=int, default=2, help="runs at a time")
    parser.add_argument("--out", type=Path, default=REPORT)
    parser.add_argument("--keep", action="store_true", help="keep the worktrees, run dirs and logs")
    return parser.parse_args()


def train_all(pairs: list[Pair], worktrees: dict[str, Path], work: Path, config: Path, jobs: int) -> dict:
    """Every run of the pairs, `jobs` at a time; the first run of a (method, seed) draws the
    lineage and the others share it. Returns each run's folder."""
    runs = list(dict.fromkeys(r for p in pairs for r in (p.a, p.b)))
    sources: dict[tuple[str, int], Run] = {}
    for run in runs:
        sources.setdefault((run.algorithm, run.seed), run)
    dirs: dict[Run, Path] = {}
    with ThreadPoolExecutor(jobs) as pool:
        firsts = list(sources.values())

        def first(r: Run) -> dict:
            return train(r, worktrees[r.commit], work, config, None)

        for run, res in zip(firsts, pool.map(first, firsts), strict=True):
            dirs[run] = res["dir"]
        rest = [r for r in runs if r not in dirs]

        def follow(r: Run) -> dict:
            return train(r, worktrees[r.commit], work, config, dirs[sources[(r.algorithm, r.seed)]])

        for run, res in zip(rest, pool.map(follow, rest), strict=True):
            dirs[run] = res["dir"]
    return dirs


def main() -> None:
    args = parse_args()

    load = os.getloadavg()
    started = time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime())
    t0 = time.monotonic()
    commits = {k: git("rev-parse", "--verify", getattr(args, k) + "^{commit}").strip() for k in ROLES}
    pairs = pairs_for(commits["base"], commits["split"], commits["head"], args.methods, args.seeds)
    if not pairs:
        sys.exit("no pair to compare")
    work = Path(tempfile.mkdtemp(prefix="refactor-equivalence-"))
    (work / "logs").mkdir()
    (work / "runs").mkdir()
    (work / "boot.py").write_text(BOOT)
    config_text = (
        f"dataset: {args.dataset}\ndataset_limit: {args.dataset_limit}\n"
        f"clients_per_tier: {args.clients_per_tier}\nrounds: {args.rounds}\nthreads: 1\n"
    )
    config = work / "cfg.yaml"
    config.write_text(config_text)
    worktrees: dict[str, Path] = {}
    print(f"work dir {work}, load {load[0]:.2f}", flush=True)
    try:
        for commit in sorted({r.commit for p in pairs for r in (p.a, p.b)}):
            worktrees[commit] = work / f"wt-{commit[:9]}"
            git("worktree", "add", "--detach", str(worktrees[commit]), commit)
        dirs = train_all(pairs, worktrees, work, config, args.jobs)
        results = [compare(p, dirs) for p in pairs]
        write_equivalence_report(
            args, commits, config_text, load, pairs, results, started, time.monotonic() - t0, args.out
        )
        for pair, res in zip(pairs, results, strict=True):
            print(pair.a.name, "vs", pair.b.name, res["metrics_jsonl"], res["final_metrics"], res["weights"])
        print(f"wrote {args.out}")
    finally:
        if not args.keep:
            for path in worktrees.values():
                subprocess.run(
                    ["git", "-C", str(REPO), "worktree", "remove", "--force", str(path)], check=False
                )
            shutil.rmtree(work, ignore_errors=True)
        else:
            print(f"kept {work}")


if __name__ == "__main__":
    main()
