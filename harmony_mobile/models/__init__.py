"""Model families, heads, the per-family meta-model and device tiers."""

from harmony_mobile.models.families import FAMILIES, NUM_STAGES, SPLIT_DEPTHS
from harmony_mobile.models.family_model import FamilyModel, FrontEnd, parameter_names
from harmony_mobile.models.heads import Backend, InterfaceSpec, ProjectionHead
from harmony_mobile.models.tiers import Tier, TierSet, load_tiers

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
