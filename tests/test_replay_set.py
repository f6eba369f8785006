"""The back-end's replay set: what training collects (label-free features of the clients' training
images through their final front-ends) and how backend.pt carries it to the server."""

import pytest
import torch

from harmony_mobile.federation.replay import (
    MIN_ROWS_PER_CLIENT,
    collect_replay,
    replay_features,
    replay_generator,
)
from harmony_mobile.models import Backend, InterfaceSpec, ProjectionHead
from harmony_mobile.protocol.slots import SlotTable
from harmony_mobile.run_dir import load_backend_file, save_backend
from tests.test_training import tiny_federation

torch.set_num_threads(1)
TABLE = SlotTable("e-test", 10, [bytes([i]) * 8 for i in range(10)])


def test_replay_is_each_clients_front_end_on_its_own_training_images():
    clients = tiny_federation().clients
    replay = collect_replay(clients, seed=0, total_rows=8 * len(clients))
    assert replay.dtype == torch.float16 and replay.shape == (8 * len(clients), 64, 8, 8)
    first = clients[0]
    message = replay_features(first, 8, replay_generator(first, seed=0))
    assert (message.split_depth, message.family, message.tier) == (
        first.split_depth,
        first.tier.family,
        first.tier.name,
    )
    assert torch.equal(replay[:8], message.features.to(torch.float16))  # same seed, same rows
    front_end = first.model.front_end(first.split_depth).eval()
    with torch.no_grad():
        _, expected = front_end(first.train_x)
    rows = {tuple(r.flatten()[:32].tolist()) for r in expected.to(torch.float16)}
    assert all(tuple(r.flatten()[:32].tolist()) in rows for r in replay[:8])
    assert len(collect_replay(clients, seed=0, total_rows=1)) == MIN_ROWS_PER_CLIENT * len(clients)


def test_replay_rows_leave_the_phone_clipped_noised_and_counted_like_uploads():
    clients = tiny_federation(feature_clip=1.0, noise_multiplier=1.0).clients
    first = clients[0]
    assert first.max_releases == 0
    replay = collect_replay(clients, seed=0, total_rows=8 * len(clients))
    assert first.max_releases == 1 and int((first._releases > 0).sum()) == 8  # each row counted once
    front_end = first.model.front_end(first.split_depth).eval()
    index = torch.randperm(len(first.train_x), generator=replay_generator(first, seed=0))[:8]
    with torch.no_grad():
        _, clean = front_end(first.train_x[index])
    noise = replay[:8].float() - clean / clean.flatten(1).norm(dim=1).clamp_min(1.0).view(-1, 1, 1, 1)
    assert noise.std().item() == pytest.approx(1.0, rel=0.1)  # sigma * clip on every coordinate


def test_backend_file_carries_the_replay_set(tmp_path):
    backend, projection = Backend(InterfaceSpec(), 10), ProjectionHead(128)
    replay = torch.rand(5, 64, 8, 8)
    save_backend(tmp_path / "with.pt", backend, projection, "v", tuple("0123456789"), TABLE, replay)
    loaded = load_backend_file(tmp_path / "with.pt")
    assert loaded.replay.dtype == torch.float16 and torch.equal(loaded.replay, replay.to(torch.float16))
    save_backend(tmp_path / "without.pt", backend, projection, "v", tuple("0123456789"), TABLE)
    assert load_backend_file(tmp_path / "without.pt").replay.shape == (0, 64, 8, 8)
    with pytest.raises(ValueError, match="replay features have shape"):
        save_backend(
            tmp_path / "bad.pt", backend, projection, "v", tuple("0123456789"), TABLE, torch.rand(2, 3)
        )
