"""Model families as lists of stages.

Every family is a backbone of exactly four stages. Spatial sizes are the same for every family so
that any split depth of any family can be connected to the one shared interface tensor:

    input 28x28 or 32x32  -> (28 is zero-padded to 32)
    stage 1: 32 -> 16      stage 2: 16 -> 8      stage 3: 8 -> 8      stage 4: 8 -> 4

Split depths 1..3 are the phone-side cut points (stage 4 only exists for full local models:
the `local`, `fedavg` and `centralized` baselines). No normalization layers: their running
statistics do not average well across non-IID clients and meta-weight interpolation, and plain
conv/ReLU nets of this size train fine without them.
"""

from __future__ import annotations

from collections.abc import Callable

import torch
import torch.nn.functional as F
from torch import nn

# NUM_STAGES and SPLIT_DEPTHS re-exported: the training code reads them from here
from harmony_mobile.models.constants import FAMILIES
from harmony_mobile.models.constants import NUM_STAGES as NUM_STAGES
from harmony_mobile.models.constants import SPLIT_DEPTHS as SPLIT_DEPTHS

BASE_CHANNELS = (16, 32, 64, 96)
STAGE_STRIDES = (2, 2, 1, 2)
CANVAS = 32  # every input is brought to 32x32 before stage 1


def stage_channels(width: float) -> tuple[int, ...]:
    """Output channels of each stage for a width multiplier (rounded to multiples of 8)."""
    if width <= 0:
        raise ValueError(f"width multiplier must be > 0, got {width}")
    return tuple(max(8, int(round(c * width / 8)) * 8) for c in BASE_CHANNELS)


def stage_spatial(depth: int) -> int:
    """Height (= width) of the activation after stage `depth`."""
    size = CANVAS
    for stride in STAGE_STRIDES[:depth]:
        size //= stride
    return size


class PadToCanvas(nn.Module):
    """Zero-pads 28x28 inputs to the 32x32 canvas (a no-op for 32x32), so stage sizes never depend on the data set."""

    def __init__(self, input_size: int):
        super().__init__()
        if input_size not in (28, 32):
            raise ValueError(f"model families take 28x28 or 32x32 inputs, got {input_size}x{input_size}")
        self.pad = (CANVAS - input_size) // 2

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.pad == 0:
            return x
        return F.pad(x, (self.pad, self.pad, self.pad, self.pad))


def conv_relu(c_in: int, c_out: int, stride: int = 1, groups: int = 1, kernel: int = 3) -> nn.Sequential:
    return nn.Sequential(nn.Conv2d(c_in, c_out, kernel, stride, kernel // 2, groups=groups), nn.ReLU())


class InvertedResidual(nn.Module):
    """MobileNetV2 block: 1x1 expand, 3x3 depthwise (carries the stride), 1x1 linear projection."""

    def __init__(self, c_in: int, c_out: int, stride: int, expand: int = 4):
        super().__init__()
        hidden = c_in * expand
        self.block = nn.Sequential(
            conv_relu(c_in, hidden, kernel=1),
            conv_relu(hidden, hidden, stride=stride, groups=hidden),
            nn.Conv2d(hidden, c_out, 1),
        )
        self.use_residual = stride == 1 and c_in == c_out

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out = self.block(x)
        return x + out if self.use_residual else out


class BasicBlock(nn.Module):
    """ResNet basic block: two 3x3 convs and a (projected when shapes change) shortcut."""

    def __init__(self, c_in: int, c_out: int, stride: int):
        super().__init__()
        self.conv1 = nn.Conv2d(c_in, c_out, 3, stride, 1)
        self.conv2 = nn.Conv2d(c_out, c_out, 3, 1, 1)
        self.shortcut = nn.Identity() if stride == 1 and c_in == c_out else nn.Conv2d(c_in, c_out, 1, stride)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out = F.relu(self.conv1(x))
        return F.relu(self.conv2(out) + self.shortcut(x))


def cnn_stage(c_in: int, c_out: int, stride: int) -> nn.Module:
    return nn.Sequential(conv_relu(c_in, c_out, stride), conv_relu(c_out, c_out))


def mobilenet_stage(c_in: int, c_out: int, stride: int) -> nn.Module:
    return nn.Sequential(InvertedResidual(c_in, c_out, stride), InvertedResidual(c_out, c_out, 1))


def resnet_stage(c_in: int, c_out: int, stride: int) -> nn.Module:
    return BasicBlock(c_in, c_out, stride)


STAGE_BUILDERS: dict[str, Callable[[int, int, int], nn.Module]] = {
    "cnn": cnn_stage,
    "mobilenet": mobilenet_stage,
    "resnet": resnet_stage,
}
if tuple(STAGE_BUILDERS) != FAMILIES:  # the serving path reads the names from constants.py
    raise ImportError(f"constants.FAMILIES {FAMILIES} != the stage builders {tuple(STAGE_BUILDERS)}")


def build_stages(family: str, in_channels: int, input_size: int, width: float = 1.0) -> nn.ModuleList:
    """The four stages of a family. Stage 1 starts by padding the input to the 32x32 canvas."""
    if family not in STAGE_BUILDERS:
        raise ValueError(f"unknown model family {family!r}; known: {', '.join(FAMILIES)}")
    if in_channels not in (1, 3):
        raise ValueError(f"model families take 1 or 3 input channels, got {in_channels}")
    channels = stage_channels(width)
    builder = STAGE_BUILDERS[family]
    stages = []
    c_in = in_channels
    for index, (c_out, stride) in enumerate(zip(channels, STAGE_STRIDES, strict=True)):
        stage = builder(c_in, c_out, stride)
        if index == 0:
            stage = nn.Sequential(PadToCanvas(input_size), stage)
        stages.append(stage)
        c_in = c_out
    stages = nn.ModuleList(stages)
    for module in stages.modules():
        if isinstance(module, nn.Conv2d):
            nn.init.kaiming_normal_(module.weight, nonlinearity="relu")
            nn.init.zeros_(module.bias)
    return stages
