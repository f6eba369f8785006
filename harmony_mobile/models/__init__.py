"""Model families, heads, the per-family meta-model and device tiers.

Names are imported on first use (PEP 562): the torch-free ones (constants, tiers) must not pull in
torch, because a serving replica installed without torch imports them too."""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

_SOURCE = {
    "FAMILIES": "constants",
    "NUM_STAGES": "constants",
    "SPLIT_DEPTHS": "constants",
    "InterfaceSpec": "constants",
    "FamilyModel": "family_model",
    "FrontEnd": "family_model",
    "parameter_names": "family_model",
    "Backend": "heads",
    "ProjectionHead": "heads",
    "Tier": "tiers",
    "TierSet": "tiers",
    "load_tiers": "tiers",
}

__all__ = [
    "FAMILIES",
    "NUM_STAGES",
    "SPLIT_DEPTHS",
    "Backend",
    "FamilyModel",
    "FrontEnd",
    "InterfaceSpec",
    "ProjectionHead",
    "Tier",
    "TierSet",
    "load_tiers",
    "parameter_names",
]

if TYPE_CHECKING:
    from harmony_mobile.models.constants import FAMILIES, NUM_STAGES, SPLIT_DEPTHS, InterfaceSpec
    from harmony_mobile.models.family_model import FamilyModel, FrontEnd, parameter_names
    from harmony_mobile.models.heads import Backend, ProjectionHead
    from harmony_mobile.models.tiers import Tier, TierSet, load_tiers


def __getattr__(name: str) -> Any:
    if name not in _SOURCE:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    value = getattr(importlib.import_module(f"{__name__}.{_SOURCE[name]}"), name)
    globals()[name] = value  # later look-ups skip this function
    return value
