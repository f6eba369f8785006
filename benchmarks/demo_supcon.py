"""`harmony demo` on this code with SupCon turned on in training and in the alignment round, at the
weight both defaulted to before it was turned off: the paired arm of `harmony demo --seed S --out DIR`.

    python benchmarks/demo_supcon.py SEED OUT_DIR

benchmarks/results/demo_seeds_supcon/ compares three seeds of each with benchmarks/demo_seeds.py."""

import sys
from dataclasses import dataclass, field
from pathlib import Path

from harmony_mobile.demo import DemoConfig, run_demo


@dataclass
class SupConDemo(DemoConfig):
    alignment: dict = field(default_factory=lambda: {"contrastive_weight": 0.5})

    def train_config(self):
        return super().train_config().model_copy(update={"algorithm_config": {"contrastive_weight": 0.5}})


if __name__ == "__main__":
    run_demo(SupConDemo(out=Path(sys.argv[2]), seed=int(sys.argv[1])))
