"""The screening's paired runs: one HARMONY run of the Fashion-MNIST screening setting under the
benchmark's seed-derived federation secret, so runs of one seed share their split.

    python paired_run.py RUN_DIR SEED '{"contrastive_to_front_ends": false}'
"""

import hashlib
import json
import sys
import time

import torch

from harmony_mobile import training
from harmony_mobile.run_dir import write_federation_secret

torch.set_num_threads(1)


class Paired(training.TrainObserver):
    """Seed-derived lineage, as the benchmark's: runs of one seed share their split."""

    def __init__(self, seed):
        self.seed = seed

    def lineage(self, run_path):
        secret = hashlib.sha256(f"harmony-bench/federation-secret/{self.seed}".encode()).digest()
        write_federation_secret(run_path, secret)
        return secret, f"e-bench-{self.seed}"


out, seed, extra = sys.argv[1], int(sys.argv[2]), json.loads(sys.argv[3])
cfg = training.TrainConfig(
    dataset="fashion_mnist",
    dataset_limit=36000,
    clients_per_tier=3,
    partition="family",
    rounds=12,
    seed=seed,
    algorithm="harmony",
    algorithm_config={"local_steps": 5, "batch_size": 32, "personalize_epochs": 1, **extra},
)
t = time.time()
training.train(cfg, out, show_progress=False, observer=Paired(seed))
print(out, "wall", round(time.time() - t), flush=True)
