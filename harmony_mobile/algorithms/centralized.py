"""`centralized` baseline (docs/ALGORITHM.md, Baselines): the upper bound, no federation at all.

Every client ships its raw training data once; per model family, ONE full 4-stage model is
trained on the pooled data of all clients (the same architectures the tiers run, so the bound is
per family) with one continuous optimizer. Each client then answers every query with its family's
model (`uses_split = False`).

Driven by the ordinary round loop: a client's turn in a round adds its data to the pool the first
time, then runs `local_steps` steps of the family model on batches drawn from the whole pool
(so the step budget equals the federated methods'); aggregation returns the family model. Only
the very first turns of round 0 see a partial pool.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from harmony_mobile.algorithms.base import FullModelMethod, LocalTrainingConfig, round_optimizer
from harmony_mobile.federation.client import Client
from harmony_mobile.federation.split_trainer import SplitTrainer
from harmony_mobile.protocol.messages import ClientUpdate


class CentralizedConfig(LocalTrainingConfig):
    """The shared budget: `local_steps` per client turn, batches drawn from the whole pool."""


class Centralized(FullModelMethod):
    name = "centralized"
    Config = CentralizedConfig

    def __init__(self, config: CentralizedConfig | None = None):
        super().__init__(config)
        self._pooled: dict[str, tuple[torch.Tensor, torch.Tensor]] = {}  # client name -> its raw data
        self._images = self._labels = None
        self._models: dict[str, dict[str, torch.Tensor]] = {}  # family -> the one model's weights
        self._optimizers: dict[str, dict] = {}

    def _pool(self, client: Client) -> int:
        """Add the client's raw training data to the pool once; returns the bytes it uploaded."""
        if client.name in self._pooled:
            return 0
        self._pooled[client.name] = (client.train_x, client.train_y)
        self._images = torch.cat([x for x, _ in self._pooled.values()])
        self._labels = torch.cat([y for _, y in self._pooled.values()])
        return client.train_x.nbytes + client.train_y.nbytes

    def client_round(
        self, client: Client, server: SplitTrainer | None, round_id: int, generator: torch.Generator
    ) -> ClientUpdate:
        c, family = self.config, client.tier.family
        uploaded = self._pool(client)
        if family in self._models:
            client.model.load_state_dict(self._models[family])
        params = client.held_parameters(full=True).values()
        optimizer = round_optimizer(params, c, round_id, self._optimizers.get(family))
        total = 0.0
        for _ in range(c.local_steps):
            index = torch.randint(len(self._labels), (c.batch_size,), generator=generator)
            optimizer.zero_grad()
            loss = F.cross_entropy(client.model.classify_full(self._images[index]), self._labels[index])
            loss.backward()
            optimizer.step()
            total += loss.item()
        # what the family's clients receive next (token order, like every model: federation/client.py)
        self._models[family] = {k: v.detach().clone() for k, v in client.model.state_dict().items()}
        self._optimizers[family] = optimizer.state_dict()
        return ClientUpdate(
            client_id=client.name,
            round_id=round_id,
            family=family,
            tier=client.tier.name,
            weights={},
            num_samples=len(client.train_y),
            metrics={"loss": total / c.local_steps, "raw_upload_bytes": float(uploaded)},
        )

    def aggregate(
        self, family_weights: dict[str, torch.Tensor], updates: list[ClientUpdate]
    ) -> dict[str, torch.Tensor]:
        family = updates[0].family
        return {k: v.clone() for k, v in self._models.get(family, family_weights).items()}

    def personalize(self, client: Client, server: SplitTrainer | None, generator: torch.Generator) -> None:
        """None: the broadcast already loaded the family's centrally trained model."""
