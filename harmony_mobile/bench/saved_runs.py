"""A finished run rebuilt for evaluation-only studies: its clients with their personalized
front-ends and thresholds, the served back-end, and the data split, as training left them.

The partition is recomputed from the run's config and its clients' secret (training.client_partition),
so it is the same split the run trained on; nothing is retrained.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import torch

from harmony_mobile import training
from harmony_mobile.algorithms.base import calibrate_client
from harmony_mobile.algorithms.registry import run_exit_gate
from harmony_mobile.data.partition import Partition
from harmony_mobile.evaluation import BackendWithSlots, EvaluationSetting
from harmony_mobile.federation.client import Client
from harmony_mobile.federation.slot_gate import slot_gates
from harmony_mobile.run_dir import RunDir, RunDirError


@dataclass
class FinishedRun:
    clients: list[Client]
    served: BackendWithSlots | None
    images: torch.Tensor
    labels: torch.Tensor
    partition: Partition
    seed: int
    exit_rule: str  # the score the run's method exits by
    replay: torch.Tensor | None  # the back-end's replay set (None: a run without a back-end)


def load_finished_run(path: str | Path) -> FinishedRun:
    run = RunDir(path)
    config = training.TrainConfig(**run.info.train_config)
    tiers = training.check_config(config)
    dataset = run.dataset()
    secret = run.federation_secret()
    partition = training.client_partition(config, tiers, dataset, secret)
    clients = training.build_clients(
        config, tiers, dataset, partition, run.info.interface_spec, secret, run.info.label_epoch
    )
    for client, artifact in zip(clients, run.clients(), strict=True):
        client.model.front_end(client.split_depth).load_state_dict(artifact.front_end_state)
        client.model.eval()
        client.threshold = artifact.threshold
    loaded = run.backend()
    served = BackendWithSlots(loaded.backend.eval(), loaded.slot_table.tokens)
    exit_rule = run_exit_gate(run.info)[0]
    if exit_rule == "slot_margin":  # the gate as training made it (the thresholds are the artifacts')
        gates = slot_gates(served.backend, served.slot_tokens, loaded.replay, clients)
        for client, gate in zip(clients, gates, strict=True):
            client.slot_gate = gate
    return FinishedRun(
        clients, served, dataset.images, dataset.labels, partition, config.seed, exit_rule, loaded.replay
    )


def evaluate_saved_run(
    path: str | Path,
    exit_rule: str,
    calibration_target: float,
    observer: training.TrainObserver | None = None,
) -> dict:
    """A finished split run's final evaluation once more, its phones gated by `exit_rule` and
    their thresholds calibrated to `calibration_target` on their validation samples, as training
    ends: what a run that trained the same way but exits by another rule reports, without training
    it again. `observer` gets the evaluation as training's would (the benchmark's extra metrics)."""
    run = load_finished_run(path)
    if run.served is None or run.replay is None or not len(run.replay):
        raise RunDirError(f"{path} has no back-end with a replay set: no gate to evaluate it by")
    if exit_rule == "slot_margin":
        backend, tokens = run.served.backend, run.served.slot_tokens
        training.gate_clients(run.clients, backend, tokens, run.replay, calibration_target)
    else:
        for client in run.clients:
            client.slot_gate = None
            calibrate_client(client, calibration_target, exit_rule)
    setting = EvaluationSetting(run.images, run.labels, run.partition, run.seed, exit_rule)
    results = training.evaluate_clients(run.clients, run.served, setting, run.replay, observer)
    results["thresholds"] = {client.name: client.threshold for client in run.clients}
    return results
