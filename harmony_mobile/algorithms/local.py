"""`local` baseline (docs/ALGORITHM.md, Baselines): every client trains its own full 4-stage model on its
own data alone. No server, nothing uploaded, nothing aggregated.

The round loop broadcasts the family's (never-changing) initial weights at every round; this
algorithm keeps each client's own weights and optimizer state between rounds and swaps them back
in, so a client's training continues exactly where it stopped. The phone answers every query with
its full model (`uses_split = False`: predict() calls classify_full).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from harmony_mobile.algorithms.base import FullModelMethod, LocalTrainingConfig, round_optimizer
from harmony_mobile.federation.client import Client
from harmony_mobile.federation.split_trainer import SplitTrainer
from harmony_mobile.protocol.messages import ClientUpdate


class LocalConfig(LocalTrainingConfig):
    """The shared budget; each client's optimizer state carries over between rounds."""


def full_model_step(client: Client, optimizer: torch.optim.Optimizer, batch_size: int, generator) -> float:
    """One step of cross-entropy of the full 4-stage classifier on a local batch."""
    images, labels = client.batch(batch_size, generator)
    optimizer.zero_grad()
    loss = F.cross_entropy(client.model.classify_full(images), labels)
    loss.backward()
    optimizer.step()
    return loss.item()


class Local(FullModelMethod):
    name = "local"
    Config = LocalConfig

    def __init__(self, config: LocalConfig | None = None):
        super().__init__(config)
        self._weights: dict[str, dict[str, torch.Tensor]] = {}  # client name -> its own model
        self._optimizer_state: dict[str, dict] = {}

    def _restore(self, client: Client) -> None:
        if client.name in self._weights:
            client.model.load_state_dict(self._weights[client.name])

    def client_round(
        self, client: Client, server: SplitTrainer | None, round_id: int, generator: torch.Generator
    ) -> ClientUpdate:
        c = self.config
        self._restore(client)
        params = list(client.held_parameters(full=True).values())
        optimizer = round_optimizer(params, c, round_id, self._optimizer_state.get(client.name))
        total = sum(full_model_step(client, optimizer, c.batch_size, generator) for _ in range(c.local_steps))
        self._weights[client.name] = {k: v.detach().clone() for k, v in client.model.state_dict().items()}
        self._optimizer_state[client.name] = optimizer.state_dict()
        # nothing leaves the phone: an empty update
        return ClientUpdate(
            client_id=client.name,
            round_id=round_id,
            family=client.tier.family,
            tier=client.tier.name,
            weights={},
            num_samples=len(client.train_y),
            metrics={"loss": total / c.local_steps},
        )

    def aggregate(
        self, family_weights: dict[str, torch.Tensor], updates: list[ClientUpdate]
    ) -> dict[str, torch.Tensor]:
        return family_weights

    def personalize(self, client: Client, server: SplitTrainer | None, generator: torch.Generator) -> None:
        self._restore(client)  # the client's own model is its final model
