"""The baselines of docs/ALGORITHM.md on the shared Algorithm protocol: each one's defining mechanism,
and each one end to end on a tiny run."""

import pytest
import torch
from pydantic import ValidationError

from harmony_mobile.algorithms.registry import ALGORITHMS, build_algorithm
from harmony_mobile.data import load_dataset
from harmony_mobile.data.partition import make_partition
from harmony_mobile.federation.rounds import Federation, run_rounds
from harmony_mobile.federation.split_trainer import SplitTrainer
from harmony_mobile.models import Backend, InterfaceSpec, ProjectionHead, load_tiers
from harmony_mobile.training import TrainConfig, build_clients, initial_family_weights, train

torch.set_num_threads(1)
TINY = {"local_steps": 2, "batch_size": 16}
BASELINES = ("local", "fedavg", "multi-exit", "splitgp", "centralized")


def tiny_federation(algorithm: str, overrides=None, seed=0) -> Federation:
    config = TrainConfig(dataset="digits", clients_per_tier=1, seed=seed, algorithm=algorithm)
    dataset = load_dataset("digits", limit=600)
    tiers = load_tiers().with_input_shape(dataset.input_shape)
    families = [t.family for t in tiers.tiers]
    partition = make_partition(
        "family", dataset.labels.numpy(), len(families), seed, client_families=families
    )
    algo = build_algorithm(algorithm, {**TINY, **(overrides or {})})
    clients = build_clients(config, tiers, dataset, partition, InterfaceSpec(), b"S" * 32, "e-test")
    torch.manual_seed(seed)
    split_trainer_config = algo.split_trainer_config()
    server = None
    if split_trainer_config is not None:
        backend = Backend(InterfaceSpec(), 10)
        server = SplitTrainer(backend, ProjectionHead(backend.feature_dim), split_trainer_config, "e-test")
    return Federation(algo, clients, initial_family_weights(config, tiers, dataset, InterfaceSpec()), server)


def snapshot(module: torch.nn.Module) -> dict[str, torch.Tensor]:
    return {k: v.detach().clone() for k, v in module.state_dict().items()}


def test_every_baseline_and_ablation_is_registered_with_a_validated_config():
    assert set(BASELINES) | {
        "harmony",
        "harmony-with-meta",
        "harmony-fixed-depth",
        "harmony-with-contrastive",
        "harmony-full-softmax",
    } <= set(ALGORITHMS)
    for name in BASELINES:
        algo = build_algorithm(name, TINY)
        assert algo.name == name
        assert algo.exit_rule in ("max_softmax", "neg_entropy")
        assert (algo.split_trainer_config() is None) == (not algo.uses_split)
        with pytest.raises(ValidationError):
            build_algorithm(name, {"no_such_option": 1})
    assert build_algorithm("harmony").config.own_classes_only
    assert not build_algorithm("harmony-full-softmax").config.own_classes_only
    assert build_algorithm("multi-exit").config.mix_lambda == 0.0
    assert build_algorithm("splitgp").config.mix_lambda == 0.2
    assert build_algorithm("splitgp").exit_rule == "neg_entropy"
    with pytest.raises(ValidationError):
        build_algorithm("multi-exit", {"mix_lambda": 0.2})  # that would be splitgp


def test_local_clients_keep_their_own_models_and_share_nothing():
    federation = tiny_federation("local")
    history = run_rounds(federation, rounds=2, clients_per_round=4, seed=0, show_progress=False)
    assert len(history) == 2
    algo = federation.algorithm
    # the family weights never change: nothing is aggregated
    initial = tiny_federation("local").family_weights
    for family, weights in federation.family_weights.items():
        for name, value in weights.items():
            assert torch.equal(value, initial[family][name])
    # the two resnet clients (same family, same initial weights) end with different own models
    resnet = [c for c in federation.clients if c.tier.family == "resnet"]
    first, second = (algo._weights[c.name] for c in resnet)
    assert not torch.equal(first["exits.4.mlp.2.weight"], second["exits.4.mlp.2.weight"])
    # round 2 continued from round 1: the stored model is not the broadcast one
    client = federation.clients[0]
    federation.broadcast(client)
    algo.personalize(client, None, torch.Generator().manual_seed(0))
    assert torch.equal(
        client.model.state_dict()["exits.4.mlp.2.weight"], algo._weights[client.name]["exits.4.mlp.2.weight"]
    )
    update = algo.client_round(client, None, 2, torch.Generator().manual_seed(1))
    assert update.weights == {}


def test_fedavg_uploads_the_full_model_and_averages_per_family():
    federation = tiny_federation("fedavg")
    client = next(c for c in federation.clients if c.split_depth == 1)
    federation.broadcast(client)
    update = federation.algorithm.client_round(client, None, 0, torch.Generator().manual_seed(0))
    assert any(n.startswith("stages.3.") for n in update.weights)  # full depth, although the tier splits at 1
    assert any(n.startswith("exits.4.") for n in update.weights)
    assert not any(n.startswith(("connectors.", "exits.1.")) for n in update.weights)
    run_rounds(federation, rounds=1, clients_per_round=4, seed=0, show_progress=False)
    resnet = [c for c in federation.clients if c.tier.family == "resnet"]
    for c in resnet:
        federation.broadcast(c)
        federation.algorithm.personalize(c, None, torch.Generator())
    # no personalization: both clients of a family answer with the same global model
    a, b = (snapshot(c.model) for c in resnet)
    assert all(torch.equal(a[k], b[k]) for k in a)


def test_splitgp_mixes_own_and_average_with_lambda():
    federation = tiny_federation("splitgp", {"mix_lambda": 0.25})
    algo, client = federation.algorithm, federation.clients[0]
    federation.broadcast(client)
    algo.client_round(client, federation.server, 0, torch.Generator().manual_seed(0))
    own = algo._own[client.name]
    federation.broadcast(client)  # the family average
    average = {n: p.detach().clone() for n, p in client.held_parameters().items()}
    algo._mix(client)
    for name, p in client.held_parameters().items():
        assert torch.allclose(p, 0.25 * own[name] + 0.75 * average[name], atol=1e-6)

    no_mix = tiny_federation("multi-exit")
    client = no_mix.clients[0]
    no_mix.broadcast(client)
    no_mix.algorithm.client_round(client, no_mix.server, 0, torch.Generator().manual_seed(0))
    assert no_mix.algorithm._own == {}  # lambda = 0: the average is the client's model


def test_splitgp_gamma_weights_exit_against_server_ce():
    only_exit = tiny_federation("splitgp", {"gamma": 1.0})
    before = snapshot(only_exit.server.backend)
    client = only_exit.clients[1]
    only_exit.broadcast(client)
    only_exit.server.start_round(0)
    only_exit.algorithm.client_round(client, only_exit.server, 0, torch.Generator().manual_seed(0))
    # gamma = 1: the server CE has weight 0, so Adam never moves g (zero gradients)
    assert all(torch.equal(before[k], v) for k, v in only_exit.server.backend.state_dict().items())

    both = tiny_federation("splitgp", {"gamma": 0.5})
    before = snapshot(both.server.backend)
    connector = f"connectors.{client.split_depth}.conv.weight"
    client = both.clients[1]
    both.broadcast(client)
    front_before = client.model.state_dict()[connector].clone()
    both.server.start_round(0)
    both.algorithm.client_round(client, both.server, 0, torch.Generator().manual_seed(0))
    assert any(not torch.equal(before[k], v) for k, v in both.server.backend.state_dict().items())
    assert not torch.equal(front_before, client.model.state_dict()[connector])  # server CE reaches phi


def test_centralized_trains_one_model_per_family_on_the_pooled_data():
    federation = tiny_federation("centralized")
    history = run_rounds(federation, rounds=1, clients_per_round=4, seed=0, show_progress=False)
    algo = federation.algorithm
    assert len(algo._labels) == sum(len(c.train_y) for c in federation.clients)
    # every class is in the pool although each family misses some locally
    assert set(algo._labels.tolist()) == set(range(10))
    assert history[0]["raw_upload_bytes"] > 0
    for c in federation.clients:
        federation.broadcast(c)
        algo.personalize(c, None, torch.Generator())
        assert torch.equal(
            c.model.state_dict()["exits.4.mlp.2.weight"],
            algo._models[c.tier.family]["exits.4.mlp.2.weight"],
        )


def test_the_learning_rate_decays_over_the_stated_rounds():
    config = build_algorithm("fedavg", {"decay_rounds": 2}).config
    assert [config.round_lr(r) for r in (0, 1, 2, 5)] == pytest.approx([3e-3, 1.5e-3, 0.0, 0.0])
    assert build_algorithm("centralized").config.round_lr(30) == 3e-3  # constant by default


def _trained_parameters(federation: Federation) -> dict[str, torch.Tensor]:
    """Every parameter a method trains (clients' models, the server's g and h), buffers left out:
    batch-norm statistics move in any forward pass, whatever the learning rate."""
    modules = {f"client {c.name}": c.model for c in federation.clients}
    if federation.server is not None:
        modules |= {"server g": federation.server.backend, "server h": federation.server.projection}
    modules |= {
        f"decision layer {c}": layer
        for c, layer in getattr(federation.algorithm, "_decision_layers", {}).items()
    }
    trained = {
        f"{owner} {name}": p.detach().clone()
        for owner, module in modules.items()
        for name, p in module.named_parameters()
    }
    # what a method keeps per client between rounds (local, fedproto: the broadcast never carries it)
    names = {name for c in federation.clients for name, _ in c.model.named_parameters()}
    for client, weights in getattr(federation.algorithm, "_weights", {}).items():
        trained |= {f"kept {client} {k}": v.clone() for k, v in weights.items() if k in names}
    return trained


@pytest.mark.parametrize("algorithm", sorted(ALGORITHMS))
def test_every_optimizer_of_a_method_follows_the_decay(algorithm):
    """decay_rounds = 1 puts every learning rate at 0 from round 1 on: the second round trains
    nothing, on the clients or on the server (a method that built an optimizer at its set lr would)."""
    federation = tiny_federation(algorithm, {"decay_rounds": 1})
    after_round: list[dict[str, torch.Tensor]] = []

    def record(fed: Federation) -> float:
        for client in fed.clients:  # the models as the next round's turns and personalization see them
            fed.broadcast(client)
        after_round.append(_trained_parameters(fed))
        return 0.0

    run_rounds(federation, rounds=2, clients_per_round=4, seed=0, evaluate=record, show_progress=False)
    first, second = after_round
    assert first.keys() == second.keys()
    # averaging equal weights across a family's clients may round the last bit; a step at lr 3e-3 is far larger
    moved = [name for name in first if not torch.allclose(first[name], second[name], rtol=1e-5, atol=1e-7)]
    assert not moved, f"trained at lr 0: {moved[:5]}"
    if federation.server is not None:
        assert {g["lr"] for g in federation.server.optimizer.param_groups} == {0.0}


def test_a_saved_optimizer_runs_at_the_rounds_rate():
    federation = tiny_federation("centralized", {"decay_rounds": 2})
    run_rounds(federation, rounds=2, clients_per_round=4, seed=0, show_progress=False)
    # the saved optimizer ran its last round at the decayed rate, not the lr it was created with
    states = federation.algorithm._optimizers.values()
    assert {g["lr"] for state in states for g in state["param_groups"]} == {1.5e-3}


@pytest.mark.parametrize("algorithm", BASELINES)
def test_baseline_end_to_end_tiny_run(tmp_path, algorithm):
    config = TrainConfig(
        dataset="digits",
        dataset_limit=600,
        clients_per_tier=1,
        rounds=2,
        algorithm=algorithm,
        algorithm_config=TINY,
        threads=1,
    )
    results = train(config, tmp_path / "run", show_progress=False)
    summary, mean = results["summary"], results["mean"]
    assert 0.0 <= summary["accuracy_with_ood"] <= 1.0
    assert 0.0 <= summary["accuracy_without_ood"] <= 1.0
    assert results["rounds"] == 2
    algo = build_algorithm(algorithm)
    if algo.uses_split:
        assert 0.0 <= summary["alignment_score"] <= 1.0
        assert 0.0 <= mean["p=0.5"]["fallback_rate"] <= 1.0
        assert "server_fallback_accuracy" in mean["p=0.5"]
    else:
        assert mean["p=0.5"]["exit_rate"] == 1.0  # the full local model answers everything
        assert "alignment_score" not in summary
