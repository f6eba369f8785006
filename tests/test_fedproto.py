"""`fedproto`: clients share class prototypes keyed by label token (never weights, never labels),
the prototype term pulls their features to the shared means, and the server's gradient does not
reach the front-ends."""

import copy

import torch

from harmony_mobile.algorithms.fedproto import PrototypeStore
from harmony_mobile.algorithms.registry import build_algorithm
from harmony_mobile.federation.client import cached_epoch_key
from harmony_mobile.federation.rounds import run_rounds
from harmony_mobile.protocol.label_tokens import class_tokens
from harmony_mobile.training import TrainConfig, train
from tests.test_baselines import snapshot, tiny_federation


def test_the_store_averages_prototypes_per_token_weighted_by_count_and_publishes_them_next_round():
    store = PrototypeStore()
    store.start_round(0)
    store.upload({b"tokenAAA": (torch.tensor([1.0, 0.0]), 1), b"tokenBBB": (torch.tensor([5.0, 5.0]), 2)})
    store.upload({b"tokenAAA": (torch.tensor([4.0, 3.0]), 2)})
    assert store.global_prototypes == {}  # nothing published during the round it was uploaded in
    store.start_round(1)
    assert torch.allclose(store.global_prototypes[b"tokenAAA"], torch.tensor([3.0, 2.0]))
    assert torch.allclose(store.global_prototypes[b"tokenBBB"], torch.tensor([5.0, 5.0]))
    store.start_round(1)  # the same round again (the next client): unchanged
    assert set(store.global_prototypes) == {b"tokenAAA", b"tokenBBB"}


def test_clients_upload_prototypes_by_token_and_no_weights():
    federation = tiny_federation("fedproto")
    history = run_rounds(federation, rounds=2, clients_per_round=4, seed=0, show_progress=False)
    store = federation.algorithm.store
    store.start_round(2)
    # keys are 8-byte tokens, not class ids; one per class some client holds, shared across families
    assert all(isinstance(t, bytes) and len(t) == 8 for t in store.global_prototypes)
    held = {c for client in federation.clients for c in client.classes}
    assert len(store.global_prototypes) == len(held)
    assert all(p.shape == (64, 8, 8) for p in store.global_prototypes.values())
    assert history[-1]["prototype_upload_bytes"] > 0
    # the family weights never change: nothing but prototypes (and features for g) is shared
    assert all(
        torch.equal(v, federation.family_weights[f][k])
        for f, weights in tiny_federation("fedproto").family_weights.items()
        for k, v in weights.items()
    )


def test_the_server_trains_g_but_its_gradient_never_reaches_a_front_end():
    """Two servers with different g give the same client round: nothing g computes reaches the
    front-end (or the client's decision layer); g itself moves."""
    trained = {}
    for perturb in (False, True):
        federation = tiny_federation("fedproto", {"proto_weight": 0.0})
        if perturb:
            with torch.no_grad():
                for parameter in federation.server.backend.parameters():
                    parameter.add_(torch.randn_like(parameter))
        backend_before = snapshot(federation.server.backend)
        client = federation.clients[1]
        federation.broadcast(client, 0)
        federation.server.start_round(0)
        federation.algorithm.client_round(client, federation.server, 0, torch.Generator().manual_seed(3))
        after = snapshot(federation.server.backend)
        assert any(not torch.equal(backend_before[k], v) for k, v in after.items())
        trained[perturb] = (snapshot(client.model), snapshot(federation.algorithm._decision_layer(client)))
    for plain, perturbed in zip(trained[False], trained[True], strict=True):
        assert all(torch.equal(perturbed[k], v) for k, v in plain.items())


def test_the_interface_features_are_trained_by_a_classification_loss_not_only_the_prototype_pull():
    """FedProto's prototype space is a classifier's input. Without a CE on z, the connector would
    learn only from the MSE towards prototypes of its own random output (and nothing at all with
    the prototype term off), leaving z too little class information for the server to answer."""
    federation = tiny_federation("fedproto", {"proto_weight": 0.0, "local_steps": 6})
    client = federation.clients[1]
    federation.broadcast(client, 0)
    initial_model = copy.deepcopy(client.model)
    connector = f"connectors.{client.split_depth}."
    federation.server.start_round(0)
    federation.algorithm.client_round(client, federation.server, 0, torch.Generator().manual_seed(0))
    after = snapshot(client.model)
    assert any(
        not torch.equal(after[k], v) for k, v in snapshot(initial_model).items() if k.startswith(connector)
    )

    def decision_ce(model, layer) -> float:
        with torch.no_grad():
            _, features = model(client.train_x, client.split_depth)
            return torch.nn.functional.cross_entropy(layer(features.flatten(1)), client.train_y).item()

    initial_layer = build_algorithm("fedproto")._decision_layer(client)  # the same seeded init
    trained_layer = federation.algorithm._decision_layer(client)
    assert decision_ce(client.model, trained_layer) < 0.8 * decision_ce(initial_model, initial_layer)


def test_g_trains_on_the_personalization_uploads_the_features_it_will_serve():
    """The front-ends never adapt to g, so g must follow their final (personalized) features."""
    federation = tiny_federation("fedproto", {"personalize_epochs": 1})
    run_rounds(federation, rounds=1, clients_per_round=4, seed=0, show_progress=False)
    before = snapshot(federation.server.backend)
    client = federation.clients[0]
    federation.broadcast(client)
    federation.algorithm.personalize(client, federation.server, torch.Generator().manual_seed(0))
    after = snapshot(federation.server.backend)
    assert any(not torch.equal(before[k], v) for k, v in after.items())


def test_the_prototype_term_pulls_features_towards_the_shared_prototypes():
    def distance_after(proto_weight: float) -> float:
        federation = tiny_federation("fedproto", {"proto_weight": proto_weight, "local_steps": 6})
        run_rounds(federation, rounds=3, clients_per_round=4, seed=0, show_progress=False)
        store = federation.algorithm.store
        store.start_round(3)
        total = 0.0
        for client in federation.clients:
            federation.algorithm._restore(client)
            with torch.no_grad():
                _, features = client.model(client.train_x, client.split_depth)
            key = cached_epoch_key(client.federation_secret, client.label_epoch)
            tokens = class_tokens(key, [client.class_names[int(y)] for y in client.train_y])
            targets = torch.stack([store.global_prototypes[t] for t in tokens])
            total += torch.nn.functional.mse_loss(features, targets).item()
        return total

    assert distance_after(10.0) < 0.5 * distance_after(0.0)


def test_fedproto_end_to_end_tiny_run(tmp_path):
    config = TrainConfig(
        dataset="digits",
        dataset_limit=600,
        clients_per_tier=1,
        rounds=2,
        algorithm="fedproto",
        algorithm_config={"local_steps": 2, "batch_size": 16, "personalize_epochs": 1},
        threads=1,
    )
    results = train(config, tmp_path / "run", show_progress=False)
    assert 0.0 <= results["summary"]["accuracy_with_ood"] <= 1.0
    assert "server_fallback_accuracy" in results["mean"]["p=0.5"]
    assert build_algorithm("fedproto").uses_split
