"""The back-end's replay set: the "earlier features" of alignment rounds (docs/ALGORITHM.md).

At the end of training every client sends `ReplayFeatures`: interface features of a random sample
of its own training images through its final (personalized) front-end, without labels or tokens,
released like uploads (clipped and noised when those options are on, and counted by the DP
accountant: `Client.release`). They travel inside backend.pt (run_dir.save_backend) to the export and the fallback
server, whose alignment rounds keep the back-end's predictions on them (the class mapping) and
check on a held-out part of them that the mapping was kept.
"""

from __future__ import annotations

import torch

from harmony_mobile.federation.client import Client
from harmony_mobile.protocol.messages import ReplayFeatures

REPLAY_ROWS = 512  # the whole set (8 KiB a row in float16 at 64x8x8: 4 MiB), split evenly over clients
MIN_ROWS_PER_CLIENT = 8


def replay_features(client: Client, rows: int, generator: torch.Generator) -> ReplayFeatures:
    """Client side: features of `rows` of the client's training images (its labels stay on the client)."""
    index = torch.randperm(len(client.train_x), generator=generator)[:rows]
    front_end = client.model.front_end(client.split_depth)
    was_training = front_end.training
    front_end.eval()
    with torch.no_grad():
        _, features = front_end(client.train_x[index])
        sent = client.release(features, index)
    front_end.train(was_training)
    return ReplayFeatures(client.name, sent, client.split_depth, client.tier.family, client.tier.name)


def replay_rows(clients: int, total_rows: int = REPLAY_ROWS) -> int:
    """Rows each of `clients` clients contributes."""
    return max(MIN_ROWS_PER_CLIENT, total_rows // clients)


def replay_generator(client: Client, seed: int) -> torch.Generator:
    """A client's own stream for its share (engines that run clients apart draw the same rows)."""
    return torch.Generator().manual_seed(seed * 1009 + client.client_id)


def client_replay(client: Client, clients: int, seed: int, total_rows: int = REPLAY_ROWS) -> ReplayFeatures:
    """One client's share of a replay set pooled from `clients` clients."""
    return replay_features(client, replay_rows(clients, total_rows), replay_generator(client, seed))


def collect_replay(clients: list[Client], seed: int, total_rows: int = REPLAY_ROWS) -> torch.Tensor:
    """Server side of the exchange: the pooled replay set, float16 (N, *interface)."""
    if not clients:
        raise ValueError("a replay set needs at least one client")
    messages = [client_replay(client, len(clients), seed, total_rows) for client in clients]
    return torch.cat([m.features for m in messages]).to(torch.float16)
