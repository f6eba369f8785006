"""`fedavg` baseline (docs/ALGORITHM.md, Baselines): FedAvg per model family on full 4-stage models.

No split and no server back-end: each client trains the whole classifier of its family
(`classify_full`) from the family's global weights, uploads all of it, and the server averages
per family, weighted by sample count. No personalization: every client of a family ends with the
same global model and answers every query with it.
"""

from __future__ import annotations

import torch

from harmony_mobile.algorithms.base import (
    FullModelMethod,
    LocalTrainingConfig,
    client_update,
    round_optimizer,
)
from harmony_mobile.algorithms.local import full_model_step
from harmony_mobile.federation.client import Client
from harmony_mobile.federation.split_trainer import SplitTrainer, aggregate_by_parameter
from harmony_mobile.protocol.messages import ClientUpdate


class FedAvgConfig(LocalTrainingConfig):
    """The shared budget; the optimizer is fresh every round."""


class FedAvg(FullModelMethod):
    name = "fedavg"
    Config = FedAvgConfig

    def client_round(
        self, client: Client, server: SplitTrainer | None, round_id: int, generator: torch.Generator
    ) -> ClientUpdate:
        c = self.config
        optimizer = round_optimizer(client.held_parameters(full=True).values(), c, round_id)
        total = sum(full_model_step(client, optimizer, c.batch_size, generator) for _ in range(c.local_steps))
        return client_update(client, round_id, {"loss": total / c.local_steps}, full=True)

    aggregate = staticmethod(aggregate_by_parameter)

    def personalize(self, client: Client, server: SplitTrainer | None, generator: torch.Generator) -> None:
        """None: the client keeps its family's global model (training already broadcast it)."""
