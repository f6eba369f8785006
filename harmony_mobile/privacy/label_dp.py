"""Label differential privacy by randomized response on each row's class (docs/PRIVACY.md).

Before its token is computed, a row's class is kept with probability e^eps / (e^eps + C - 1) and
otherwise replaced by a uniformly random *other* class, so the token a row uploads is an
eps-label-DP release of its label, even against a server that can name every slot. A sample is
randomized once and keeps its randomized class for every later release (re-drawing per release
would let a server average the noise away).
"""

from __future__ import annotations

import math

import torch


def check_label_dp_epsilon(epsilon: float | None) -> float | None:
    if epsilon is not None and not (epsilon > 0 and math.isfinite(epsilon)):
        raise ValueError(f"the label-DP epsilon must be a finite number > 0, got {epsilon}")
    return epsilon


def keep_probability(epsilon: float, num_classes: int) -> float:
    """P(the uploaded class is the true one) = e^eps / (e^eps + C - 1)."""
    if num_classes < 2:
        raise ValueError(f"randomized response needs at least 2 classes, got {num_classes}")
    return 1.0 / (1.0 + (num_classes - 1) * math.exp(-epsilon))


def randomized_response(
    labels: torch.Tensor, epsilon: float, num_classes: int, generator: torch.Generator | None = None
) -> torch.Tensor:
    """Each label kept with keep_probability, else a uniformly random other class."""
    check_label_dp_epsilon(epsilon)
    keep = torch.rand(labels.shape, generator=generator) < keep_probability(epsilon, num_classes)
    # an offset in 1..C-1 added modulo C is a uniform draw among the other classes
    offset = torch.randint(1, num_classes, labels.shape, generator=generator)
    return torch.where(keep, labels, (labels + offset) % num_classes)
