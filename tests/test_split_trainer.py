"""The training server's contrastive term in both of its modes: which earlier rows each mode keeps
as candidates, and that the term moves the uploaded features only through dL/dz."""

import pytest
import torch

from harmony_mobile.federation.split_trainer import ContrastiveTerm, SplitTrainer, SplitTrainerConfig
from harmony_mobile.models import Backend, InterfaceSpec, ProjectionHead
from harmony_mobile.protocol.messages import FeatureUpload

SPEC = InterfaceSpec(channels=4, size=4)
TOKENS = [bytes([i]) * 8 for i in range(4)]


def trainer(mode: str) -> SplitTrainer:
    torch.manual_seed(0)
    backend = Backend(SPEC, 4, width=16)
    term = ContrastiveTerm(weight=1.0, temperature=0.2, bank_size=64, mode=mode, ratio_every=1)
    config = SplitTrainerConfig(lr=1e-3, restrict_to_client_slots=True, contrastive=term)
    return SplitTrainer(backend, ProjectionHead(16, 8), config, "e-test")


def upload(client: str, family: str, classes: list[int], round_id: int = 0) -> FeatureUpload:
    rows = len(classes)
    return FeatureUpload(
        client_id=client,
        round_id=round_id,
        label_epoch="e-test",
        features=torch.randn(rows, *SPEC.shape),
        label_tokens=tuple(TOKENS[c] for c in classes),
        split_depths=(1,) * rows,
        family=family,
        tier=f"{family}-tier",
        model_version="r0",
    )


def test_cross_family_mode_keeps_each_familys_rows_across_rounds():
    server = trainer("cross_family")
    server.start_round(0)
    server.step(upload("a", "cnn", [0, 1, 0, 1]))
    server.start_round(1)  # the family bank outlives the round: the first family still finds partners
    server.step(upload("b", "resnet", [0, 1, 1, 0]))
    kept = {family: rows.shape[0] for family, (rows, _) in server._family_bank.items()}
    assert kept == {0: 4, 1: 4}
    assert server.take_diagnostics()["contrastive_grad_ratio"] > 0  # b had cross-family positives


def test_token_mode_pools_only_the_rounds_rows():
    server = trainer("token")
    server.start_round(0)
    server.step(upload("a", "cnn", [0, 1, 0, 1]))
    assert len(server._bank_tokens) == 4
    server.start_round(1)
    assert server._bank_tokens == [] and server._bank_embeddings == []
    server.step(upload("b", "resnet", [0, 1, 1, 0], round_id=1))
    assert len(server._bank_tokens) == 4 and server._family_bank == {}


@pytest.mark.parametrize("mode", ["token", "cross_family"])
def test_the_contrastive_term_changes_the_gradient_at_z(mode):
    torch.manual_seed(1)
    first, second = upload("a", "cnn", [0, 1, 0, 1]), upload("b", "resnet", [0, 1, 1, 0])
    grads = {}
    for weight in (1.0, None):
        server = trainer(mode)
        if weight is None:
            server.config = server.config.model_copy(update={"contrastive": None})
        server.start_round(0)
        server.step(first)
        grads[weight] = server.step(second).grad_features
    assert not torch.allclose(grads[1.0], grads[None])


def test_a_rounds_gradient_ratio_is_the_median_of_its_steps():
    import statistics

    server = trainer("token")
    server.start_round(0)
    for client in ("a", "b", "c"):
        server.step(upload(client, "cnn", [0, 1, 0, 1]))
    assert len(server._grad_ratios) == 3  # ratio_every=1: every contrastive step is measured
    server._grad_ratios[-1] = 1e9  # a step where the CE is fit: its gradient near zero, the ratio huge
    expected = statistics.median(server._grad_ratios)
    assert expected < 1e9
    assert server.take_diagnostics()["contrastive_grad_ratio"] == expected  # a mean would be over 3e8
    assert server.take_diagnostics() == {}  # the measurements are cleared once taken
