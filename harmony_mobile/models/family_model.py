"""A family's meta-model (all stages, exits and connectors) and the front-end a phone runs.

Parameter names are stable across depths, `stages.{i}.*`, `exits.{d}.*`, `connectors.{d}.*`, so
a shallow client's update is a subset of a deep client's and aggregation can average each
parameter over exactly the clients that hold it (HeteroFL-style).
"""

from __future__ import annotations

import torch
from torch import nn

from harmony_mobile.models.families import (
    NUM_STAGES,
    SPLIT_DEPTHS,
    build_stages,
    stage_channels,
    stage_spatial,
)
from harmony_mobile.models.heads import Connector, ExitHead, InterfaceSpec


def check_depth(depth: int, allowed: tuple[int, ...] = SPLIT_DEPTHS) -> None:
    if depth not in allowed:
        raise ValueError(f"split depth must be one of {allowed}, got {depth}")


class FamilyModel(nn.Module):
    """Everything one family can run: 4 stages, an exit head per depth 1..4, a connector per split depth 1..3.

    `exits["4"]` is the classifier of the full-depth model used by the no-split baselines.
    """

    def __init__(
        self,
        family: str,
        in_channels: int,
        input_size: int,
        num_classes: int,
        width: float = 1.0,
        interface: InterfaceSpec = InterfaceSpec(),
    ):
        super().__init__()
        self.family = family
        self.in_channels = in_channels
        self.input_size = input_size
        self.num_classes = num_classes
        self.width = width
        self.interface = interface
        channels = stage_channels(width)
        self.stages = build_stages(family, in_channels, input_size, width)
        self.exits = nn.ModuleDict(
            {
                str(d): ExitHead(channels[d - 1], stage_spatial(d), num_classes)
                for d in range(1, NUM_STAGES + 1)
            }
        )
        self.connectors = nn.ModuleDict(
            {str(d): Connector(channels[d - 1], stage_spatial(d), interface) for d in SPLIT_DEPTHS}
        )

    def extract(self, x: torch.Tensor, depth: int) -> torch.Tensor:
        """The activation after stage `depth` (1..4)."""
        check_depth(depth, tuple(range(1, NUM_STAGES + 1)))
        for stage in self.stages[:depth]:
            x = stage(x)
        return x

    def forward(self, x: torch.Tensor, depth: int) -> tuple[torch.Tensor, torch.Tensor]:
        """(exit logits, interface features) at split depth `depth`."""
        check_depth(depth)
        activation = self.extract(x, depth)
        return self.exits[str(depth)](activation), self.connectors[str(depth)](activation)

    def classify_full(self, x: torch.Tensor) -> torch.Tensor:
        """Logits of the full 4-stage model (no split), for the baselines that never fall back."""
        return self.exits[str(NUM_STAGES)](self.extract(x, NUM_STAGES))

    def front_end(self, depth: int) -> FrontEnd:
        """The module a phone of this split depth runs (shares weights with this model)."""
        check_depth(depth)
        return FrontEnd(list(self.stages[:depth]), self.exits[str(depth)], self.connectors[str(depth)])


def parameter_names(model: FamilyModel, max_depth: int, full: bool = False) -> set[str]:
    """State-dict keys a client of split depth `max_depth` holds: stages 1..max_depth and the
    exits/connectors of every depth it can run (1..max_depth). `full=True` is the whole 4-stage
    classifier of the no-split baselines."""
    if full:
        prefixes = [f"stages.{i}." for i in range(NUM_STAGES)] + [f"exits.{NUM_STAGES}."]
    else:
        check_depth(max_depth)
        prefixes = [f"stages.{i}." for i in range(max_depth)]
        prefixes += [f"exits.{d}." for d in range(1, max_depth + 1)]
        prefixes += [f"connectors.{d}." for d in range(1, max_depth + 1)]
    return {name for name in model.state_dict() if name.startswith(tuple(prefixes))}


class FrontEnd(nn.Module):
    """What ships to a phone: stages 1..d, the exit head and the connector. Returns (exit_logits, features)."""

    def __init__(self, stages: list[nn.Module], exit_head: nn.Module, connector: nn.Module):
        super().__init__()
        self.stages = nn.Sequential(*stages)
        self.exit_head = exit_head
        self.connector = connector

    @property
    def split_depth(self) -> int:
        return len(self.stages)

    def forward(self, image: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        activation = self.stages(image)
        return self.exit_head(activation), self.connector(activation)
