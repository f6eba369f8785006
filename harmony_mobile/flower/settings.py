"""What a Flower run needs beyond the training config, and how it travels as Flower run config.

`flwr run` hands the ServerApp and every ClientApp the same flat run config (strings, numbers,
booleans); the training config rides in it as JSON. Nothing secret belongs here: the server
reads the run config too. The federation secret reaches a client through its node config.
"""

from __future__ import annotations

import json

from pydantic import BaseModel, ConfigDict, Field

from harmony_mobile.training import TrainConfig


class FlowerSettings(BaseModel):
    model_config = ConfigDict(extra="forbid")

    train_config: TrainConfig
    run_dir: str = Field(description="the run directory the ServerApp writes (on the server's machine)")
    min_replies: int = Field(
        default=1,
        ge=1,
        description="a round with fewer client replies than this stops the run (its last checkpoint "
        "stays; rerunning resumes); with at least this many it proceeds with the replies it has",
    )
    reply_timeout: float = Field(default=600.0, gt=0, description="seconds to wait for one client's reply")
    node_wait_timeout: float = Field(
        default=120.0, gt=0, description="seconds to wait for the SuperNodes to connect before round 0"
    )

    def to_run_config(self) -> dict[str, str | int | float]:
        return {
            "train-config": self.train_config.model_dump_json(),
            "run-dir": self.run_dir,
            "min-replies": self.min_replies,
            "reply-timeout": self.reply_timeout,
            "node-wait-timeout": self.node_wait_timeout,
        }

    @classmethod
    def from_run_config(cls, run_config: dict) -> FlowerSettings:
        missing = {"train-config", "run-dir"} - set(run_config)
        if missing:
            raise ValueError(f"the Flower run config lacks {sorted(missing)}")
        values = {
            "train_config": TrainConfig(**json.loads(str(run_config["train-config"]))),
            "run_dir": str(run_config["run-dir"]),
        }
        for key in ("min-replies", "reply-timeout", "node-wait-timeout"):
            if key in run_config:
                values[key.replace("-", "_")] = run_config[key]
        return cls(**values)
