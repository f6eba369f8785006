"""The round loop, one for both engines: the server's side of a round, with the clients' turns
behind a `ClientTurns` (in this process: `InProcessTurns`; on Flower: flower/server_app.py).

for each round r (resuming after the last checkpoint):
    sample clients;  server.start_round(r)
    updates = turns.train_round(sampled, r, seed)    # each: meta-weights in, ClientUpdate out
    per family: meta-weights = algorithm.aggregate(meta-weights, updates of that family)
    checkpoint;  metrics.jsonl;  turns.after_round(...)

Every client turn draws from its own random stream, a function of (seed, round, client) only
(`seed_turn`): no turn continues another's stream, so the clients of a round are independent and
an engine may run them in any order or at once with the same numbers. A split method's server
learns from each upload, so the order of its steps matters too: the turns of a round run in
lockstep (federation/lockstep.py), step k of every sampled client in the round's order before any
step k + 1, which lets an engine run the clients' local work at once.
"""

from __future__ import annotations

import hashlib
import json
import time
from collections.abc import Callable
from contextlib import contextmanager
from dataclasses import dataclass, field
from functools import partial
from pathlib import Path
from typing import Protocol

import numpy as np
import torch
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

from harmony_mobile.federation.client import Client
from harmony_mobile.federation.lockstep import run_in_lockstep
from harmony_mobile.federation.split_trainer import SplitTrainer
from harmony_mobile.files import open_private, save_private
from harmony_mobile.protocol.messages import Broadcast, ClientUpdate


class RoundAlgorithm(Protocol):
    """What the loop needs of an algorithm (algorithms/base.py's Algorithm, which sits above)."""

    def client_round(self, client, server, round_id: int, generator) -> ClientUpdate: ...

    def aggregate(self, weights: dict, updates: list[ClientUpdate]) -> dict: ...


@dataclass
class Federation:
    algorithm: RoundAlgorithm
    clients: list[Client]
    family_weights: dict[str, dict[str, torch.Tensor]]  # meta-weights per model family
    server: SplitTrainer | None
    update_listeners: list[Callable[[ClientUpdate], None]] = field(default_factory=list)  # e.g. byte counts

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


def turn_seed(seed: int, round_id: int, client_id: int) -> int:
    """The seed of one client's turn: a hash of (run seed, round, client), so that turns share no
    stream and a resumed run replays each exactly. Personalization, after the rounds, is round
    `rounds` (`personalization_round`)."""
    digest = hashlib.sha256(f"harmony/turn/{seed}/{round_id}/{client_id}".encode()).digest()
    return int.from_bytes(digest[:8], "little") >> 1  # 63 bits: torch seeds are signed 64-bit


def seed_turn(seed: int, round_id: int, client_id: int) -> torch.Generator:
    """The turn's generator (batches, variants, noise); torch's global stream (dropout masks inside
    modules) is seeded from the same number, as a fresh process per client would have it."""
    number = turn_seed(seed, round_id, client_id)
    torch.manual_seed(number)
    return torch.Generator().manual_seed(number)


def personalization_round(rounds: int) -> int:
    """The stream index of the final personalization: one after the last round."""
    return rounds


class ClientTurns(Protocol):
    """Where the clients' turns of a round run: in this process, or on Flower's SuperNodes."""

    def client_count(self) -> int: ...

    def train_round(self, client_ids: list[int], round_id: int, seed: int) -> list[ClientUpdate]:
        """The sampled clients' updates, in order (a client that does not answer is left out); the
        turn of client i draws from `seed_turn(seed, round_id, i)`."""

    def after_round(self, round_id: int, sampled: int, replied: int, seconds: float) -> None: ...


@dataclass
class InProcessTurns:
    """Every client is an object of this process; a turn is `algorithm.client_round`."""

    federation: Federation

    def client_count(self) -> int:
        return len(self.federation.clients)

    def train_round(self, client_ids: list[int], round_id: int, seed: int) -> list[ClientUpdate]:
        federation = self.federation

        def turn(index: int, server) -> ClientUpdate:
            client = federation.clients[index]
            federation.broadcast(client, round_id)
            return federation.algorithm.client_round(
                client, server, round_id, seed_turn(seed, round_id, index)
            )

        if federation.server is None:  # no server steps: turns are independent, run one by one
            return [turn(index, None) for index in client_ids]
        updates = run_in_lockstep(federation.server, [(i, partial(turn, i)) for i in client_ids])
        return [updates[index] for index in client_ids]

    def after_round(self, round_id: int, sampled: int, replied: int, seconds: float) -> None:
        return None


def aggregate_round(federation: Federation, updates: list[ClientUpdate], round_id: int) -> dict:
    """New meta-weights per family from its clients' updates; the round's mean metrics."""
    for update in updates:
        for listener in federation.update_listeners:
            listener(update)
    for family, weights in federation.family_weights.items():
        family_updates = [u for u in updates if u.family == family]
        if family_updates:
            federation.family_weights[family] = federation.algorithm.aggregate(weights, family_updates)
    metrics = {"round": round_id, "clients": len(updates)}
    for key in sorted({k for u in updates for k in u.metrics}):
        metrics[key] = float(np.mean([u.metrics[key] for u in updates if key in u.metrics]))
    return metrics


def run_rounds(
    federation: Federation,
    rounds: int,
    clients_per_round: int,
    seed: int,
    run_path: Path | None = None,
    evaluate: Callable[[Federation], float] | None = None,
    show_progress: bool = True,
    turns: ClientTurns | None = None,
) -> list[dict]:
    """Run rounds (resuming after the last checkpointed one) and return per-round metrics."""
    turns = turns or InProcessTurns(federation)
    count = turns.client_count()
    start = load_checkpoint(run_path, federation) + 1 if run_path else 0
    history = []
    with round_progress(rounds, start, show_progress) as progress:
        for round_id in range(start, rounds):
            started = time.perf_counter()
            # random order too: the server's contrastive memory then mixes families within a round
            sampled = np.random.default_rng((seed, round_id)).choice(
                count, size=min(clients_per_round, count), replace=False
            )
            if federation.server is not None:
                federation.server.start_round(round_id)
            updates = turns.train_round([int(i) for i in sampled], round_id, seed)
            metrics = aggregate_round(federation, updates, round_id)
            if evaluate is not None:
                metrics["val_accuracy"] = evaluate(federation)
            history.append(metrics)
            if run_path is not None:
                save_checkpoint(run_path, federation, round_id)
                with open_private(run_path / "metrics.jsonl", "a") as log:
                    log.write(json.dumps(metrics) + "\n")
            turns.after_round(round_id, len(sampled), len(updates), time.perf_counter() - started)
            progress(metrics)
    return history


@contextmanager
def round_progress(rounds: int, start: int, show: bool):
    """A progress bar over rounds (drawn only when `show`); yields the function that advances it."""
    columns = [TextColumn("[bold]train"), BarColumn(), MofNCompleteColumn(), TextColumn("{task.description}")]
    with Progress(*columns, TimeElapsedColumn(), disable=not show, transient=False) as progress:
        task = progress.add_task("", total=rounds, completed=start)

        def advance(metrics: dict) -> None:
            shown = " ".join(f"{k}={v:.3f}" for k, v in metrics.items() if isinstance(v, float))
            progress.update(task, advance=1, description=f"round {metrics['round'] + 1}/{rounds} {shown}")

        yield advance
