"""Screen the server's alignment mechanisms on frozen front-ends: a fresh back-end g is trained from
the personalized front-ends of a finished run (their features of each client's own training
samples, uploaded with label tokens as in training), once per mechanism and seed, and scored on
what alignment is for: g's accuracy on each family's unseen classes, beside its accuracy on the
clients' own ID test samples. Cheap (no front-end trains), so it screens before end-to-end runs;
it cannot show how a mechanism's gradient at z would move the front-ends.

    python benchmarks/server_screen.py RUN_DIR [RUN_DIR ...] --seeds 0 1 2 [--out FILE.json]
"""

from __future__ import annotations

import argparse
import json
import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch

from harmony_mobile.bench.saved_runs import FinishedRun, load_finished_run
from harmony_mobile.federation.client import Client
from harmony_mobile.federation.split_trainer import (
    ContrastiveTerm,
    SplitTrainer,
    SplitTrainerConfig,
    StyleMixing,
)
from harmony_mobile.models import Backend, ProjectionHead

SUPCON = {"weight": 0.5, "temperature": 0.1, "bank_size": 512, "reaches_front_ends": False}
MECHANISMS = {
    "ce-only": {},
    "ce-full-softmax": {"restrict_to_client_slots": False},
    "supcon-token": {"contrastive": ContrastiveTerm(mode="token", **SUPCON)},
    "supcon-cross-family": {"contrastive": ContrastiveTerm(mode="cross_family", **SUPCON)},
    "style-0.5": {"style_mixing": StyleMixing(probability=0.5, alpha=0.1, bank_size=512)},
    "style-1.0": {"style_mixing": StyleMixing(probability=1.0, alpha=0.1, bank_size=512)},
    "style-0.5+supcon-token": {
        "style_mixing": StyleMixing(probability=0.5, alpha=0.1, bank_size=512),
        "contrastive": ContrastiveTerm(mode="token", **SUPCON),
    },
}


@dataclass
class CachedClient:
    """A client's frozen-front-end features: its training rows, its ID test rows and its family's
    unseen-class rows (from the OOD pool), computed once per run."""

    client: Client
    train_z: torch.Tensor
    test_z: torch.Tensor
    test_y: torch.Tensor  # exit indices
    unseen_z: torch.Tensor
    unseen_y: torch.Tensor


@torch.no_grad()
def cache_features(run: FinishedRun, unseen_per_client: int = 400) -> list[CachedClient]:
    def z_of(client, images):
        return torch.cat(
            [client.model(images[i : i + 512], client.split_depth)[1] for i in range(0, len(images), 512)]
        )

    family_classes: dict[str, set[int]] = {}
    for client in run.clients:
        family_classes.setdefault(client.tier.family, set()).update(int(c) for c in client.classes)
    pool = np.asarray(run.partition.ood_pool, dtype=np.int64)
    cached = []
    for client in run.clients:
        test = np.asarray(run.partition.clients[client.client_id].test, dtype=np.int64)
        unseen = pool[~np.isin(run.labels.numpy()[pool], list(family_classes[client.tier.family]))]
        rng = np.random.default_rng((run.seed, client.client_id))
        unseen = np.sort(rng.choice(unseen, min(len(unseen), unseen_per_client), replace=False))
        cached.append(
            CachedClient(
                client,
                z_of(client, client.train_x),
                z_of(client, run.images[test]),
                client.exit_labels(run.labels[test]),
                z_of(client, run.images[unseen]),
                client.exit_labels(run.labels[unseen]),
            )
        )
    return cached


def train_backend(
    cached: list[CachedClient], mechanism: dict, seed: int, rounds: int, steps: int
) -> SplitTrainer:
    torch.manual_seed(seed)
    model = cached[0].client.model
    backend = Backend(model.interface, model.num_classes)
    config = SplitTrainerConfig(
        **{
            "lr": 1e-3,
            "decay_rounds": None,
            "restrict_to_client_slots": True,
            "logit_adjustment": 0.0,
            "contrastive": None,
            **mechanism,
        }
    )
    server = SplitTrainer(backend, ProjectionHead(backend.feature_dim), config, cached[0].client.label_epoch)
    generator = torch.Generator().manual_seed(seed)
    for round_id in range(rounds):
        server.start_round(round_id)
        for index in torch.randperm(len(cached), generator=generator).tolist():
            entry = cached[index]
            for _ in range(steps):
                _, labels = entry.client.batch(64, generator)
                z = entry.train_z[entry.client._last_batch]
                depths = (entry.client.split_depth,) * len(labels)
                upload, _ = entry.client.upload(z, labels, depths, round_id)
                server.step(upload)
    return server


@torch.no_grad()
def score(cached: list[CachedClient], server: SplitTrainer) -> dict:
    server.backend.eval()
    tokens = server.slot_table.tokens
    own, unseen = [], []
    for entry in cached:
        slot_class = entry.client.slot_to_class(tokens)
        for z, y, out in ((entry.test_z, entry.test_y, own), (entry.unseen_z, entry.unseen_y, unseen)):
            if len(y):
                answer = slot_class[server.infer(z).argmax(dim=1)]  # g's scores over the table's slots
                out.append(float((answer == y).float().mean()))
    return {"unseen_family": float(np.mean(unseen)), "own_id": float(np.mean(own))}


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("runs", nargs="+", type=Path)
    parser.add_argument("--seeds", nargs="+", type=int, default=[0, 1, 2])
    parser.add_argument("--rounds", type=int, default=24)
    parser.add_argument("--steps", type=int, default=10, help="server steps per client per round")
    parser.add_argument("--mechanisms", nargs="+", default=list(MECHANISMS))
    parser.add_argument("--out", type=Path)
    args = parser.parse_args()
    torch.set_num_threads(1)
    results = {}
    for path in args.runs:
        cached = cache_features(load_finished_run(path))
        for name in args.mechanisms:
            for seed in args.seeds:
                started = time.perf_counter()
                scores = score(cached, train_backend(cached, MECHANISMS[name], seed, args.rounds, args.steps))
                results.setdefault(str(path), {}).setdefault(name, []).append(scores)
                print(
                    path,
                    name,
                    seed,
                    {k: round(v, 3) for k, v in scores.items()},
                    f"{time.perf_counter() - started:.0f}s",
                    flush=True,
                )
    if args.out:
        args.out.write_text(json.dumps(results, indent=1))


if __name__ == "__main__":
    main()
