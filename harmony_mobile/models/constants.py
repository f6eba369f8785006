"""What the serving path knows about the models without importing torch: family names, split
depths, the interface tensor's shape and the loss temperatures alignment rounds default to.

A replica installed with the `[server]` extra alone has no torch; its modules import these names
from here (families.py, heads.py and losses.py re-export them for the training code)."""

from __future__ import annotations

from dataclasses import dataclass

# families.py checks at import that its stage builders are exactly these families
FAMILIES = ("cnn", "mobilenet", "resnet")
SPLIT_DEPTHS = (1, 2, 3)
NUM_STAGES = 4

# The SupCon temperature the training server and the fallback server's alignment round use unless
# configured (Khosla et al.'s value). The losses take their temperature as a required argument,
# so this is the only place the default is written.
SUPCON_TEMPERATURE = 0.1
# The distillation temperature of the alignment round unless configured (Hinton et al.'s soft targets).
DISTILLATION_TEMPERATURE = 2.0


@dataclass(frozen=True)
class InterfaceSpec:
    """The one tensor shape every family and split depth hands to the server: channels x size x size."""

    channels: int = 64
    size: int = 8

    @property
    def shape(self) -> tuple[int, int, int]:
        return (self.channels, self.size, self.size)

    @property
    def numel(self) -> int:
        return self.channels * self.size * self.size
