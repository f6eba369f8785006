"""`multi-exit` baseline (docs/ALGORITHM.md, Baselines): hybrid split federated learning with an early
exit and a server fallback but without personalization mixing, i.e. SplitGP with lambda = 0.

Every client of a family ends with the family's averaged front-end; the server back-end is trained
with the server CE of all clients. Same loss, entropy fallback and calibration as `splitgp`.
"""

from __future__ import annotations

from pydantic import Field

from harmony_mobile.algorithms.splitgp import SplitGP, SplitGPConfig


class MultiExitConfig(SplitGPConfig):
    mix_lambda: float = Field(default=0.0, ge=0, le=0, description="no personalization mixing (fixed at 0)")


class MultiExit(SplitGP):
    name = "multi-exit"
    Config = MultiExitConfig
