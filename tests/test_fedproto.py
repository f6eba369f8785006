"""`fedproto`: clients share class prototypes keyed by label token (never weights, never labels),
the prototype term pulls their features to the shared means, and the server's gradient does not
reach the front-ends."""

import torch

from harmony_mobile.algorithms.fedproto import PrototypeStore
from harmony_mobile.algorithms.registry import build_algorithm
from harmony_mobile.federation.client import cached_epoch_key
from harmony_mobile.federation.simulation import run_rounds
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
    """With the prototype term off, a fedproto client trains exactly as with its exit loss alone,
    whatever g does with its uploads; g itself moves."""
    federation = tiny_federation("fedproto", {"proto_weight": 0.0})
    backend_before = snapshot(federation.server.backend)
    client = federation.clients[1]
    federation.broadcast(client, 0)
    reference = snapshot(client.model)
    federation.server.start_round(0)
    federation.algorithm.client_round(client, federation.server, 0, torch.Generator().manual_seed(3))
    with_server = snapshot(client.model)

    alone = tiny_federation("fedproto", {"proto_weight": 0.0})
    alone_client = alone.clients[1]
    alone_client.model.load_state_dict(reference)
    config = alone.algorithm.config
    optimizer = torch.optim.Adam(alone_client.held_parameters().values(), lr=config.lr)
    generator = torch.Generator().manual_seed(3)
    for _ in range(config.local_steps):
        images, labels = alone_client.batch(config.batch_size, generator)
        optimizer.zero_grad()
        exit_logits, _ = alone_client.model(images, alone_client.split_depth)
        torch.nn.functional.cross_entropy(exit_logits, labels).backward()
        optimizer.step()
    assert all(torch.equal(with_server[k], v) for k, v in snapshot(alone_client.model).items())
    assert any(not torch.equal(backend_before[k], v) for k, v in snapshot(federation.server.backend).items())


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
