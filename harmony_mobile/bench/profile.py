"""A benchmark profile: data settings, seeds, methods and the one budget every method gets.

The budget is shared: the same rounds, local steps per round and samples drawn per step for every
method. HARMONY draws a support and a query batch per step, so its batch size is half the samples
per step; every other method draws one batch of the full size. Hyper-parameters of one method
(`algorithm_config`) are applied to its relatives too: HARMONY's to its ablations (an ablation
changes exactly one mechanism), SplitGP's to multi-exit (except lambda, fixed at 0 there).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Literal

import yaml
from pydantic import BaseModel, ConfigDict, Field, model_validator

from harmony_mobile.algorithms.harmony import Harmony
from harmony_mobile.algorithms.registry import ALGORITHMS

CONFIG_DIR = Path(__file__).resolve().parents[2] / "benchmarks" / "configs"


class Setting(BaseModel):
    model_config = ConfigDict(extra="forbid")

    name: str = Field(pattern=r"^[A-Za-z0-9][A-Za-z0-9._-]*$")
    dataset: str = "mnist5k"
    dataset_limit: int | None = None
    partition: Literal["family", "dirichlet", "shard"] = "family"
    alpha: float = Field(default=0.5, gt=0)

    def label(self) -> str:
        scheme = f"Dirichlet alpha={self.alpha:g}" if self.partition == "dirichlet" else self.partition
        if self.partition == "family":
            scheme = "family-correlated"
        limit = f" (first {self.dataset_limit})" if self.dataset_limit else ""
        return f"{self.dataset}{limit}, {scheme} split"


class Budget(BaseModel):
    model_config = ConfigDict(extra="forbid")

    rounds: int = Field(ge=1)
    local_steps: int = Field(ge=1, description="optimizer steps per client per round")
    samples_per_step: int = Field(
        ge=4, description="samples a client draws per step (HARMONY: support + query)"
    )


class PcaSpec(BaseModel):
    model_config = ConfigDict(extra="forbid")

    setting: str | None = None  # None = the first setting
    seed: int | None = None  # None = the first seed
    methods: list[str] = ["splitgp", "harmony"]
    max_points: int = Field(default=800, ge=10, description="points kept per method in results.json")


class BenchProfile(BaseModel):
    model_config = ConfigDict(extra="forbid")

    name: str
    description: str = ""
    seeds: list[int] = Field(min_length=1)
    settings: list[Setting] = Field(min_length=1)
    methods: list[str] = Field(min_length=1)
    budget: Budget
    train: dict[str, Any] = Field(
        default_factory=dict,
        description="other TrainConfig fields shared by every run (clients_per_tier, ...)",
    )
    algorithm_config: dict[str, dict[str, Any]] = Field(default_factory=dict)
    pca: PcaSpec = PcaSpec()
    time_limit_minutes: float | None = None
    notes: str = Field(default="", description="markdown appended to the report (what was tuned and how)")

    @model_validator(mode="after")
    def _known_methods(self) -> BenchProfile:
        unknown = [m for m in [*self.methods, *self.algorithm_config] if m not in ALGORITHMS]
        if unknown:
            raise ValueError(f"unknown methods {unknown}; known: {', '.join(ALGORITHMS)}")
        reserved = {
            "dataset",
            "data_root",
            "dataset_limit",
            "partition",
            "alpha",
            "rounds",
            "seed",
            "algorithm",
        }
        if reserved & set(self.train):
            raise ValueError(f"train: {sorted(reserved & set(self.train))} are set by settings/budget/seeds")
        return self

    def method_config(self, method: str) -> dict[str, Any]:
        """The algorithm config of `method` under this profile's shared budget."""
        constructor = ALGORITHMS[method][0]
        is_harmony = constructor is Harmony
        per_step = self.budget.samples_per_step
        config: dict[str, Any] = {
            "local_steps": self.budget.local_steps,
            "batch_size": per_step // 2 if is_harmony else per_step,
        }
        parent = "harmony" if is_harmony else "splitgp" if method == "multi-exit" else method
        inherited = dict(self.algorithm_config.get(parent, {}))
        if method == "multi-exit":
            inherited.pop("mix_lambda", None)
        config.update(inherited)
        if parent != method:
            config.update(self.algorithm_config.get(method, {}))
        return config


def load_profile(name_or_path: str | Path) -> BenchProfile:
    """A profile by name (benchmarks/configs/<name>.yaml) or by path to a YAML file."""
    path = Path(name_or_path)
    if not path.suffix:
        path = CONFIG_DIR / f"{name_or_path}.yaml"
    if not path.is_file():
        known = sorted(p.stem for p in CONFIG_DIR.glob("*.yaml")) if CONFIG_DIR.is_dir() else []
        raise FileNotFoundError(f"no benchmark profile {name_or_path!r} ({path}); known: {', '.join(known)}")
    data = yaml.safe_load(path.read_text()) or {}
    return BenchProfile(**data)
