"""Every training method by name: HARMONY, its ablations and the baselines."""

from __future__ import annotations

from typing import Any

from harmony_mobile.algorithms.base import Algorithm
from harmony_mobile.algorithms.centralized import Centralized
from harmony_mobile.algorithms.fedavg import FedAvg
from harmony_mobile.algorithms.fedproto import FedProto
from harmony_mobile.algorithms.harmony import Harmony, HarmonyConfig
from harmony_mobile.algorithms.local import Local
from harmony_mobile.algorithms.multi_exit import MultiExit
from harmony_mobile.algorithms.splitgp import SplitGP

# name -> (constructor, overrides of its config that define the variant)
ALGORITHMS: dict[str, tuple[type, dict[str, Any]]] = {
    "harmony": (Harmony, {}),
    # ablations: each turns off exactly one mechanism (one config field; tests/test_ablations.py)
    "harmony-fixed-depth": (Harmony, {"random_split_depth": False}),  # every variant at the client's depth
    # ablation: the server CE over every slot instead of the uploading client's slots (federation/split_trainer.py)
    "harmony-full-softmax": (Harmony, {"own_classes_only": False}),
    "harmony-no-style-mixing": (Harmony, {"style_mixing": 0.0}),  # g sees z with its own statistics
    # mechanisms measured and not kept, turned on (docs/ALGORITHM.md): the inner loop of
    # meta-adaptation, and SupCon on the server at its former default weight
    "harmony-with-meta": (Harmony, {"meta": True}),
    "harmony-with-contrastive": (Harmony, {"contrastive_weight": 0.5}),
    # ablation: the phones exit by max softmax instead of the server's slot prototypes (federation/slot_gate.py)
    "harmony-max-softmax": (Harmony, {"exit_rule": "max_softmax"}),
    # the baseline with HARMONY's gate: which gains are the gate's and which the training's
    "splitgp-restricted-slot-gate": (SplitGP, {"restricted_softmax": True, "exit_rule": "slot_margin"}),
    # baselines (docs/ALGORITHM.md, Baselines); each has a nested pydantic `Config`
    "local": (Local, {}),  # every client alone, full model, no server
    "fedavg": (FedAvg, {}),  # FedAvg per family on full models, no split
    "multi-exit": (MultiExit, {}),  # hybrid SFL without personalization mixing (SplitGP, lambda = 0)
    "splitgp": (SplitGP, {}),  # gamma-weighted exit/server CE, lambda-mixing, entropy fallback
    "splitgp-restricted": (SplitGP, {"restricted_softmax": True}),  # + HARMONY's restricted softmax
    "fedproto": (FedProto, {}),  # prototypes keyed by label token through the server, no weight sharing
    "centralized": (Centralized, {}),  # upper bound: per family one model on pooled data
}


# names no longer accepted, each with what to write instead
RENAMED = {
    "harmony-meta": "the ablation with the inner loop turned off was 'harmony-no-meta', now 'harmony' "
    "itself; the variant with the inner loop is 'harmony-with-meta'",
    "harmony-no-meta": "meta-adaptation is off by default, so 'harmony' is what 'harmony-no-meta' was; "
    "the variant with the inner loop is 'harmony-with-meta'",
    "harmony-stochastic-depth": "the ablation with that mechanism turned off is 'harmony-fixed-depth'",
    "harmony-slot-gate": "the slot gate is HARMONY's default exit rule, so 'harmony' is what "
    "'harmony-slot-gate' was; the variant that exits by max softmax is 'harmony-max-softmax'",
    "harmony-contrastive": "SupCon is off by default; the variant with it is 'harmony-with-contrastive'",
    "harmony-no-contrastive": "SupCon is off by default, so 'harmony' is what 'harmony-no-contrastive' "
    "was; the variant with it is 'harmony-with-contrastive'",
}


def check_algorithm(name: str) -> None:
    """A clear error for an unknown algorithm name (with what to write for a retired one)."""
    if name in RENAMED:
        raise ValueError(f"{name!r} is not an algorithm: {RENAMED[name]}")
    if name not in ALGORITHMS:
        raise ValueError(f"unknown algorithm {name!r}; known: {', '.join(ALGORITHMS)}")


def effective_config(name: str, config: dict[str, Any] | None = None) -> dict[str, Any]:
    """`config` with the variant's defining override on top (the override wins); unknown names pass."""
    variant = ALGORITHMS[name][1] if name in ALGORITHMS else {}
    return {**(config or {}), **variant}


def build_algorithm(name: str, config: dict[str, Any] | None = None) -> Algorithm:
    """An algorithm by name; `config` overrides its defaults (unknown keys are a validation error).
    A variant's defining override wins over `config`."""
    check_algorithm(name)
    constructor = ALGORITHMS[name][0]
    if constructor is Harmony:
        return Harmony(HarmonyConfig(**effective_config(name, config)), name=name)
    return constructor(constructor.Config(**effective_config(name, config)))


def exit_gate(
    name: str, config: dict[str, Any] | None = None, recorded_rule: str | None = None
) -> tuple[str, float | None]:
    """What a method's phones answer locally by: its exit rule, and the local-exit accuracy target
    they calibrate its threshold to (None: the method calibrates none). `recorded_rule`: the rule a
    saved run says it trained with; a run saved before runs said so trained with its config's rule,
    else its method's, which for HARMONY was max softmax (its default is slot_margin since 2026-12-06)."""
    algorithm = build_algorithm(name, config)
    target = getattr(algorithm.config, "calibration_target", None)
    rule = recorded_rule or _rule_of_an_unrecorded_run(algorithm, config)
    return rule, float(target) if target is not None else None


def run_exit_gate(info: Any) -> tuple[str, float | None]:
    """`exit_gate` of a saved run, from its run.json (`run_dir.RunInfo`): its method, its config and
    the rule it recorded."""
    return exit_gate(info.algorithm, info.train_config.get("algorithm_config"), info.exit_rule)


def _rule_of_an_unrecorded_run(algorithm: Algorithm, config: dict[str, Any] | None) -> str:
    if isinstance(algorithm, Harmony) and not (config or {}).get("exit_rule"):
        return "max_softmax"
    return algorithm.exit_rule
