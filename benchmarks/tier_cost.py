"""Where a HARMONY benchmark run's CPU time goes, by device tier: the clients' local steps, their
final personalization and the server's split steps on their uploads, each timed on its own thread's
CPU clock during one short run of a profile's setting (one torch thread).

    .venv/bin/python benchmarks/tier_cost.py                    # fashion, family split, 6 rounds
    .venv/bin/python benchmarks/tier_cost.py --rounds 3 --out /tmp/tier_cost

Writes benchmarks/results/tier_cost.md and .json. What it is for: the recurring profile's time goal;
a run's cost grows with the rounds (local and server steps) plus a fixed part (personalization,
evaluation), and this says which tiers carry it.
"""

from __future__ import annotations

import argparse
import collections
import json
import platform
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

import torch

from harmony_mobile import training
from harmony_mobile.algorithms.harmony import Harmony
from harmony_mobile.bench.profile import load_profile
from harmony_mobile.bench.runner import RunSpec, train_config
from harmony_mobile.federation.split_trainer import SplitTrainer

RESULTS = Path(__file__).parent / "results"


def timed(costs: dict, key: Callable, method: Callable) -> Callable:
    """`method` wrapped to add its thread's CPU time to costs[key(args)] (the client's turn and the
    server's step run on different threads; each clock counts its own)."""

    def wrapper(self, *args, **kwargs):
        started = time.thread_time()
        try:
            return method(self, *args, **kwargs)
        finally:
            where = key(*args, **kwargs)
            if where is not None:
                costs[where] += time.thread_time() - started

    return wrapper


def measure(profile_name: str, setting_name: str, rounds: int, seed: int) -> dict:
    profile = load_profile(profile_name)
    setting = next(s for s in profile.settings if s.name == setting_name)
    spec = RunSpec(
        "eval",
        setting,
        "harmony",
        seed,
        rounds,
        profile.method_config("harmony", rounds=rounds, setting=setting),
    )
    config = train_config(spec, profile.train, None)
    costs: dict[tuple[str, str], float] = collections.defaultdict(float)
    patches = {
        (Harmony, "client_round"): lambda client, *_, **__: ("local steps", client.tier.name),
        (Harmony, "personalize"): lambda client, *_, **__: ("personalization", client.tier.name),
        # a step against the frozen server (update=False) is the personalization's, on its thread
        (SplitTrainer, "step"): lambda upload, update=True: ("server steps", upload.tier) if update else None,
    }
    originals = {target: getattr(*target) for target in patches}
    for (cls, name), key in patches.items():
        setattr(cls, name, timed(costs, key, originals[(cls, name)]))
    try:
        with tempfile.TemporaryDirectory() as run_dir:
            started = time.process_time()
            training.train(config, Path(run_dir) / "run", show_progress=False)
            total = time.process_time() - started
    finally:
        for (cls, name), method in originals.items():
            setattr(cls, name, method)
    tiers = {
        t.name: {"family": t.family, "width": t.width, "split_depth": t.split_depth}
        for t in training.check_config(config).tiers
    }
    return {
        "profile": profile_name,
        "setting": setting_name,
        "rounds": rounds,
        "seed": seed,
        "clients_per_tier": config.clients_per_tier,
        "tiers": tiers,
        "cpu_seconds": {f"{part}|{tier}": round(s, 2) for (part, tier), s in sorted(costs.items())},
        "total_cpu_seconds": round(total, 2),
        "machine": {"platform": platform.platform(), "torch": torch.__version__, "torch_threads": 1},
    }


def render(report: dict) -> str:
    parts = ("local steps", "server steps", "personalization")
    costs = report["cpu_seconds"]
    lines = [
        "# A HARMONY run's CPU time by device tier\n",
        f"Made by `benchmarks/tier_cost.py`: profile `{report['profile']}`, setting `{report['setting']}`, "
        f"seed {report['seed']}, {report['rounds']} rounds, {report['clients_per_tier']} clients per tier, "
        f"one torch thread, {report['machine']['platform']}, torch {report['machine']['torch']}. "
        "CPU seconds summed over a tier's clients; local and server steps grow with the rounds, "
        "personalization (with its steps against the frozen server) is paid once.\n",
        "| tier | family, width, depth | " + " | ".join(parts) + " | share of the run |",
        "|---|---|" + "---|" * (len(parts) + 1),
    ]
    for tier, info in report["tiers"].items():
        row = [costs.get(f"{part}|{tier}", 0.0) for part in parts]
        share = sum(row) / report["total_cpu_seconds"]
        shape = f"{info['family']} {info['width']:g}, {info['split_depth']}"
        lines.append(f"| {tier} | {shape} | " + " | ".join(f"{v:.1f}" for v in row) + f" | {share:.0%} |")
    accounted = sum(costs.values())
    lines.append(
        f"\nWhole run: {report['total_cpu_seconds']:.1f} CPU-s; the rest ({report['total_cpu_seconds'] - accounted:.1f} s) "
        "is setup, aggregation, evaluation and the thread hand-offs.\n"
    )
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--profile", default="fashion")
    parser.add_argument("--setting", default="fashion-family")
    parser.add_argument("--rounds", type=int, default=6)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--out", type=Path, default=RESULTS / "tier_cost")
    args = parser.parse_args(argv)
    torch.set_num_threads(1)
    report = measure(args.profile, args.setting, args.rounds, args.seed)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.with_suffix(".json").write_text(json.dumps(report, indent=1) + "\n")
    text = render(report)
    args.out.with_suffix(".md").write_text(text)
    print(text)


if __name__ == "__main__":
    main()
