"""Losses shared by training and by the server's alignment rounds."""

from __future__ import annotations

import torch
import torch.nn.functional as F

# re-exported: training and the alignment round read the default temperatures from here
from harmony_mobile.models.constants import DISTILLATION_TEMPERATURE as DISTILLATION_TEMPERATURE
from harmony_mobile.models.constants import SUPCON_TEMPERATURE as SUPCON_TEMPERATURE


def supcon_loss(embeddings: torch.Tensor, groups: torch.Tensor, temperature: float) -> torch.Tensor:
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


def cross_family_supcon(
    anchors: torch.Tensor,
    anchor_groups: torch.Tensor,
    anchor_family: int,
    held_groups: torch.Tensor,
    candidates: torch.Tensor,
    candidate_groups: torch.Tensor,
    candidate_families: torch.Tensor,
    temperature: float,
) -> torch.Tensor:
    """SupCon that aligns model families (docs/ALGORITHM.md, step 7), for one client's upload against
    the features pooled over the round.

    Anchor i (a row of the uploading client, family `anchor_family`) is pulled towards the pooled
    rows of its group from OTHER families (same-family positives would not align extractors across
    families) and pushed only from pooled rows whose group the anchor's own client holds
    (`held_groups`): a negative from a class the client never holds would teach g that this
    family's features are never that class, the bias the restricted CE removes. Anchors without a
    cross-family positive are skipped; with none at all the loss is zero with a gradient path.
    `candidates` are L2-normalized (usually detached) rows of the round; groups are token-group
    indices, never class ids.
    """
    if anchors.shape[0] != anchor_groups.shape[0] or candidates.shape[0] != candidate_groups.shape[0]:
        raise ValueError("every embedding row needs one group id")
    if candidate_groups.shape[0] != candidate_families.shape[0]:
        raise ValueError("every candidate row needs one family id")
    if candidates.shape[0] == 0:
        return anchors.sum() * 0.0
    similarity = anchors @ candidates.T / temperature  # (n, m)
    same_group = anchor_groups[:, None] == candidate_groups[None, :]
    other_family = (candidate_families != anchor_family)[None, :]
    positives = same_group & other_family
    negatives = ~same_group & torch.isin(candidate_groups, held_groups)[None, :]
    has_positive = positives.any(dim=1)
    if not has_positive.any():
        return anchors.sum() * 0.0
    logits = similarity.masked_fill(~(positives | negatives), float("-inf"))
    log_prob = logits - torch.logsumexp(logits, dim=1, keepdim=True)
    positive_count = positives.sum(dim=1)
    mean_log_prob = (
        log_prob.masked_fill(~positives, 0.0).sum(dim=1)[has_positive] / positive_count[has_positive]
    )
    return -mean_log_prob.mean()


def distillation_loss(
    student_logits: torch.Tensor, teacher_logits: torch.Tensor, temperature: float
) -> torch.Tensor:
    """KL(teacher || student) on softened predictions, scaled by T^2 (Hinton et al.)."""
    teacher = F.log_softmax(teacher_logits / temperature, dim=1)
    student = F.log_softmax(student_logits / temperature, dim=1)
    return F.kl_div(student, teacher, log_target=True, reduction="batchmean") * temperature**2
