"""Everything that crosses the client <-> server boundary, in training and in deployment.

Server-side code receives only these types. None of them has a field that can hold a label or a
function of one other than a label *token* (a keyed HMAC of the class name under the lineage's
label epoch, see protocol/label_tokens.py): the server sees features, tokens, split depths,
family, tier, model version and the label epoch. It computes its own cross-entropy in slot space
(federation/split_trainer.py) and sends back only dL/dz. tests/test_privacy_boundary.py and
tests/test_label_adversary.py fail if a field or a server entry point changes that.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch

from harmony_mobile.protocol.label_tokens import check_label_epoch


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
    round_id: int  # bookkeeping only: tokens are keyed by the label epoch, not the round
    label_epoch: str
    features: torch.Tensor  # (N, C_z, S_z, S_z) float32, clipped and noised when the option is on
    label_tokens: tuple[bytes, ...]  # N tokens, trunc64(HMAC(K_e, class name)); never a class id
    split_depths: tuple[int, ...]  # N depths the rows were extracted at
    family: str
    tier: str
    model_version: str

    def __post_init__(self) -> None:
        check_label_epoch(self.label_epoch)
        n = self.features.shape[0]
        if len(self.label_tokens) != n or len(self.split_depths) != n:
            raise ValueError(
                f"upload has {n} feature rows but {len(self.label_tokens)} tokens and {len(self.split_depths)} depths"
            )


@dataclass(frozen=True)
class InterfaceGradients:
    """Server -> client: dL_srv/dz for the uploaded features, L_srv = the server's slot-space CE
    (softmax over the uploading client's slots) + the contrastive term. The client scales it by its
    own weight gamma before back-propagating into its front-end."""

    client_id: str
    round_id: int
    grad_features: torch.Tensor  # same shape as FeatureUpload.features
    server_loss: float  # L_srv of this upload, for the client's metrics


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


SERVER_BOUND = (FeatureUpload, ClientUpdate, ReplayFeatures)
CLIENT_BOUND = (Broadcast, InterfaceGradients)
