"""`harmony train --engine flower`: the steps of training.train with the clients behind a Flower Grid.

The server side (run dir, meta-weights, back-end, aggregation, checkpoints, evaluation, artifacts)
is the in-process engine's code; only each client's turn travels as messages (server_app.py).
The run directory comes out in the same layout, so `harmony export` reads it unchanged; the
Flower engine adds `flower_rounds.jsonl` (replies and bytes per round).

`train_flower` runs it on Flower's Simulation Engine (one virtual SuperNode per client); a
deployment runs the same ServerApp/ClientApp through `flwr run` (flower_app/ in the repo).
"""

from __future__ import annotations

import json
import time
from pathlib import Path

import numpy as np
import torch

from harmony_mobile.algorithms.registry import build_algorithm
from harmony_mobile.data import load_dataset
from harmony_mobile.data.partition import make_partition
from harmony_mobile.evaluation import evaluate
from harmony_mobile.federation.replay import collect_replay
from harmony_mobile.federation.server import SplitServer
from harmony_mobile.federation.simulation import (
    Federation,
    load_checkpoint,
    round_generator,
    save_checkpoint,
)
from harmony_mobile.flower.server_app import FlowerClients, FlowerRunError
from harmony_mobile.flower.settings import FlowerSettings
from harmony_mobile.models import Backend, InterfaceSpec, ProjectionHead, load_tiers
from harmony_mobile.run_dir import ClientArtifact, RunInfo, save_backend, save_client, write_run_info
from harmony_mobile.training import (
    TrainConfig,
    build_clients,
    check_tiers,
    initial_family_weights,
    model_version,
    prepare_run_dir,
)

UNSUPPORTED = {
    "centralized": "pools every client's raw data in one trainer; it is the non-federated upper bound "
    "and runs only on the in-process engine",
}


def check_supported(config: TrainConfig) -> None:
    algorithm = build_algorithm(config.algorithm, config.algorithm_config)
    if config.algorithm in UNSUPPORTED:
        raise ValueError(f"{config.algorithm!r} {UNSUPPORTED[config.algorithm]}")
    if algorithm.uses_split:
        raise ValueError(
            f"{config.algorithm!r} is a split method: its split step on Flower is not built yet; "
            "use the in-process engine"
        )


def setup_federation(config: TrainConfig, run_path: Path):
    """training.train's setup: checks, run dir, data, partition, the harness clients, run.json."""
    torch.set_num_threads(config.threads)
    tiers = load_tiers(config.tiers_file)
    check_tiers(tiers)
    algorithm = build_algorithm(config.algorithm, config.algorithm_config)
    prepare_run_dir(run_path, config)
    dataset = load_dataset(config.dataset, config.data_root, limit=config.dataset_limit)
    tiers = tiers.with_input_shape(dataset.input_shape)
    interface = InterfaceSpec(config.interface_channels, config.interface_size)
    families = [tier.family for tier in tiers.tiers for _ in range(config.clients_per_tier)]
    partition = make_partition(
        config.partition,
        dataset.labels.numpy(),
        len(families),
        config.seed,
        alpha=config.alpha,
        classes_per_client=config.classes_per_client,
        client_families=families,
        classes_per_family=config.classes_per_family,
    )
    clients = build_clients(config, tiers, dataset, partition, interface)
    info = RunInfo(
        algorithm=config.algorithm,
        dataset=dataset.name,
        data_root=config.data_root,
        dataset_limit=config.dataset_limit,
        num_classes=dataset.num_classes,
        class_names=dataset.class_names,
        input_shape=dataset.input_shape,
        mean=dataset.mean,
        std=dataset.std,
        interface=(interface.channels, interface.size),
        tiers=tiers,
        model_version="in-training",
        seed=config.seed,
        train_config=config.model_dump(),
        partition={
            "scheme": config.partition,
            "client_classes": [list(c.classes) for c in partition.clients],
        },
    )
    write_run_info(run_path, info)
    torch.manual_seed(config.seed)
    backend = Backend(interface, dataset.num_classes)
    projection = ProjectionHead(backend.feature_dim)
    server_config = algorithm.server_config()
    server = SplitServer(backend, projection, server_config) if server_config is not None else None
    federation = Federation(
        algorithm, clients, initial_family_weights(config, tiers, dataset, interface), server
    )
    return federation, dataset, partition, info, backend, projection


def run_flower_rounds(federation: Federation, transport: FlowerClients, config: TrainConfig, run_path: Path):
    """simulation.run_rounds with each client's turn sent to its SuperNode."""
    start = load_checkpoint(run_path, federation) + 1
    clients_per_round = min(config.clients_per_round or len(federation.clients), len(federation.clients))
    history = []
    for round_id in range(start, config.rounds):
        started = time.perf_counter()
        generator = round_generator(config.seed, round_id)
        torch.manual_seed(config.seed * 100_003 + round_id)
        sampled = np.random.default_rng((config.seed, round_id)).choice(
            len(federation.clients), size=clients_per_round, replace=False
        )
        if federation.server is not None:
            federation.server.start_round(round_id)
        updates = transport.train_round(federation, [int(i) for i in sampled], round_id, generator)
        for family, weights in federation.family_weights.items():
            family_updates = [u for u in updates if u.family == family]
            if family_updates:
                federation.family_weights[family] = federation.algorithm.aggregate(weights, family_updates)
        metrics = {"round": round_id, "clients": len(updates)}
        for key in sorted({k for u in updates for k in u.metrics}):
            metrics[key] = float(np.mean([u.metrics[key] for u in updates if key in u.metrics]))
        history.append(metrics)
        save_checkpoint(run_path, federation, round_id)
        with open(run_path / "metrics.jsonl", "a") as log:
            log.write(json.dumps(metrics) + "\n")
        transport.log_round(run_path, round_id, len(sampled), len(updates), time.perf_counter() - started)
    return history


def train_on_grid(grid, settings: FlowerSettings) -> dict:
    """The ServerApp's whole job; returns the final metrics it also writes to the run dir."""
    started = time.perf_counter()
    config, run_path = settings.train_config, Path(settings.run_dir)
    check_supported(config)
    federation, dataset, partition, info, backend, projection = setup_federation(config, run_path)
    phases = {"setup": time.perf_counter() - started}
    transport = FlowerClients(grid, settings)
    transport.connect(len(federation.clients))
    phases["connect"] = time.perf_counter() - started - sum(phases.values())
    history = run_flower_rounds(federation, transport, config, run_path)
    phases["rounds"] = time.perf_counter() - started - sum(phases.values())
    missing = transport.personalize(federation, round_generator(config.seed, config.rounds))
    phases["personalize"] = time.perf_counter() - started - sum(phases.values())
    if len(federation.clients) - len(missing) < settings.min_replies:
        raise FlowerRunError(f"{len(missing)} clients did not return their personalized model")
    algorithm, clients = federation.algorithm, federation.clients
    backend_for_eval = backend.eval() if algorithm.uses_split else None
    results = evaluate(
        clients, backend_for_eval, dataset.images, dataset.labels, partition, config.seed, algorithm.exit_rule
    )
    version = model_version(backend, config.algorithm)
    for client in clients:
        split = partition.clients[client.client_id]
        save_client(
            run_path,
            ClientArtifact(
                client_id=client.client_id,
                tier=client.tier.name,
                classes=client.classes,
                threshold=client.threshold,
                train_idx=split.train.tolist(),
                val_idx=split.val.tolist(),
                test_idx=split.test.tolist(),
                front_end_state=client.model.front_end(client.split_depth).state_dict(),
            ),
        )
    replay = collect_replay(clients, config.seed) if algorithm.uses_split else None
    save_backend(run_path / "backend.pt", backend, projection, version, dataset.class_names, replay)
    write_run_info(run_path, info.model_copy(update={"model_version": version}))
    results["train_seconds"] = time.perf_counter() - started
    results["rounds"] = len(history)
    results["thresholds"] = {c.name: c.threshold for c in clients}
    results["engine"] = "flower"
    results["phase_seconds"] = phases
    results["clients_without_personalization"] = missing
    (run_path / "final_metrics.json").write_text(json.dumps(results, indent=2))
    return results


def train_flower(settings: FlowerSettings, backend_config: dict | None = None) -> dict:
    """Train on Flower's Simulation Engine: one virtual SuperNode per client, this process's
    ServerApp writing the run dir. Returns the final metrics."""
    from flwr.simulation import run_simulation

    from harmony_mobile.flower.client_app import client_count, make_client_app
    from harmony_mobile.flower.server_app import make_server_app

    config = settings.train_config
    check_supported(config)
    tiers = load_tiers(config.tiers_file)
    check_tiers(tiers)
    prepare_run_dir(Path(settings.run_dir), config)  # bad run dirs fail before Ray starts
    # a round's client turns run one after another (server_app.py), so one actor serves them all
    resources = {"client_resources": {"num_cpus": 1, "num_gpus": 0.0}, "init_args": {"num_cpus": 1}}
    run_simulation(
        server_app=make_server_app(settings),
        client_app=make_client_app(settings),
        num_supernodes=client_count(config),
        backend_config=backend_config or resources,
    )
    return json.loads((Path(settings.run_dir) / "final_metrics.json").read_text())
