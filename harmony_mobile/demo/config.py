"""What `harmony demo` is configured with (DemoConfig), its error, and the names shared by the
stages and the report (the measured phases, rows per sealed upload)."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from harmony_mobile.training import TrainConfig

PHASES = ("deployed", "drifted", "aligned")
UPLOAD_ROWS = 32  # confirmed samples per sealed upload
PHASE_TITLES = {
    "deployed": "deployed (trained back-end)",
    "drifted": "after local drift",
    "aligned": "after the alignment round",
}

# How a step reports progress without drawing it: report(steps done, what it does now); a None
# description keeps the previous one. The stages in run.py turn it into a progress bar.
ProgressReport = Callable[[int, str | None], None]


class DemoError(RuntimeError):
    pass


def training_default(name: str) -> Any:
    """TrainConfig's default for `name`: the demo trains like `harmony train` unless it says otherwise."""
    return TrainConfig.model_fields[name].default


@dataclass
class DemoConfig:
    out: Path = Path("demo-output")
    dataset: str = training_default("dataset")
    dataset_limit: int | None = training_default("dataset_limit")
    tiers_file: str | None = training_default("tiers_file")
    clients_per_tier: int = training_default("clients_per_tier")
    rounds: int = 8  # the demo's small budget, below `harmony train`'s
    algorithm: str = training_default("algorithm")  # a split method the export ships (exit rules: 3.5)
    seed: int = training_default("seed")
    quantization: str = "int8"  # which .pte each phone runs
    ood_fraction: float = 0.5
    max_test: int | None = None  # cap on ID test samples per phone (the e2e test uses a small one)
    confirmed: int = 128  # confirmed samples each phone uploads per phase (deployed, drifted)
    # on-device personalization: SGD steps through the export's training .pte (exit classifier only;
    # the batch is the program's, from the manifest)
    drift_steps: int = 200
    drift_lr: float = 0.01
    # JSON body of POST /v1/alignment/rounds: empty = the server's defaults (docs/PROTOCOL.md 7).
    # The round distills to the current version on the replay set shipped in backend.pt (features
    # of the clients' training images), not on the uploads it must correct.
    alignment: dict[str, Any] = field(default_factory=dict)
    latency_runs: int = 20  # export's own latency measurement per .pte
    reuse_run: bool = False  # keep a finished run in OUT/run with the same configuration
    alignment_timeout: float = 600.0
    outage_images: int = 20  # test images each phone answers while the server is down

    def train_config(self) -> TrainConfig:
        return TrainConfig(
            dataset=self.dataset,
            dataset_limit=self.dataset_limit,
            tiers_file=self.tiers_file,
            clients_per_tier=self.clients_per_tier,
            rounds=self.rounds,
            algorithm=self.algorithm,
            seed=self.seed,
            threads=1,
        )
