"""Everything that crosses the client <-> server boundary, in training and in deployment.

Server-side code receives only these types. None of them has a field that can hold a label:
the server sees features, label *tokens* (keyed HMACs, see privacy/label_tokens.py), split
depths, family, tier and model version, and gradients w.r.t. its own logits that the client
computed. tests/test_privacy_boundary.py fails if a field or a server entry point changes that.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch


@dataclass(frozen=True)
class Broadcast:
    """Server -> client at the start of a round: the meta-weights of the client's family."""

    round_id: int
    family: str
    meta_weights: dict[str, torch.Tensor]
    backend_version: str


@dataclass(frozen=True)
class FeatureUpload:
    """Client -> server: interface features of one batch, one row per (sample, variant)."""

    client_id: str
    round_id: int
    features: torch.Tensor  # (N, C_z, S_z, S_z) float32
    label_tokens: tuple[bytes, ...]  # N tokens, trunc64(HMAC(K_r, y)); never a class id
    split_depths: tuple[int, ...]  # N depths the rows were extracted at
    family: str
    tier: str
    model_version: str

    def __post_init__(self) -> None:
        n = self.features.shape[0]
        if len(self.label_tokens) != n or len(self.split_depths) != n:
            raise ValueError(
                f"upload has {n} feature rows but {len(self.label_tokens)} tokens and {len(self.split_depths)} depths"
            )


@dataclass(frozen=True)
class ServerLogits:
    """Server -> client: g(z) for an upload, so the client can compute CE against its own labels."""

    client_id: str
    round_id: int
    logits: torch.Tensor  # (N, C)


@dataclass(frozen=True)
class LogitGradients:
    """Client -> server: dL_srv/dlogits, computed by the client from its labels (U-shaped split)."""

    client_id: str
    round_id: int
    grad_logits: torch.Tensor  # (N, C)


@dataclass(frozen=True)
class InterfaceGradients:
    """Server -> client: dL/dz for the uploaded features (server CE + contrastive alignment)."""

    client_id: str
    round_id: int
    grad_features: torch.Tensor  # same shape as FeatureUpload.features


@dataclass(frozen=True)
class ClientUpdate:
    """Client -> server at the end of a round: new values of the parameters it holds."""

    client_id: str
    round_id: int
    family: str
    tier: str
    weights: dict[str, torch.Tensor]
    num_samples: int
    metrics: dict[str, float] = field(default_factory=dict)


@dataclass(frozen=True)
class ReplayFeatures:
    """Client -> server once, at the end of training: interface features of a sample of the client's
    training images through its final front-end, with no label and no token. The server keeps them
    with the back-end as the replay set its alignment rounds distill on (federation/replay.py)."""

    client_id: str
    features: torch.Tensor  # (N, C_z, S_z, S_z)
    split_depth: int
    family: str
    tier: str


SERVER_BOUND = (FeatureUpload, LogitGradients, ClientUpdate, ReplayFeatures)
CLIENT_BOUND = (Broadcast, ServerLogits, InterfaceGradients)
