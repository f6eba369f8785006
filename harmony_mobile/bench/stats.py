"""Paired comparisons over seeds: every difference between two methods is taken seed by seed (same
partition, tiers and initial weights on both sides) and summarized by its mean and a Student-t
confidence interval over the seeds."""

from __future__ import annotations

import math

import numpy as np
from scipy import stats


def paired_ci(differences: list[float], confidence: float = 0.95) -> dict:
    """Mean of per-seed differences with a two-sided t confidence interval. Fewer than two defined
    differences give no interval (NaN bounds, `excludes_zero` False)."""
    values = np.array([d for d in differences if d is not None and not math.isnan(d)], dtype=float)
    n = len(values)
    mean = float(values.mean()) if n else math.nan
    std = float(values.std(ddof=1)) if n > 1 else math.nan
    if n < 2:
        low = high = math.nan
    elif std == 0:
        low = high = mean
    else:
        half = float(stats.t.ppf(0.5 + confidence / 2, df=n - 1)) * std / math.sqrt(n)
        low, high = mean - half, mean + half
    return {
        "mean": mean,
        "std": std,
        "n": n,
        "low": low,
        "high": high,
        "confidence": confidence,
        "excludes_zero": bool(n > 1 and (low > 0 or high < 0)),
        "per_seed": [float(v) for v in values],
    }


def sum_known(values) -> float | None:
    """The sum, or None if any value is unknown (None): a total over records of older code that
    did not keep the value is not a total."""
    values = list(values)
    return None if any(v is None for v in values) else float(sum(values))
