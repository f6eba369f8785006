"""The round loop: in-process clients and server exchanging the messages of messages.py.

for each round r:
    sample clients;  server.start_round(r)
    for each sampled client: load its family's meta-weights; update = algorithm.client_round(...)
    per family: meta-weights = algorithm.aggregate(meta-weights, updates of that family)
    checkpoint
"""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

from harmony_mobile.algorithms.base import Algorithm
from harmony_mobile.federation.client import Client
from harmony_mobile.federation.split_trainer import SplitTrainer
from harmony_mobile.files import open_private, save_private
from harmony_mobile.protocol.messages import Broadcast


@dataclass
class Federation:
    algorithm: Algorithm
    clients: list[Client]
    family_weights: dict[str, dict[str, torch.Tensor]]  # meta-weights per model family
    server: SplitTrainer | None

    def broadcast(self, client: Client, round_id: int = -1) -> None:
        """Send a client its family's meta-weights as a Broadcast message (round -1: after the rounds)."""
        family = client.tier.family
        client.receive(
            Broadcast(round_id, family, self.family_weights[family], backend_version=f"round-{round_id}")
        )


CHECKPOINT = "checkpoints/last.pt"


def save_checkpoint(run_path: Path, federation: Federation, completed_round: int) -> None:
    state = {"completed_round": completed_round, "family_weights": federation.family_weights}
    if federation.server is not None:
        state["server"] = federation.server.state()
    path = run_path / CHECKPOINT
    tmp = path.with_suffix(".tmp")
    save_private(state, tmp)
    tmp.replace(path)  # atomic: an interrupted save never corrupts the last good checkpoint


def load_checkpoint(run_path: Path, federation: Federation) -> int:
    """Restore the last completed round; returns it, or -1 when there is no checkpoint."""
    path = run_path / CHECKPOINT
    if not path.is_file():
        return -1
    state = torch.load(path, weights_only=True)
    federation.family_weights = state["family_weights"]
    if federation.server is not None:
        federation.server.load_state(state["server"])
    return state["completed_round"]


def round_generator(seed: int, round_id: int) -> torch.Generator:
    """Randomness of one round depends only on (seed, round): a resumed run replays it exactly."""
    return torch.Generator().manual_seed(seed * 100_003 + round_id)


def run_rounds(
    federation: Federation,
    rounds: int,
    clients_per_round: int,
    seed: int,
    run_path: Path | None = None,
    evaluate: Callable[[Federation], float] | None = None,
    show_progress: bool = True,
) -> list[dict]:
    """Run rounds (resuming after the last checkpointed one) and return per-round metrics."""
    start = load_checkpoint(run_path, federation) + 1 if run_path else 0
    history = []
    columns = [
        TextColumn("[bold]train"),
        BarColumn(),
        MofNCompleteColumn(),
        TextColumn("{task.description}"),
        TimeElapsedColumn(),
    ]
    with Progress(*columns, disable=not show_progress, transient=False) as progress:
        task = progress.add_task("", total=rounds, completed=start)
        for round_id in range(start, rounds):
            generator = round_generator(seed, round_id)
            torch.manual_seed(seed * 100_003 + round_id)  # dropout masks inside modules
            # random order too: the server's contrastive memory then mixes families within a round
            sampled = np.random.default_rng((seed, round_id)).choice(
                len(federation.clients), size=min(clients_per_round, len(federation.clients)), replace=False
            )
            if federation.server is not None:
                federation.server.start_round(round_id)
            updates = []
            for index in sampled:
                client = federation.clients[index]
                federation.broadcast(client, round_id)
                updates.append(
                    federation.algorithm.client_round(client, federation.server, round_id, generator)
                )
            for family, weights in federation.family_weights.items():
                family_updates = [u for u in updates if u.family == family]
                if family_updates:
                    federation.family_weights[family] = federation.algorithm.aggregate(
                        weights, family_updates
                    )
            metrics = {"round": round_id, "clients": len(updates)}
            for key in sorted({k for u in updates for k in u.metrics}):
                metrics[key] = float(np.mean([u.metrics[key] for u in updates if key in u.metrics]))
            if evaluate is not None:
                metrics["val_accuracy"] = evaluate(federation)
            history.append(metrics)
            if run_path is not None:
                save_checkpoint(run_path, federation, round_id)
                with open_private(run_path / "metrics.jsonl", "a") as log:
                    log.write(json.dumps(metrics) + "\n")
            shown = " ".join(f"{k}={v:.3f}" for k, v in metrics.items() if isinstance(v, float))
            progress.update(task, advance=1, description=f"round {round_id + 1}/{rounds} {shown}")
    return history
