"""Feature clipping + Gaussian noise on uploads, and the (epsilon, delta) they give.

Each uploaded row z is L2-clipped to `clip` and gets N(0, (noise_multiplier * clip)^2) noise on
every coordinate before it leaves the phone: a Gaussian mechanism with sensitivity `clip` per
release of one sample's features (neighbouring data sets differ in one sample's features, which
clipping bounds to the `clip` ball around 0; replacing one sample by another doubles the
sensitivity, i.e. halves the effective noise multiplier: `replace_one=True`).

The accounting is done by Google's maintained `dp_accounting` library (RDP accountant), composed
over the number of times the most-released sample was released. No subsampling amplification is
claimed: training draws batches with replacement, which is not the Poisson sampling the
amplification theorems need, so the bound counts releases, as a worst case.
"""

from __future__ import annotations

import torch

DEFAULT_DELTA = 1e-5


def check_feature_privacy(clip: float | None, noise_multiplier: float | None) -> None:
    if clip is not None and not clip > 0:
        raise ValueError(f"the feature clip norm must be > 0, got {clip}")
    if noise_multiplier is not None and not noise_multiplier >= 0:
        raise ValueError(f"the noise multiplier must be >= 0, got {noise_multiplier}")
    if noise_multiplier and clip is None:
        raise ValueError("Gaussian noise on features needs a clip norm (--feature-clip): it is scaled by it")


def clip_rows(features: torch.Tensor, clip: float) -> torch.Tensor:
    """Each row scaled to L2 norm at most `clip` (differentiable: the client back-propagates through it)."""
    norms = features.flatten(1).norm(dim=1).clamp_min(1e-12)
    scale = (clip / norms).clamp(max=1.0)
    return features * scale.view(-1, *([1] * (features.dim() - 1)))


def privatize_features(
    features: torch.Tensor,
    clip: float | None,
    noise_multiplier: float | None,
    generator: torch.Generator | None = None,
) -> torch.Tensor:
    """Clip then add Gaussian noise (each optional); the identity when both are off."""
    check_feature_privacy(clip, noise_multiplier)
    if clip is None:
        return features
    clipped = clip_rows(features, clip)
    if not noise_multiplier:
        return clipped
    noise = torch.randn(clipped.shape, generator=generator, dtype=clipped.dtype) * (noise_multiplier * clip)
    return clipped + noise


def gaussian_epsilon(
    noise_multiplier: float, releases: int, delta: float = DEFAULT_DELTA, replace_one: bool = False
) -> float:
    """epsilon of `releases` Gaussian releases of one sample's clipped features, at `delta`."""
    if releases < 1:
        return 0.0
    if not noise_multiplier > 0:
        return float("inf")
    # imported here: dp_accounting pulls in scipy.signal and scipy.stats, seconds of import that a
    # process which only trains (a deployed ClientApp starts one per message) need not pay
    import dp_accounting
    from dp_accounting import rdp

    effective = noise_multiplier / 2 if replace_one else noise_multiplier
    accountant = rdp.RdpAccountant()
    accountant.compose(dp_accounting.SelfComposedDpEvent(dp_accounting.GaussianDpEvent(effective), releases))
    return float(accountant.get_epsilon(delta))


def feature_privacy_report(
    clip: float | None, noise_multiplier: float | None, releases: int, delta: float = DEFAULT_DELTA
) -> dict:
    """What run.json, the manifest and the bench report say about feature privacy."""
    report = {"feature_clip": clip, "noise_multiplier": noise_multiplier, "max_releases_per_sample": releases}
    if clip is None or not noise_multiplier:
        return {**report, "epsilon": None, "delta": None, "accountant": None}
    return {
        **report,
        "epsilon": gaussian_epsilon(noise_multiplier, releases, delta),
        "epsilon_replace_one": gaussian_epsilon(noise_multiplier, releases, delta, replace_one=True),
        "delta": delta,
        "accountant": "dp_accounting.rdp.RdpAccountant, SelfComposed(Gaussian) over releases",
    }
