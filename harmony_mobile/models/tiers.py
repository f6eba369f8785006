"""Device tiers: data, not code.

A tier says which front-end a class of phones runs (family, split depth, width), how it is
quantized and for which backends it is exported, and when it answers locally (threshold).
`default_tiers.yaml` beside this file holds the defaults; `load_tiers(path)` reads another file
and a bad file fails with a pydantic ValidationError naming the field.
"""

from __future__ import annotations

from pathlib import Path
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from harmony_mobile.models.constants import FAMILIES, SPLIT_DEPTHS
from harmony_mobile.yaml_files import read_yaml

DEFAULT_TIERS_FILE = Path(__file__).with_name("default_tiers.yaml")

Backend = Literal["xnnpack", "coreml"]
# fp32 / int8 (PT2E static per-channel) are ExecuTorch XNNPACK variants;
# coreml-fp16 / coreml-int8 (weights) / coreml-palette4 are Core ML variants.
Quantization = Literal["fp32", "int8", "coreml-fp16", "coreml-int8", "coreml-palette4"]
XNNPACK_QUANTIZATIONS = ("fp32", "int8")
COREML_QUANTIZATIONS = ("coreml-fp16", "coreml-int8", "coreml-palette4")


class Tier(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    name: str = Field(pattern=r"^[a-z0-9][a-z0-9_-]*$", description="file-name safe identifier")
    family: str = Field(description=f"model family, one of {', '.join(FAMILIES)}")
    split_depth: int = Field(description=f"stages run on the phone, one of {SPLIT_DEPTHS}")
    width: float = Field(default=1.0, gt=0, le=4, description="channel width multiplier")
    input_shape: tuple[int, int, int] = Field(default=(1, 28, 28), description="C, H, W of one image")
    quantization: tuple[Quantization, ...] = Field(default=("fp32", "int8"), min_length=1)
    backends: tuple[Backend, ...] = Field(default=("xnnpack",), min_length=1)
    threshold: float | None = Field(
        default=None,
        gt=0,
        le=1,
        description="exit when max softmax >= threshold; None = calibrate per client on validation data",
    )
    latency_budget_ms: float = Field(default=10.0, gt=0, description="front-end latency target at batch 1")

    @field_validator("family")
    @classmethod
    def known_family(cls, family: str) -> str:
        if family not in FAMILIES:
            raise ValueError(f"unknown family {family!r}; known: {', '.join(FAMILIES)}")
        return family

    @field_validator("split_depth")
    @classmethod
    def known_depth(cls, depth: int) -> int:
        if depth not in SPLIT_DEPTHS:
            raise ValueError(f"split depth must be one of {SPLIT_DEPTHS}, got {depth}")
        return depth

    @field_validator("input_shape")
    @classmethod
    def supported_input(cls, shape: tuple[int, int, int]) -> tuple[int, int, int]:
        channels, height, width = shape
        if channels not in (1, 3) or height != width or height not in (28, 32):
            raise ValueError(f"input_shape must be (1 or 3, 28 or 32, same), got {shape}")
        return shape

    @model_validator(mode="after")
    def quantization_matches_backends(self) -> Tier:
        for q in self.quantization:
            backend = "xnnpack" if q in XNNPACK_QUANTIZATIONS else "coreml"
            if backend not in self.backends:
                raise ValueError(
                    f"quantization {q!r} needs backend {backend!r}, which tier {self.name!r} lacks"
                )
        for backend in self.backends:
            wanted = XNNPACK_QUANTIZATIONS if backend == "xnnpack" else COREML_QUANTIZATIONS
            if not set(wanted) & set(self.quantization):
                raise ValueError(f"backend {backend!r} of tier {self.name!r} has no quantization variant")
        return self


class TierSet(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    tiers: tuple[Tier, ...] = Field(min_length=1)

    @model_validator(mode="after")
    def unique_names(self) -> TierSet:
        names = [t.name for t in self.tiers]
        duplicates = sorted({n for n in names if names.count(n) > 1})
        if duplicates:
            raise ValueError(f"duplicate tier names: {', '.join(duplicates)}")
        return self

    def get(self, name: str) -> Tier:
        for tier in self.tiers:
            if tier.name == name:
                return tier
        raise KeyError(f"unknown tier {name!r}; known: {', '.join(t.name for t in self.tiers)}")

    def with_input_shape(self, input_shape: tuple[int, int, int]) -> TierSet:
        """The same tiers for another data set's image shape."""
        return TierSet(
            tiers=tuple(t.model_copy(update={"input_shape": tuple(input_shape)}) for t in self.tiers)
        )


def load_tiers(path: str | Path | None = None) -> TierSet:
    """Read a tiers YAML (or JSON) file; None reads the defaults."""
    return TierSet.model_validate(read_yaml(path if path is not None else DEFAULT_TIERS_FILE, "tiers file"))
