"""Losses shared by training and by the server's alignment rounds."""

from __future__ import annotations

import torch
import torch.nn.functional as F


def supcon_loss(embeddings: torch.Tensor, groups: torch.Tensor, temperature: float = 0.1) -> torch.Tensor:
    """Supervised contrastive loss (Khosla et al. 2020, L_out) with positives = equal group ids.

    `embeddings` are L2-normalized rows; `groups` are token-group indices (equal label tokens ->
    equal index), never class ids. Anchors without any positive are skipped; a batch with no
    positive pair gives a zero loss that still has a gradient path.
    """
    if embeddings.shape[0] != groups.shape[0]:
        raise ValueError(f"{embeddings.shape[0]} embeddings but {groups.shape[0]} group ids")
    n = embeddings.shape[0]
    similarity = embeddings @ embeddings.T / temperature
    not_self = ~torch.eye(n, dtype=torch.bool, device=embeddings.device)
    positives = (groups[:, None] == groups[None, :]) & not_self
    # log p(j | i) over every j != i
    similarity = similarity.masked_fill(~not_self, float("-inf"))
    log_prob = similarity - torch.logsumexp(similarity, dim=1, keepdim=True)
    positive_count = positives.sum(dim=1)
    has_positive = positive_count > 0
    if not has_positive.any():
        return embeddings.sum() * 0.0
    mean_log_prob = (log_prob.masked_fill(~positives, 0.0)).sum(dim=1)[has_positive] / positive_count[
        has_positive
    ]
    return -mean_log_prob.mean()


def distillation_loss(
    student_logits: torch.Tensor, teacher_logits: torch.Tensor, temperature: float = 2.0
) -> torch.Tensor:
    """KL(teacher || student) on softened predictions, scaled by T^2 (Hinton et al.)."""
    teacher = F.log_softmax(teacher_logits / temperature, dim=1)
    student = F.log_softmax(student_logits / temperature, dim=1)
    return F.kl_div(student, teacher, log_target=True, reduction="batchmean") * temperature**2
