import math

import torch
import torch.nn.functional as F

from harmony_mobile.algorithms.losses import distillation_loss, supcon_loss


def test_supcon_matches_a_hand_computed_batch():
    # 3 unit vectors; rows 0 and 1 share a group, row 2 has no positive (skipped as anchor)
    embeddings = torch.tensor([[1.0, 0.0], [0.6, 0.8], [0.0, 1.0]])
    groups = torch.tensor([4, 4, 9])
    t = 0.5
    s = embeddings @ embeddings.T / t
    # anchor 0: positive 1 among {1, 2}; anchor 1: positive 0 among {0, 2}
    l0 = -(s[0, 1] - math.log(math.exp(s[0, 1]) + math.exp(s[0, 2])))
    l1 = -(s[1, 0] - math.log(math.exp(s[1, 0]) + math.exp(s[1, 2])))
    expected = (l0 + l1) / 2
    assert torch.isclose(supcon_loss(embeddings, groups, t), torch.tensor(float(expected)), atol=1e-6)


def test_supcon_is_lower_when_positives_are_aligned():
    groups = torch.tensor([0, 0, 1, 1])
    aligned = F.normalize(torch.tensor([[1.0, 0.1], [1.0, -0.1], [0.1, 1.0], [-0.1, 1.0]]), dim=1)
    crossed = F.normalize(torch.tensor([[1.0, 0.1], [0.1, 1.0], [1.0, -0.1], [-0.1, 1.0]]), dim=1)
    assert supcon_loss(aligned, groups) < supcon_loss(crossed, groups)


def test_supcon_without_positives_is_zero_with_a_gradient_path():
    embeddings = F.normalize(torch.randn(3, 4), dim=1).requires_grad_(True)
    loss = supcon_loss(embeddings, torch.tensor([0, 1, 2]))
    assert loss.item() == 0.0
    loss.backward()
    assert embeddings.grad is not None


def test_distillation_is_zero_for_identical_logits_and_positive_otherwise():
    logits = torch.randn(5, 10)
    assert distillation_loss(logits, logits).abs().item() < 1e-6
    assert distillation_loss(logits, logits.flip(1)).item() > 0.01
