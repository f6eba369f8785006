"""Every training method by name: HARMONY, its ablations and the baselines."""

from __future__ import annotations

from typing import Any

from harmony_mobile.algorithms.base import Algorithm
from harmony_mobile.algorithms.centralized import Centralized
from harmony_mobile.algorithms.fedavg import FedAvg
from harmony_mobile.algorithms.harmony import Harmony, HarmonyConfig
from harmony_mobile.algorithms.local import Local
from harmony_mobile.algorithms.multi_exit import MultiExit
from harmony_mobile.algorithms.splitgp import SplitGP

# name -> (constructor, overrides of its config that define the variant)
ALGORITHMS: dict[str, tuple[type, dict[str, Any]]] = {
    "harmony": (Harmony, {}),
    "harmony-meta": (Harmony, {"meta": False}),  # ablation: no meta-adaptation / simulated extractors
    "harmony-stochastic-depth": (Harmony, {"stochastic_depth": False}),  # ablation: fixed split depth
    "harmony-contrastive": (Harmony, {"contrastive_weight": 0.0}),  # ablation: no SupCon alignment
    # ablation: the server CE over every slot instead of the uploading client's slots (federation/server.py)
    "harmony-full-softmax": (Harmony, {"own_classes_only": False}),
    # baselines (ALGORITHM.md, Baselines); each has a nested pydantic `Config`
    "local": (Local, {}),  # every client alone, full model, no server
    "fedavg": (FedAvg, {}),  # FedAvg per family on full models, no split
    "multi-exit": (MultiExit, {}),  # hybrid SFL without personalization mixing (SplitGP, lambda = 0)
    "splitgp": (SplitGP, {}),  # gamma-weighted exit/server CE, lambda-mixing, entropy fallback
    "centralized": (Centralized, {}),  # upper bound: per family one model on pooled data
}


def build_algorithm(name: str, config: dict[str, Any] | None = None) -> Algorithm:
    """An algorithm by name; `config` overrides its defaults (unknown keys are a validation error)."""
    if name not in ALGORITHMS:
        raise ValueError(f"unknown algorithm {name!r}; known: {', '.join(ALGORITHMS)}")
    constructor, variant = ALGORITHMS[name]
    if constructor is Harmony:
        return Harmony(HarmonyConfig(**{**(config or {}), **variant}), name=name)
    return constructor(constructor.Config(**(config or {})))
