"""`splitgp` baseline (docs/ALGORITHM.md, Baselines): SplitGP (Han et al., "SplitGP: Achieving both
generalization and personalization in federated learning", INFOCOM 2023), the predecessor.

One local step of client k at its fixed split depth d:
    loss = gamma * CE(e_d(B_1..d(x)), y) + (1 - gamma) * CE(g(phi_d(B_1..d(x))), y)
The front-end moves with both terms, the server back-end g with the second one (no contrastive
alignment, no simulated extractors, no random split depth).
Personalization: the client model the next round (and the final one) starts from is
    lambda * own + (1 - lambda) * family average
of the parameters it holds, where `own` is its model after its last local training.
Fallback: exit iff the exit head's negative entropy is >= the client's threshold, calibrated on the
client's validation split to the same local-exit accuracy target as HARMONY.

Wire difference: the original sends labels to the server, which computes the server CE itself over
all classes. Here the server computes the same CE over slots from label tokens (`split_step`, the
full softmax over every slot: `restrict_to_client_slots=False`), so the gradients are those of
the original up to a renaming of the classes. The benchmark counts 8 bytes per uploaded row for
what the original sends as an int64 label (our 8-byte label token takes its place on the wire).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from pydantic import Field

from harmony_mobile.algorithms.base import (
    SplitMethod,
    SplitTrainingConfig,
    calibrate_client,
    client_update,
    personalize_split,
    round_optimizer,
    split_step,
)
from harmony_mobile.federation.client import Client
from harmony_mobile.federation.split_trainer import SplitTrainer, SplitTrainerConfig, aggregate_by_parameter
from harmony_mobile.protocol.messages import ClientUpdate


class SplitGPConfig(SplitTrainingConfig):
    """The split budget (`personalize_epochs`: optional fine-tuning after the mix, SplitGP has none;
    the entropy threshold is calibrated to `calibration_target`), plus SplitGP's own knobs."""

    gamma: float = Field(
        default=0.5, ge=0, le=1, description="weight of the exit CE; 1 - gamma for the server CE"
    )
    mix_lambda: float = Field(
        default=0.2,
        ge=0,
        le=1,
        description="lambda: weight of the client's own model in the personalized mix",
    )
    restricted_softmax: bool = Field(
        default=False,
        description="server CE over the uploading client's slots only, as HARMONY's (splitgp-restricted); "
        "False: over every slot, as published",
    )


class SplitGP(SplitMethod):
    name = "splitgp"
    own_exit_rule = "neg_entropy"
    Config = SplitGPConfig

    def __init__(self, config: SplitGPConfig | None = None):
        super().__init__(config)
        self._own: dict[str, dict[str, torch.Tensor]] = {}  # client name -> its model after local training

    def split_trainer_config(self) -> SplitTrainerConfig:
        return SplitTrainerConfig(
            lr=self.config.server_lr,
            decay_rounds=self.config.decay_rounds,
            restrict_to_client_slots=self.config.restricted_softmax,
            logit_adjustment=self.config.server_logit_adjustment,
            contrastive=None,
        )

    @torch.no_grad()
    def _mix(self, client: Client) -> None:
        """Held parameters <- lambda * own + (1 - lambda) * (broadcast family average)."""
        own, lam = self._own.get(client.name), self.config.mix_lambda
        if own is None or lam == 0:
            return
        for name, p in client.held_parameters().items():
            p.copy_(lam * own[name] + (1 - lam) * p)

    def client_round(
        self, client: Client, server: SplitTrainer, round_id: int, generator: torch.Generator
    ) -> ClientUpdate:
        c = self.config
        self._mix(client)
        held = client.held_parameters()
        optimizer = round_optimizer(held.values(), c, round_id)
        depth = client.split_depth
        exit_total = server_total = 0.0
        for _ in range(c.local_steps):
            images, labels = client.batch(c.batch_size, generator)
            optimizer.zero_grad()
            exit_logits, features = client.model(images, depth)
            exit_ce = F.cross_entropy(exit_logits, labels)
            if c.gamma < 1:  # gamma = 1: the server CE has weight 0, nothing to upload
                server_total += split_step(
                    client,
                    server,
                    features,
                    labels,
                    (depth,) * len(labels),
                    round_id,
                    1 - c.gamma,
                    client_loss=c.gamma * exit_ce,
                )
            else:
                exit_ce.backward()
            optimizer.step()
            exit_total += exit_ce.item()
        if c.mix_lambda > 0:
            self._own[client.name] = {name: p.detach().clone() for name, p in held.items()}
        metrics = {"exit_loss": exit_total / c.local_steps, "server_ce": server_total / c.local_steps}
        return client_update(client, round_id, metrics)

    aggregate = staticmethod(aggregate_by_parameter)

    def personalize(self, client: Client, server: SplitTrainer, generator: torch.Generator) -> None:
        c = self.config
        self._mix(client)
        if c.personalize_epochs > 0:
            batch = c.personalization_batch_size
            personalize_split(client, server, c.personalize_epochs, batch, c.lr, 1 - c.gamma, generator)
        calibrate_client(client, c.calibration_target, self.exit_rule)
