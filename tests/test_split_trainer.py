"""The training server's contrastive term in both of its modes: which earlier rows each mode keeps
as candidates, and that the term moves the uploaded features only through dL/dz (or not at all when
it is kept off the front-ends); and its style mixing across families."""

import math

import pytest
import torch

from harmony_mobile.federation.split_trainer import (
    ContrastiveTerm,
    SplitTrainer,
    SplitTrainerConfig,
    StyleMixing,
)
from harmony_mobile.models import Backend, InterfaceSpec, ProjectionHead
from harmony_mobile.protocol.messages import FeatureUpload

SPEC = InterfaceSpec(channels=4, size=4)
TOKENS = [bytes([i]) * 8 for i in range(4)]


def trainer(mode: str, reaches_front_ends: bool = True, style: StyleMixing | None = None) -> SplitTrainer:
    torch.manual_seed(0)
    backend = Backend(SPEC, 4, width=16)
    term = ContrastiveTerm(
        weight=1.0,
        temperature=0.2,
        bank_size=64,
        mode=mode,
        ratio_every=1,
        reaches_front_ends=reaches_front_ends,
    )
    config = SplitTrainerConfig(
        lr=1e-3,
        decay_rounds=None,
        restrict_to_client_slots=True,
        logit_adjustment=0.0,
        contrastive=term,
        style_mixing=style,
    )
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
    assert server.take_diagnostics("b")["contrastive_grad_ratio"] > 0  # b had cross-family positives
    assert server.take_diagnostics("a") == {
        "contrastive_grad_ratio": 0.0
    }  # a had no other family to align to


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
    for _ in range(3):
        server.step(upload("a", "cnn", [0, 1, 0, 1]))
    server.step(upload("b", "cnn", [0, 1, 0, 1]))
    ratios = server._grad_ratios["a"]
    assert len(ratios) == 3  # ratio_every=1: every contrastive step is measured, per client
    ratios[-1] = 1e9  # a step where the CE is fit: its gradient near zero, the ratio huge
    expected = statistics.median(ratios)
    assert expected < 1e9
    assert server.take_diagnostics("a")["contrastive_grad_ratio"] == expected  # a mean would be over 3e8
    assert server.take_diagnostics("a") == {}  # the measurements are cleared once taken
    assert server.take_diagnostics("b")["contrastive_grad_ratio"] > 0  # b's own, untouched by a's


@pytest.mark.parametrize("mode", ["token", "cross_family"])
def test_a_term_kept_off_the_front_ends_returns_the_ces_gradient_but_still_trains_g(mode):
    torch.manual_seed(1)
    first, second = upload("a", "cnn", [0, 1, 0, 1]), upload("b", "resnet", [0, 1, 1, 0])
    detached, off = trainer(mode, reaches_front_ends=False), trainer(mode)
    off.config = off.config.model_copy(update={"contrastive": None})
    grads = {}
    for name, server in (("detached", detached), ("off", off)):
        server.start_round(0)
        grads[name] = server.step(first).grad_features  # same g, so the same CE gradient at z
        server.step(second)  # b has positives in either mode: SupCon moves g
    assert torch.allclose(grads["detached"], grads["off"])
    moved = [
        not torch.equal(p, q)
        for p, q in zip(detached.backend.parameters(), off.backend.parameters(), strict=True)
    ]
    assert any(moved)


def test_style_mixing_moves_a_rows_channel_statistics_towards_another_familys():
    style = StyleMixing(probability=1.0, alpha=1.0, bank_size=16)
    server = trainer("token", style=style)
    server.start_round(0)
    cnn = upload("a", "cnn", [0, 1, 0, 1])
    assert torch.equal(server._mix_styles(cnn.features, 0), cnn.features)  # no other family banked yet
    resnet = upload("b", "resnet", [0, 1, 1, 0])
    resnet.features.mul_(0.1).add_(10)  # another family's style: a far larger mean, a smaller spread
    server._mix_styles(resnet.features, 1)
    mixed = server._mix_styles(cnn.features, 0)
    own_mean = cnn.features.mean(dim=(2, 3))
    mixed_mean = mixed.mean(dim=(2, 3))
    assert (mixed_mean >= own_mean - 1e-4).all() and (mixed_mean - own_mean).abs().max() > 1.0
    assert {f: rows.shape[0] for f, rows in server._style_bank.items()} == {0: 8, 1: 4}
    # the mixing draws follow from the server's state, which a checkpoint carries
    state = server.state()
    again = trainer("token", style=style)
    again.load_state(state)
    assert torch.equal(again._mix_styles(cnn.features, 0), server._mix_styles(cnn.features, 0))


def plain_trainer(logit_adjustment: float = 0.0) -> SplitTrainer:
    torch.manual_seed(0)
    config = SplitTrainerConfig(
        lr=1e-3,
        decay_rounds=None,
        restrict_to_client_slots=True,
        logit_adjustment=logit_adjustment,
        contrastive=None,
    )
    return SplitTrainer(Backend(SPEC, 4, width=16), ProjectionHead(16, 8), config, "e-test")


def test_the_restricted_softmax_runs_over_the_clients_slots_only_by_default():
    server = plain_trainer()
    server.step(upload("a", "cnn", [0, 0, 0, 1]))
    server.step(upload("b", "cnn", [2, 3]))
    assert server.softmax_mask("a").tolist() == [0.0, 0.0, float("-inf"), float("-inf")]


def test_a_logit_adjustment_adds_tau_log_of_each_slots_share_of_the_clients_uploads():
    server = plain_trainer(logit_adjustment=0.5)
    server.step(upload("a", "cnn", [0, 0, 0, 1]))
    server.step(upload("a", "cnn", [0, 0, 0, 1]))
    server.step(upload("b", "cnn", [2, 3]))
    mask = server.softmax_mask("a")
    assert mask[:2].tolist() == pytest.approx([0.5 * math.log(0.75), 0.5 * math.log(0.25)])
    assert mask[2:].tolist() == [float("-inf")] * 2
    resumed = plain_trainer(logit_adjustment=0.5)
    resumed.load_state(server.state())
    assert torch.equal(resumed.softmax_mask("a"), mask)


def test_the_logit_adjustment_moves_the_gradient_continuously_from_the_plain_restricted_softmax():
    """A tau near 0 steps g as the plain softmax does; tau 1 does not."""
    adjusted, plain = plain_trainer(logit_adjustment=1e-9), plain_trainer()
    rows = upload("a", "cnn", [0, 0, 1])
    assert torch.allclose(adjusted.step(rows).grad_features, plain.step(rows).grad_features)
    assert not torch.equal(
        plain_trainer(logit_adjustment=1.0).step(rows).grad_features, plain_trainer().step(rows).grad_features
    )


def test_a_checkpoint_from_before_slot_counts_resumes_with_the_same_slots():
    server = plain_trainer()
    server.step(upload("a", "cnn", [0, 2, 2]))
    state = server.state()
    counts = state.pop("client_slot_counts")
    state["client_slots"] = {name: [i for i, c in enumerate(row) if c] for name, row in counts.items()}
    resumed = plain_trainer()
    resumed.load_state(state)
    assert resumed.client_slots("a") == server.client_slots("a") == [0, 1]  # slots in order met
    assert torch.equal(resumed.softmax_mask("a"), server.softmax_mask("a"))
