"""Export benchmark on quickly trained front-ends: the export quality checks without a full training run.

    python -m harmony_mobile.export.benchmark [--dataset digits] [--epochs 6] [--work /tmp/harmony-export-bench]
                                              [--tiers entry-android,flagship] [--report FILE.md]

Per tier of the default tier set it trains ONE front-end with plain supervised exit-head training
(cross-entropy on the exit logits, Adam, a few epochs) on 70 % of the data set, writes a run
directory in the run_dir.py format (random back-end: only the front-ends are measured), then runs
`export_run` on it and prints / writes the verification table (int8 top-1 agreement and exit
accuracy vs fp32, sizes, .pte vs eager latency). Not a unit test: it takes a few minutes.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import time
from collections.abc import Callable
from pathlib import Path

import torch
import torch.nn.functional as F

from harmony_mobile.data import load_dataset
from harmony_mobile.models import Backend, ProjectionHead, load_tiers
from harmony_mobile.protocol.label_tokens import class_tokens, epoch_key
from harmony_mobile.protocol.slots import SlotTable
from harmony_mobile.run_dir import (
    ClientArtifact,
    RunInfo,
    build_front_end,
    save_backend,
    save_client,
    write_federation_secret,
    write_run_info,
)


def train_front_end(front_end, images, labels, epochs: int, seed: int) -> float:
    torch.manual_seed(seed)
    optimizer = torch.optim.Adam(front_end.parameters(), lr=2e-3)
    front_end.train()
    for _ in range(epochs):
        order = torch.randperm(len(images))
        for start in range(0, len(images), 64):
            batch = order[start : start + 64]
            logits, _ = front_end(images[batch])
            loss = F.cross_entropy(logits, labels[batch])
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
    front_end.eval()
    return float(loss.detach())


def benchmark_run_info(data, dataset_name: str, tier_names: list[str] | None, seed: int) -> RunInfo:
    """The run description: the default tiers (or the named ones) at the data set's input shape."""
    tiers = load_tiers().with_input_shape(data.input_shape)
    if tier_names:
        from harmony_mobile.models import TierSet

        tiers = TierSet(tiers=tuple(tiers.get(n) for n in tier_names))
    return RunInfo.of_dataset(
        data,
        algorithm="supervised-exit-benchmark",
        interface=(64, 8),
        tiers=tiers,
        model_version=f"export-bench-{dataset_name}-s{seed}",
        label_epoch=f"e-export-bench-s{seed}",
        seed=seed,
    )


def split_indices(count: int, seed: int) -> tuple[list[int], list[int], list[int]]:
    """(train, val, test) indices: a seeded permutation cut 70 / 10 / 20 %."""
    order = torch.randperm(count, generator=torch.Generator().manual_seed(seed)).tolist()
    n_train, n_val = int(0.7 * len(order)), int(0.1 * len(order))
    return order[:n_train], order[n_train : n_train + n_val], order[n_train + n_val :]


def train_and_save_client(
    run: Path,
    info: RunInfo,
    data,
    client_id: int,
    tier,
    splits: tuple[list[int], ...],
    epochs: int,
    seed: int,
) -> dict[str, float]:
    """Train one tier's front-end, save it as client `client_id`; its exit accuracy, loss and seconds."""
    train_idx, val_idx, test_idx = splits
    front_end = build_front_end(info, tier)
    started = time.perf_counter()
    loss = train_front_end(
        front_end, data.images[train_idx], data.labels[train_idx], epochs, seed + client_id
    )
    with torch.no_grad():
        accuracy = float(
            (front_end(data.images[test_idx])[0].argmax(1) == data.labels[test_idx]).float().mean()
        )
    metrics = {"exit_accuracy": accuracy, "loss": loss, "train_s": time.perf_counter() - started}
    save_client(
        run,
        ClientArtifact(
            client_id=client_id,
            tier=tier.name,
            classes=tuple(range(info.num_classes)),
            threshold=0.9,
            train_idx=train_idx,
            val_idx=val_idx,
            test_idx=test_idx,
            front_end_state=front_end.state_dict(),
        ),
    )
    return metrics


def save_random_backend(run: Path, info: RunInfo, secret: bytes) -> None:
    """An untrained back-end whose slot i is class i: the export benchmark measures only the front-ends."""
    backend = Backend(info.interface_spec, info.num_classes)
    save_backend(
        run / "backend.pt",
        backend,
        ProjectionHead(backend.feature_dim, info.projection_dim),
        info.model_version,
        info.class_names,
        SlotTable(
            info.label_epoch,
            info.num_classes,
            class_tokens(epoch_key(secret, info.label_epoch), info.class_names),
        ),
    )


def build_run(
    work: Path,
    dataset_name: str,
    tier_names: list[str] | None,
    epochs: int,
    seed: int,
    log: Callable[[str], None] = print,
) -> Path:
    """A run directory under `work` with one trained front-end per tier and a random back-end."""
    data = load_dataset(dataset_name)
    info = benchmark_run_info(data, dataset_name, tier_names, seed)
    run = work / "run"
    shutil.rmtree(run, ignore_errors=True)
    secret = os.urandom(32)
    write_federation_secret(run, secret)
    write_run_info(run, info)
    splits = split_indices(len(data), seed)
    metrics = {}
    for client_id, tier in enumerate(info.tiers.tiers):
        metrics[tier.name] = train_and_save_client(run, info, data, client_id, tier, splits, epochs, seed)
        log(
            f"trained {tier.name}: exit accuracy {metrics[tier.name]['exit_accuracy']:.3f} "
            f"({metrics[tier.name]['train_s']:.0f} s)"
        )
    save_random_backend(run, info, secret)
    (run / "final_metrics.json").write_text(json.dumps(metrics, indent=2) + "\n")
    return run


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--dataset", default="digits")
    parser.add_argument("--epochs", type=int, default=6)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--tiers", default=None, help="comma-separated (default: all default tiers)")
    parser.add_argument("--work", type=Path, default=Path("/tmp/harmony-export-bench"))
    parser.add_argument("--report", type=Path, default=None, help="also copy verification.md here")
    args = parser.parse_args(argv)
    torch.set_num_threads(args.threads)
    args.work.mkdir(parents=True, exist_ok=True)
    run = build_run(
        args.work, args.dataset, args.tiers.split(",") if args.tiers else None, args.epochs, args.seed
    )

    from harmony_mobile.export.pipeline import export_run

    result = export_run(  # the report is the point: a failed variant is shown there, then exit 1
        run,
        args.work / "out",
        key_dir=args.work / "keys",
        threads=args.threads,
        latency_runs=100,
        allow_failed_variants=True,
    )
    markdown = (result.out / "verification.md").read_text()
    print(markdown)
    if args.report:
        header = (
            f"<!-- python -m harmony_mobile.export.benchmark --dataset {args.dataset} --epochs {args.epochs} "
            f"--threads {args.threads}; front-ends trained with plain supervised exit-head training -->\n\n"
        )
        args.report.write_text(header + markdown)
    print(f"export took {result.seconds:.0f} s; all quality checks pass: {result.report['all_checks_pass']}")
    return 0 if result.report["all_checks_pass"] else 1


if __name__ == "__main__":
    raise SystemExit(main())
