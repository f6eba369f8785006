"""A simulated phone: its personalized model, its own data, and the federation secret.

Client-side code may touch labels; nothing here is sent anywhere except through the message
types of messages.py.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch

from harmony_mobile.federation.messages import Broadcast
from harmony_mobile.models import FamilyModel, Tier, parameter_names
from harmony_mobile.privacy.label_tokens import label_tokens, round_key


@dataclass
class Client:
    client_id: int
    tier: Tier
    classes: tuple[int, ...]  # ID classes; everything else is OOD for this client
    model: FamilyModel
    train_x: torch.Tensor
    train_y: torch.Tensor
    val_x: torch.Tensor
    val_y: torch.Tensor
    federation_secret: bytes  # provisioned at enrolment; never sent to the server
    threshold: float = 1.0
    _round_keys: dict[int, bytes] = field(default_factory=dict, repr=False)

    @property
    def name(self) -> str:
        return f"client-{self.client_id:03d}"

    @property
    def split_depth(self) -> int:
        return self.tier.split_depth

    def receive(self, broadcast: Broadcast) -> None:
        """Start from the meta-weights the server broadcast for this client's family."""
        if broadcast.family != self.tier.family:
            raise ValueError(
                f"{self.name} runs family {self.tier.family!r}, got meta-weights of {broadcast.family!r}"
            )
        self.model.load_state_dict(broadcast.meta_weights)

    def held_parameters(self, full: bool = False) -> dict[str, torch.nn.Parameter]:
        """The parameters this client holds (its depth's stages, exits, connectors; or the full model)."""
        names = parameter_names(self.model, self.split_depth, full=full)
        return {n: p for n, p in self.model.named_parameters() if n in names}

    def batch(self, size: int, generator: torch.Generator) -> tuple[torch.Tensor, torch.Tensor]:
        index = torch.randint(len(self.train_y), (size,), generator=generator)
        return self.train_x[index], self.train_y[index]

    def absent_class_mask(self) -> torch.Tensor:
        """0 for the client's own classes, -inf for the rest: added to logits to restrict a softmax."""
        num_classes = self.model.num_classes
        mask = torch.full((num_classes,), float("-inf"))
        mask[list(self.classes)] = 0.0
        return mask

    def tokens(self, round_id: int, labels: torch.Tensor) -> tuple[bytes, ...]:
        if round_id not in self._round_keys:
            self._round_keys[round_id] = round_key(self.federation_secret, round_id)
        return label_tokens(self._round_keys[round_id], labels.tolist())
