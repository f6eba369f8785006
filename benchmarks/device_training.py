"""On-device personalization through ExecuTorch's training runtime vs eager PyTorch, per built-in tier.

For each tier of a finished run (default: trains a small one on the digits data, one client per
built-in tier of harmony_mobile/models/default_tiers.yaml) it builds the tier's personalization
programs exactly as `harmony export` does (export/personalization.py) and, in one process:

  * speed: SGD steps of the shipped scope (the exit classifier) through the training .pte
    (TrainingModule + SGD) and the same steps in eager PyTorch, timed in alternating turns (median
    steps/s), with torch and the ExecuTorch threadpool at `--threads`; target: the .pte within 3x
    of eager. The larger scopes a phone could train (the exit head with its conv; plus the last
    stage) are timed the same way for a few steps, to show why they do not ship.
  * accuracy: `--steps` steps from the shipped parameters on the client's own training samples
    (labels as exit positions), same rows and seed in both; top-1 exit accuracy on the client's
    test split before and after, through the head program (.pte) and the eager classifier.

    .venv/bin/python benchmarks/device_training.py                  # trains benchmarks' small run
    .venv/bin/python benchmarks/device_training.py --run RUN_DIR --steps 200

Writes benchmarks/results/device_training.md and .json.
"""

from __future__ import annotations

import argparse
import json
import platform
import statistics
import tempfile
import time
import warnings
from pathlib import Path

import numpy as np
import torch
from harmony_mobile.export import personalization as programs
from harmony_mobile.export.steps import set_threads

from harmony_mobile.device.personalization import TrainingProgram, batch_indices
from harmony_mobile.run_dir import RunDir

RESULTS = Path(__file__).parent / "results"
TARGET_RATIO = 3.0  # a .pte step may take at most 3x an eager step


def train_small_run(path: Path, rounds: int, seed: int) -> RunDir:
    from harmony_mobile.training import TrainConfig, train

    config = TrainConfig(dataset="digits", clients_per_tier=1, rounds=rounds, seed=seed, threads=1)
    train(config, path, show_progress=False)
    return RunDir(path)


def tier_data(run: RunDir, tier: str, dataset) -> dict:
    client = run.representative_client(tier)
    labels = torch.as_tensor(dataset.labels)
    exits = run.exit_labels(labels)  # the client's labels as exit positions (token order)
    return {
        "client": client,
        "train": (dataset.images[client.train_idx], exits[client.train_idx]),
        "test": (dataset.images[client.test_idx], exits[client.test_idx]),
    }


class EagerSteps:
    def __init__(self, part: torch.nn.Module, lr: float):
        self.part = part
        self.optimizer = torch.optim.SGD(part.parameters(), lr=lr)

    def step(self, inputs: torch.Tensor, labels: torch.Tensor) -> float:
        loss, _ = self.part(inputs, labels)
        self.optimizer.zero_grad()
        loss.backward()
        self.optimizer.step()
        return loss.item()


def pte_trainer(front_end, scope: str, inputs: torch.Tensor, num_classes: int, lr: float) -> TrainingProgram:
    buffer = programs.training_program(programs.TrainedPart(front_end, scope), inputs, num_classes)
    names = [f"p{i}" for i in range(len(list(programs.TrainedPart(front_end, scope).parameters())))]
    entry = {
        "method": programs.TRAINING_METHOD,
        "batch": len(inputs),
        "learning_rate": lr,
        "parameter_names": names,
    }
    return TrainingProgram(buffer, entry)


def timed_turns(trainers: dict, inputs, labels, indices, turns: int) -> dict[str, float]:
    """Median steps/s of each trainer, run in alternating turns over the same rows."""
    rates: dict[str, list[float]] = {name: [] for name in trainers}
    per_turn = len(indices) // turns
    for turn in range(turns):
        rows = indices[turn * per_turn : (turn + 1) * per_turn]
        for name, trainer in trainers.items():
            started = time.perf_counter()
            for r in rows:
                trainer.step(inputs[r], labels[r])
            rates[name].append(len(rows) / (time.perf_counter() - started))
    return {name: statistics.median(values) for name, values in rates.items()}


def scope_speed(
    front_end, scope: str, data: dict, num_classes: int, steps: int, turns: int, lr: float
) -> dict:
    images, labels = data["train"]
    inputs = programs.trained_part_inputs(front_end, scope, images)
    batch = programs.TRAIN_BATCH
    indices = torch.as_tensor(batch_indices(len(inputs), batch, steps, seed=1))
    trainers = {
        "pte": pte_trainer(front_end, scope, inputs[indices[0]], num_classes, lr),
        "eager": EagerSteps(programs.TrainedPart(front_end, scope), lr),
    }
    rates = timed_turns(trainers, inputs, labels, indices, turns)
    return {
        "scope": scope,
        "steps": steps,
        "pte_steps_per_s": rates["pte"],
        "eager_steps_per_s": rates["eager"],
        "pte_time_over_eager": rates["eager"] / rates["pte"],
        "trained_parameters": sum(p.numel() for p in programs.TrainedPart(front_end, scope).parameters()),
    }


def accuracy_after_steps(front_end, data: dict, build, steps: int, seed: int, lr: float) -> dict:
    """Same rows, same seed, same start: the .pte path (train program + head program) vs eager."""
    from harmony_mobile.device.personalization import HeadProgram

    frozen = programs.FrozenPart(front_end).eval()
    with torch.no_grad():
        hidden, _ = frozen(data["train"][0])
        test_hidden, _ = frozen(data["test"][0])
    positions, test_positions = data["train"][1], data["test"][1]
    entry = {
        "method": programs.TRAINING_METHOD,
        "batch": build.batch,
        "learning_rate": lr,
        "parameter_names": build.parameter_names,
    }
    trainer = TrainingProgram(build.training, entry)
    eager = EagerSteps(programs.TrainedPart(front_end, programs.SHIPPED_SCOPE), lr)
    pte_losses, eager_losses = [], []
    for rows in torch.as_tensor(batch_indices(len(hidden), build.batch, steps, seed)):
        pte_losses.append(trainer.step(hidden[rows], positions[rows]))
        eager_losses.append(eager.step(hidden[rows], positions[rows]))
    with torch.no_grad():
        before = programs.TrainedPart(front_end, programs.SHIPPED_SCOPE).classifier(test_hidden)
        after_eager = eager.part.classifier(test_hidden)
    after_pte = HeadProgram(build.head).logits(test_hidden, trainer.parameters())

    def accuracy(logits):
        return float((logits.argmax(1) == test_positions).float().mean())

    return {
        "steps": steps,
        "train_samples": len(hidden),
        "test_samples": len(test_hidden),
        "accuracy_before": accuracy(before),
        "accuracy_after_pte": accuracy(after_pte),
        "accuracy_after_eager": accuracy(after_eager),
        "final_loss_pte": float(np.mean(pte_losses[-10:])),
        "final_loss_eager": float(np.mean(eager_losses[-10:])),
        "loss_max_abs_difference": float(np.max(np.abs(np.subtract(pte_losses, eager_losses)))),
        "logits_max_abs_difference": float((after_pte - after_eager).abs().max()),
    }


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--run", type=Path, help="a finished run (default: train a small digits run)")
    parser.add_argument("--rounds", type=int, default=4, help="rounds of the small run trained without --run")
    parser.add_argument("--steps", type=int, default=200, help="steps for the accuracy comparison")
    parser.add_argument("--speed-steps", type=int, default=200, help="timed steps of the shipped scope")
    parser.add_argument("--scope-steps", type=int, default=4, help="timed steps of each larger scope")
    parser.add_argument("--turns", type=int, default=5)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--lr", type=float, default=programs.DEFAULT_LEARNING_RATE)
    parser.add_argument("--out", type=Path, default=RESULTS)
    return parser.parse_args()


def measure_tier(run: RunDir, tier, dataset, args) -> dict:
    data = tier_data(run, tier.name, dataset)
    front_end = run.front_end(data["client"]).eval()
    build = programs.build_personalization(
        front_end, tuple(tier.input_shape), run.info.num_classes, 1, data["train"][0]
    )
    speeds = [
        scope_speed(
            front_end,
            programs.SHIPPED_SCOPE,
            data,
            run.info.num_classes,
            args.speed_steps,
            args.turns,
            args.lr,
        )
    ]
    for scope in programs.TRAINABLE_SCOPES[1:]:
        speeds.append(scope_speed(front_end, scope, data, run.info.num_classes, args.scope_steps, 2, args.lr))
    return {
        "tier": tier.name,
        "family": tier.family,
        "split_depth": tier.split_depth,
        "width": tier.width,
        "client_id": data["client"].client_id,
        "speed": speeds,
        "accuracy": accuracy_after_steps(front_end, data, build, args.steps, args.seed, args.lr),
    }


def main() -> None:
    args = parse_args()
    torch.manual_seed(args.seed)
    set_threads(args.threads)
    warnings.simplefilter("ignore", FutureWarning)
    with tempfile.TemporaryDirectory() as scratch:
        run = RunDir(args.run) if args.run else train_small_run(Path(scratch) / "run", args.rounds, args.seed)
        dataset = run.dataset()
        tiers = [measure_tier(run, tier, dataset, args) for tier in run.info.tiers.tiers]
        described = describe_run(run)
    report = {
        "machine": {"platform": platform.platform(), "processor": platform.processor() or "unknown"},
        "threads": args.threads,
        "batch": programs.TRAIN_BATCH,
        "learning_rate": args.lr,
        "target_pte_time_over_eager": TARGET_RATIO,
        "run": described,
        "versions": {"torch": torch.__version__, "executorch": _version("executorch")},
        "tiers": tiers,
    }
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "device_training.json").write_text(json.dumps(report, indent=2) + "\n")
    (args.out / "device_training.md").write_text(markdown(report))
    print(markdown(report))


def describe_run(run: RunDir) -> str:
    info = run.info
    rounds = info.train_config.get("rounds", "?")
    return f"{info.dataset}, {len(run.clients())} clients (one per tier), {rounds} rounds, seed {info.seed}"


def _version(package: str) -> str:
    from importlib.metadata import version

    return version(package)


def markdown(report: dict) -> str:
    lines = [
        "# On-device personalization: ExecuTorch training .pte vs eager PyTorch",
        "",
        f"Written by `benchmarks/device_training.py` ({report['run']}; torch {report['versions']['torch']}, "
        f"executorch {report['versions']['executorch']}; {report['threads']} thread(s) for torch and the "
        f"ExecuTorch threadpool; batch {report['batch']}, SGD lr {report['learning_rate']}). Steps of each scope "
        "run through the training program (TrainingModule + SGD, portable kernels) and in eager PyTorch in "
        "alternating turns on the same rows; median steps/s. The phone ships the exit-classifier scope: the "
        "frozen part (stages, exit conv + pooling, connector) runs once per sample through the XNNPACK "
        f"personalize_frozen.pte. Target: a .pte step within {report['target_pte_time_over_eager']:g}x of eager.",
        "",
        "## Speed",
        "",
        "| tier | family | scope | trained params | .pte steps/s | eager steps/s | .pte time / eager | target |",
        "|---|---|---|---:|---:|---:|---:|---|",
    ]
    for tier in report["tiers"]:
        for s in tier["speed"]:
            met = "met" if s["pte_time_over_eager"] <= report["target_pte_time_over_eager"] else "missed"
            lines.append(
                f"| {tier['tier']} | {tier['family']} | {s['scope']} ({s['steps']} steps) | {s['trained_parameters']} | "
                f"{s['pte_steps_per_s']:.1f} | {s['eager_steps_per_s']:.1f} | {s['pte_time_over_eager']:.2f}x | {met} |"
            )
    lines += [
        "",
        "## Accuracy after the same steps (shipped scope, same data, same seed, same start)",
        "",
        "Top-1 exit accuracy (labels as exit positions) on the client's test split, before and after the steps, "
        "through the head program fed the .pte's trained parameters and through the eager classifier.",
        "",
        "| tier | steps | train / test samples | before | after (.pte) | after (eager) | final loss .pte / eager | max loss diff | max logit diff |",
        "|---|---:|---|---:|---:|---:|---|---:|---:|",
    ]
    for tier in report["tiers"]:
        a = tier["accuracy"]
        lines.append(
            f"| {tier['tier']} | {a['steps']} | {a['train_samples']} / {a['test_samples']} | {a['accuracy_before']:.3f} | "
            f"{a['accuracy_after_pte']:.3f} | {a['accuracy_after_eager']:.3f} | {a['final_loss_pte']:.4f} / "
            f"{a['final_loss_eager']:.4f} | {a['loss_max_abs_difference']:.2g} | {a['logits_max_abs_difference']:.2g} |"
        )
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    main()
