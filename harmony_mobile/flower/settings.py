"""What a Flower run needs beyond the training config, and how it travels as Flower run config.

`flwr run` hands the ServerApp and every ClientApp the same flat run config (strings, numbers,
booleans). Every setting is its own key, so `flwr run ... --run-config "rounds=20 seed=3"`
overrides it: the training config's fields with dashes (`clients-per-round`), None written as ""
(TOML has no null), and the algorithm's own options as one JSON string (`algorithm-config`:
their names depend on the algorithm). Flower accepts an override only for a key the app's
pyproject.toml lists, so flower_app/pyproject.toml carries `app_config_defaults()`, which this
module is the one definition of (a test keeps them equal; `python -m
harmony_mobile.flower.deployment app-config` prints the table).

`code-version` pins the code: the ServerApp and every ClientApp refuse a run whose value is not
their own `code_version()` (the app bundle carries no code; each process runs its installed
harmony_mobile). Nothing secret belongs here: the server reads the run config too. The
federation secret reaches a client through its node config.
"""

from __future__ import annotations

import json
import types
import typing
from functools import cache
from importlib import metadata

from pydantic import BaseModel, ConfigDict, Field, model_validator

from harmony_mobile.models import load_tiers
from harmony_mobile.training import TrainConfig

SETTINGS_KEYS = (
    "run-dir",
    "min-replies",
    "reply-timeout",
    "node-wait-timeout",
    "max-in-flight",
    "code-version",
)
JSON_FIELDS = ("algorithm_config",)  # dicts: one JSON string each
DEFAULT_RUN_DIR = "runs/flower"


class CodeVersionError(RuntimeError):
    """The run was started for other code than this process runs."""


@cache
def code_version() -> str:
    """The installed harmony_mobile's package version: every machine of a deployment must run the
    same release (bump the version for changed code). Not a digest of the sources: each deployed
    ClientApp is a fresh process per message, and a digest taken while a checkout is being edited
    would refuse the run's own later messages."""
    try:
        return metadata.version("harmony-mobile")
    except metadata.PackageNotFoundError:
        return "unknown"


def client_count(config: TrainConfig) -> int:
    return len(load_tiers(config.tiers_file).tiers) * config.clients_per_tier


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
    reply_timeout: float = Field(
        default=600.0,
        gt=0,
        description="seconds to wait for a client's reply to one message, from when it is sent (a round's "
        "messages go out at once: on a few workers this includes the wait behind the other clients)",
    )
    node_wait_timeout: float = Field(
        default=120.0, gt=0, description="seconds to wait for the SuperNodes to connect before round 0"
    )
    max_in_flight: int = Field(
        default=256,
        ge=1,
        description="messages outstanding at once: a round's sampled clients up to this many train "
        "concurrently; each outstanding message holds a copy of a model in the ServerApp and the SuperLink",
    )
    code_version: str = Field(
        default_factory=code_version, description='the code the run is for (`code_version()`); "" = unpinned'
    )

    @model_validator(mode="after")
    def _enough_clients_to_reply(self) -> FlowerSettings:
        """A round can never get more replies than it samples clients: refused now, not after a wait."""
        config = self.train_config
        clients = client_count(config)
        sampled = min(config.clients_per_round or clients, clients)
        if self.min_replies > sampled:
            raise ValueError(
                f"min_replies={self.min_replies}, but a round samples {sampled} of the run's {clients} "
                "clients: lower --min-replies or sample more clients per round"
            )
        return self

    def check_code_version(self) -> None:
        mine = code_version()
        if self.code_version != mine:
            raise CodeVersionError(
                f"this run config pins code-version {self.code_version!r}, this process runs {mine!r}: install "
                f"the same harmony_mobile everywhere and pass --run-config 'code-version=\"{mine}\"' "
                "(`python -m harmony_mobile.flower.deployment code-version` prints it)"
            )

    def to_run_config(self) -> dict[str, str | int | float | bool]:
        flat: dict[str, str | int | float | bool] = {
            "run-dir": self.run_dir,
            "min-replies": self.min_replies,
            "reply-timeout": self.reply_timeout,
            "node-wait-timeout": self.node_wait_timeout,
            "max-in-flight": self.max_in_flight,
            "code-version": self.code_version,
        }
        for name, value in self.train_config.model_dump().items():
            key = name.replace("_", "-")
            flat[key] = json.dumps(value) if name in JSON_FIELDS else ("" if value is None else value)
        return flat

    @classmethod
    def from_run_config(cls, run_config: dict) -> FlowerSettings:
        train_keys = {name.replace("_", "-"): name for name in TrainConfig.model_fields}
        unknown = set(run_config) - set(train_keys) - set(SETTINGS_KEYS)
        if unknown:
            raise ValueError(f"the Flower run config has unknown keys {sorted(unknown)}")
        if "run-dir" not in run_config:
            raise ValueError("the Flower run config lacks ['run-dir']")
        train = {}
        for key, name in train_keys.items():
            if key not in run_config:
                continue
            value = run_config[key]
            if name in JSON_FIELDS:
                value = json.loads(str(value) or "{}")
            elif value == "" and accepts_none(name):
                value = None
            train[name] = value
        settings = {k.replace("-", "_"): run_config[k] for k in SETTINGS_KEYS if k in run_config}
        return cls(train_config=TrainConfig(**train), **settings)


def accepts_none(field_name: str) -> bool:
    annotation = TrainConfig.model_fields[field_name].annotation
    union = typing.get_origin(annotation) in (typing.Union, types.UnionType)
    return union and type(None) in typing.get_args(annotation)


def app_config_defaults() -> dict[str, str | int | float | bool]:
    """flower_app/pyproject.toml's [tool.flwr.app.config]: every key at its default, the code
    version unpinned (\"\": a run must name the code it is for)."""
    return FlowerSettings(
        train_config=TrainConfig(), run_dir=DEFAULT_RUN_DIR, code_version=""
    ).to_run_config()
