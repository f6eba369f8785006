"""`fedproto` baseline (docs/ALGORITHM.md, Baselines): prototype exchange, the classic answer to model
heterogeneity (Tan et al., "FedProto: Federated Prototype Learning across Heterogeneous Clients",
AAAI 2022), in the hybrid split setting.

Clients of different families share no weights, only class prototypes: the mean interface feature
z = phi_d(B_1..d(x)) of each class, keyed by its label token, never by the class. In FedProto the
prototype space is the input of each client's decision layer, so the classification loss shapes
it; the exit head e_d reads the stage activation, not z, so each client also keeps a linear
decision layer W_k on z (on the phone, never shared). One local step of client k on a batch
(x, y), at its fixed split depth d:

    loss = CE(e_d(B_1..d(x)), y) + CE(W_k z, y) + lambda * MSE(z, P[token(y)])

where P are the global prototypes of the previous round (rows whose token has none yet contribute
only the two CE terms). Without the CE on z, phi_d learns only from the MSE towards prototypes
that are means of its own random initial output: z then carries too little class information for
any fallback (measured on the standard budget: the server answered at chance). The client's own
model carries over from round to round (no weight averaging), and at the end of a round it uploads
the per-token means of the features it computed, with their counts; the server averages them per
token over every client of every family, so the MSE term pulls each family's features of a class
to one shared point of the interface space.

Fallback: the same server back-end g as the split methods, trained on the uploaded features and
tokens with the server CE (softmax over the uploading client's own slots, as HARMONY's); its
dL/dz is NOT back-propagated into the front-end (that feedback is what split learning adds and
prototype learning does not have). Since the front-ends never adapt to g, g adapts to them: it
also trains on the uploads of the final personalization, i.e. on the features it will serve.
FedProto's own global inference, the slot of the nearest global prototype, was measured as the
alternative fallback and served ID samples slightly better but OOD mixes worse than g (see
docs/ALGORITHM.md, Baselines). The phone exits by max-softmax with tau calibrated like HARMONY's.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from pydantic import Field
from torch import nn

from harmony_mobile.algorithms.base import SplitMethod, SplitTrainingConfig, calibrate_client, round_optimizer
from harmony_mobile.federation.client import Client
from harmony_mobile.federation.split_trainer import SplitTrainer, SplitTrainerConfig
from harmony_mobile.protocol.messages import ClientUpdate

FLOAT_BYTES = 4
TOKEN_BYTES = 8
COUNT_BYTES = 4


class FedProtoConfig(SplitTrainingConfig):
    """The split budget (fine-tuning with the same loss for `personalize_epochs`), plus lambda."""

    proto_weight: float = Field(default=1.0, ge=0, description="lambda: weight of the prototype MSE")


class PrototypeStore:
    """The server's side of the exchange: per-token sums and counts of one round, and the global
    prototypes (means) of the previous round. It only ever sees tokens and feature means."""

    def __init__(self) -> None:
        self.round_id: int | None = None
        self.global_prototypes: dict[bytes, torch.Tensor] = {}
        self._sums: dict[bytes, torch.Tensor] = {}
        self._counts: dict[bytes, int] = {}

    def start_round(self, round_id: int) -> None:
        """A new round: last round's uploads become the global prototypes."""
        if round_id == self.round_id:
            return
        if self._sums:
            self.global_prototypes = {t: self._sums[t] / self._counts[t] for t in self._sums}
        self._sums, self._counts, self.round_id = {}, {}, round_id

    def upload(self, prototypes: dict[bytes, tuple[torch.Tensor, int]]) -> None:
        for token, (mean, count) in prototypes.items():
            self._sums[token] = self._sums.get(token, torch.zeros_like(mean)) + mean * count
            self._counts[token] = self._counts.get(token, 0) + count


class FedProto(SplitMethod):
    name = "fedproto"
    Config = FedProtoConfig

    def __init__(self, config: FedProtoConfig | None = None):
        super().__init__(config)
        self.store = PrototypeStore()
        self._weights: dict[str, dict[str, torch.Tensor]] = {}  # client name -> its own model
        self._optimizer_state: dict[str, dict] = {}
        self._decision_layers: dict[str, nn.Linear] = {}

    def split_trainer_config(self) -> SplitTrainerConfig:
        return SplitTrainerConfig(
            lr=self.config.server_lr,
            decay_rounds=self.config.decay_rounds,
            restrict_to_client_slots=True,
            logit_adjustment=self.config.server_logit_adjustment,
            contrastive=None,
        )

    def _restore(self, client: Client) -> None:
        if client.name in self._weights:
            client.model.load_state_dict(self._weights[client.name])

    def _decision_layer(self, client: Client) -> nn.Linear:
        """The client's own linear classifier on z (kept on the phone, never shared). Its init does
        not touch the global random stream, which seeds the rest of the run."""
        if client.name not in self._decision_layers:
            with torch.random.fork_rng(devices=[]):
                torch.manual_seed(client.client_id)
                self._decision_layers[client.name] = nn.Linear(
                    client.model.interface.numel, client.model.num_classes
                )
        return self._decision_layers[client.name]

    def _trained_parameters(self, client: Client) -> list[nn.Parameter]:
        return [*client.held_parameters().values(), *self._decision_layer(client).parameters()]

    def _step(
        self, client: Client, server: SplitTrainer, optimizer, images, labels, round_id: int
    ) -> tuple[float, torch.Tensor, tuple[bytes, ...]]:
        """One step of exit CE + decision-layer CE on z + lambda * prototype MSE; the uploaded features
        also train g (not the front-end)."""
        optimizer.zero_grad()
        exit_logits, features = client.model(images, client.split_depth)
        # tokens of the lineage's label epoch: fixed for the whole training, so prototypes of one
        # round match the next round's rows (docs/ALGORITHM.md "Label tokens")
        upload, sent = client.upload(features, labels, (client.split_depth,) * len(labels), round_id)
        tokens = upload.label_tokens
        embedding_logits = self._decision_layer(client)(features.flatten(1))
        loss = F.cross_entropy(exit_logits, labels) + F.cross_entropy(embedding_logits, labels)
        known = [i for i, t in enumerate(tokens) if t in self.store.global_prototypes]
        if known and self.config.proto_weight > 0:
            targets = torch.stack([self.store.global_prototypes[tokens[i]] for i in known])
            loss = loss + self.config.proto_weight * F.mse_loss(features[known], targets)
        loss.backward()
        optimizer.step()
        server.step(upload)  # g learns from the upload; its dL/dz is not used
        return loss.item(), sent.detach(), tokens

    def client_round(
        self, client: Client, server: SplitTrainer, round_id: int, generator: torch.Generator
    ) -> ClientUpdate:
        c = self.config
        self.store.start_round(round_id)
        self._restore(client)
        state = self._optimizer_state.get(client.name)
        optimizer = round_optimizer(self._trained_parameters(client), c, round_id, state)
        sums: dict[bytes, torch.Tensor] = {}
        counts: dict[bytes, int] = {}
        total = 0.0
        for _ in range(c.local_steps):
            images, labels = client.batch(c.batch_size, generator)
            loss, features, tokens = self._step(client, server, optimizer, images, labels, round_id)
            total += loss
            for row, token in zip(features, tokens, strict=True):
                sums[token] = sums.get(token, torch.zeros_like(row)) + row
                counts[token] = counts.get(token, 0) + 1
        prototypes = {t: (sums[t] / counts[t], counts[t]) for t in sums}
        self.store.upload(prototypes)
        self._weights[client.name] = {k: v.detach().clone() for k, v in client.model.state_dict().items()}
        self._optimizer_state[client.name] = optimizer.state_dict()
        upload_bytes = sum(
            m.numel() * FLOAT_BYTES + TOKEN_BYTES + COUNT_BYTES for m, _ in prototypes.values()
        )
        return ClientUpdate(
            client_id=client.name,
            round_id=round_id,
            family=client.tier.family,
            tier=client.tier.name,
            weights={},  # no weights leave the phone: only prototypes
            num_samples=len(client.train_y),
            metrics={"loss": total / c.local_steps, "prototype_upload_bytes": float(upload_bytes)},
        )

    def aggregate(
        self, family_weights: dict[str, torch.Tensor], updates: list[ClientUpdate]
    ) -> dict[str, torch.Tensor]:
        return family_weights

    def personalize(self, client: Client, server: SplitTrainer, generator: torch.Generator) -> None:
        c = self.config
        self.store.start_round(-1)  # the last round's uploads become the global prototypes
        self._restore(client)
        if c.personalize_epochs > 0:
            optimizer = torch.optim.Adam(self._trained_parameters(client), lr=c.lr)
            batch = c.personalization_batch_size
            steps = c.personalize_epochs * max(1, len(client.train_y) // batch)
            for _ in range(steps):
                images, labels = client.batch(batch, generator)
                self._step(client, server, optimizer, images, labels, -1)
        calibrate_client(client, c.calibration_target, self.exit_rule)
