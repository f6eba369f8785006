"""The server side of split training: back-end g, projection head h, and nothing else.

Every entry point takes a message from messages.py. The server never sees a label: the
cross-entropy of its logits is computed by the client, which returns only dL/dlogits; the
contrastive term groups rows by label *token*, which it cannot map to a class.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from pydantic import BaseModel, Field

from harmony_mobile.algorithms.losses import supcon_loss
from harmony_mobile.federation.messages import (
    ClientUpdate,
    FeatureUpload,
    InterfaceGradients,
    LogitGradients,
    ServerLogits,
)
from harmony_mobile.models import Backend, ProjectionHead
from harmony_mobile.privacy.label_tokens import tokens_to_groups


class ServerConfig(BaseModel):
    """How the server trains during federated rounds."""

    lr: float = Field(default=1e-3, gt=0, description="Adam learning rate of g and h")
    contrastive_weight: float = Field(default=0.5, ge=0, description="weight of SupCon on h(g(z)); 0 = off")
    temperature: float = Field(default=0.1, gt=0, description="SupCon temperature")
    bank_size: int = Field(
        default=512,
        ge=0,
        description="projected embeddings of earlier uploads in the same round, kept (detached, MoCo-style "
        "memory bank) as extra contrastive candidates, so positives come from other clients and families",
    )


@dataclass
class _Pending:
    features: torch.Tensor  # leaf, requires grad: dL/dz is read from it
    logits: torch.Tensor
    embeddings: torch.Tensor | None
    tokens: tuple[bytes, ...]


class SplitServer:
    def __init__(self, backend: Backend, projection: ProjectionHead, config: ServerConfig):
        self.backend = backend
        self.projection = projection
        self.config = config
        self.optimizer = torch.optim.Adam([*backend.parameters(), *projection.parameters()], lr=config.lr)
        self.round_id = -1
        self._pending: dict[str, _Pending] = {}
        self._bank_embeddings: list[torch.Tensor] = []
        self._bank_tokens: list[bytes] = []

    def start_round(self, round_id: int) -> None:
        """Tokens are only comparable within one round (one key epoch): clear the bank."""
        self.round_id = round_id
        self._bank_embeddings, self._bank_tokens = [], []
        self._pending.clear()

    def forward(self, upload: FeatureUpload) -> ServerLogits:
        """Logits of g for the uploaded features; the graph is kept until the client's gradients arrive."""
        features = upload.features.detach().clone().requires_grad_(True)
        penultimate = self.backend.features(features)
        logits = self.backend.classifier(penultimate)
        embeddings = self.projection(penultimate) if self.config.contrastive_weight > 0 else None
        self._pending[upload.client_id] = _Pending(features, logits, embeddings, upload.label_tokens)
        return ServerLogits(upload.client_id, upload.round_id, logits.detach())

    def backward(self, gradients: LogitGradients, update: bool = True) -> InterfaceGradients:
        """Back-propagate the client's dL/dlogits (+ SupCon) into g, h and the features; return dL/dz.

        `update=False` leaves g and h unchanged (final personalization against a frozen server).
        """
        pending = self._pending.pop(gradients.client_id)
        # <logits, dL/dlogits> has exactly the client's loss gradient w.r.t. everything upstream.
        loss = (pending.logits * gradients.grad_logits).sum()
        if pending.embeddings is not None and update:
            loss = loss + self.config.contrastive_weight * self._contrastive_loss(pending)
        self.optimizer.zero_grad()
        loss.backward()
        if update:
            self.optimizer.step()
            self._remember(pending)
        return InterfaceGradients(gradients.client_id, gradients.round_id, pending.features.grad.detach())

    def _contrastive_loss(self, pending: _Pending) -> torch.Tensor:
        embeddings, tokens = pending.embeddings, list(pending.tokens)
        if self._bank_embeddings:
            embeddings = torch.cat([embeddings, *self._bank_embeddings])
            tokens += self._bank_tokens
        groups = torch.tensor(tokens_to_groups(tokens))
        return supcon_loss(embeddings, groups, self.config.temperature)

    def _remember(self, pending: _Pending) -> None:
        if self.config.bank_size == 0 or pending.embeddings is None:
            return
        self._bank_embeddings.append(pending.embeddings.detach())
        self._bank_tokens.extend(pending.tokens)
        while len(self._bank_tokens) > self.config.bank_size:
            dropped = self._bank_embeddings.pop(0)
            del self._bank_tokens[: len(dropped)]

    @torch.no_grad()
    def infer(self, features: torch.Tensor) -> torch.Tensor:
        """Fallback inference: logits of g."""
        return self.backend(features)


def aggregate_by_parameter(
    current: dict[str, torch.Tensor], updates: list[ClientUpdate]
) -> dict[str, torch.Tensor]:
    """HeteroFL-style averaging: each parameter is the sample-weighted mean over the clients that
    hold it; a parameter nobody holds keeps its value (a shallow tier holds fewer stages)."""
    merged = {}
    for name, value in current.items():
        holders = [u for u in updates if name in u.weights]
        if not holders:
            merged[name] = value
            continue
        total = sum(u.num_samples for u in holders)
        merged[name] = sum(u.weights[name] * (u.num_samples / total) for u in holders)
    return merged
