"""The small heads around the backbones: exit classifiers, connectors to the shared interface
space, the server back-end `g` and the projection head `h` used only by the contrastive loss.

Every pooling is `mean(keepdim=True)` followed by `reshape`: XNNPACK delegates that pattern
fully, while `mean(keepdim=False)` or `flatten` leave undelegated ops in the graph
(measured with executorch 1.5.1).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from harmony_mobile.models.constants import InterfaceSpec


def global_pool(x: torch.Tensor) -> torch.Tensor:
    """N x C x H x W -> N x C, written so that XNNPACK delegates it."""
    return x.mean(dim=(2, 3), keepdim=True).reshape(-1, x.shape[1])


class ExitHead(nn.Module):
    """Early-exit classifier over all classes, on a stage activation.

    A strided conv, then average pooling to a 2x2 grid (not a global pool: a shallow stage's
    channels say little once their spatial layout is averaged away), then a small MLP.
    """

    def __init__(
        self, in_channels: int, in_size: int, num_classes: int, channels: int = 32, hidden: int = 64
    ):
        super().__init__()
        if in_size < 4 or in_size % 4:
            raise ValueError(f"exit heads need a stage size divisible by 4, got {in_size}")
        self.conv = nn.Conv2d(in_channels, channels, 3, 2, 1)
        self.pool = nn.AvgPool2d(in_size // 4)  # (in_size / 2) -> 2x2
        self.flat_features = channels * 4
        self.mlp = nn.Sequential(
            nn.Linear(self.flat_features, hidden), nn.ReLU(), nn.Linear(hidden, num_classes)
        )

    def forward(self, activation: torch.Tensor) -> torch.Tensor:
        pooled = self.pool(F.relu(self.conv(activation)))
        return self.mlp(pooled.reshape(-1, self.flat_features))


class Connector(nn.Module):
    """Maps a stage activation (in_channels x in_size^2) to the interface tensor.

    A strided conv when the stage is larger than the interface, a 1x1 conv when it matches.
    """

    def __init__(self, in_channels: int, in_size: int, interface: InterfaceSpec):
        super().__init__()
        if in_size < interface.size or in_size % interface.size:
            raise ValueError(
                f"a stage of size {in_size}x{in_size} cannot connect to a {interface.size}x{interface.size} "
                "interface: the interface size must divide the stage size"
            )
        ratio = in_size // interface.size
        kernel, padding = (1, 0) if ratio == 1 else (3, 1) if ratio == 2 else (ratio, 0)
        self.conv = nn.Conv2d(in_channels, interface.channels, kernel, ratio, padding)

    def forward(self, activation: torch.Tensor) -> torch.Tensor:
        return F.relu(self.conv(activation))


class Backend(nn.Module):
    """The server back-end g: interface tensor -> class logits. Shared by all families."""

    def __init__(self, interface: InterfaceSpec, num_classes: int, width: int = 128):
        super().__init__()
        self.interface = interface
        self.num_classes = num_classes
        self.body = nn.Sequential(
            nn.Conv2d(interface.channels, width, 3, 2 if interface.size >= 4 else 1, 1),
            nn.ReLU(),
            nn.Conv2d(width, width, 3, 1, 1),
            nn.ReLU(),
        )
        self.classifier = nn.Linear(width, num_classes)
        self.feature_dim = width

    def features(self, z: torch.Tensor) -> torch.Tensor:
        """Penultimate features (what the projection head and the alignment score look at)."""
        return global_pool(self.body(z))

    def forward(self, z: torch.Tensor) -> torch.Tensor:
        return self.classifier(self.features(z))


class ProjectionHead(nn.Module):
    """h: penultimate back-end features -> unit vectors for supervised contrastive alignment."""

    def __init__(self, in_dim: int = 128, out_dim: int = 128):
        super().__init__()
        self.mlp = nn.Sequential(nn.Linear(in_dim, in_dim), nn.ReLU(), nn.Linear(in_dim, out_dim))

    def forward(self, features: torch.Tensor) -> torch.Tensor:
        return F.normalize(self.mlp(features), dim=1)
