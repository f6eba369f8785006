"""The Flower app on Flower's real engines, against the in-process engine: the Simulation Engine
(Ray, virtual SuperNodes) and a deployment (a SuperLink and 2 SuperNodes as processes on
loopback, `flwr run`). Same seed, data and budget give the same numbers, bit for bit: the
arithmetic of every client turn is the same (test_flower.py explains why)."""

from __future__ import annotations

import json

import torch
import yaml

from harmony_mobile.flower.deployment import LocalDeployment
from harmony_mobile.flower.run import train_flower
from harmony_mobile.flower.settings import FlowerSettings
from harmony_mobile.models.tiers import DEFAULT_TIERS_FILE
from harmony_mobile.run_dir import SECRET_FILE, RunDir
from harmony_mobile.training import train
from tests.test_flower import SPLIT_TINY, metric_lines, same_lineage, tiny_config


def assert_same_run(flower_path, inprocess_path) -> None:
    assert metric_lines(flower_path) == metric_lines(inprocess_path)
    flower, reference = RunDir(flower_path), RunDir(inprocess_path)
    for key in ("summary", "mean", "thresholds"):
        assert json.dumps(flower.final_metrics()[key], sort_keys=True) == json.dumps(
            reference.final_metrics()[key], sort_keys=True
        )
    assert flower.info.model_version == reference.info.model_version
    for a, b in zip(flower.clients(), reference.clients(), strict=True):
        assert all(torch.equal(a.front_end_state[k], b.front_end_state[k]) for k in b.front_end_state)
        flower.front_end(a)  # what `harmony export` loads


def test_simulation_engine_matches_the_in_process_engine(tmp_path):
    # one client turn of split steps through Ray; personalization without split steps (kept short)
    config = tiny_config("harmony", rounds=1, clients_per_round=1)
    config = config.model_copy(update={"algorithm_config": {**SPLIT_TINY, "personalize_epochs": 0}})
    train(config, tmp_path / "inprocess", show_progress=False)
    same_lineage(tmp_path / "inprocess", tmp_path / "flower")
    train_flower(FlowerSettings(train_config=config, run_dir=str(tmp_path / "flower"), reply_timeout=300))
    assert_same_run(tmp_path / "flower", tmp_path / "inprocess")


def two_tier_file(tmp_path):
    tiers = yaml.safe_load(DEFAULT_TIERS_FILE.read_text())
    tiers["tiers"] = tiers["tiers"][:2]
    path = tmp_path / "tiers.yaml"
    path.write_text(yaml.safe_dump(tiers))
    return str(path)


def test_superlink_and_two_supernodes_match_the_in_process_engine(tmp_path):
    config = tiny_config(rounds=1, tiers_file=two_tier_file(tmp_path))
    settings = FlowerSettings(train_config=config, run_dir=str(tmp_path / "flower"), reply_timeout=300)
    train(config, tmp_path / "inprocess", show_progress=False)
    same_lineage(tmp_path / "inprocess", tmp_path / "flower")
    # the SuperNodes read the federation secret from the file their node config names
    secret_file = tmp_path / "flower" / SECRET_FILE
    with LocalDeployment(2, work_dir=tmp_path / "deployment", secret_file=secret_file) as deployment:
        deployment.run(settings)
        assert len(deployment.processes) == 3 and all(p.poll() is None for p in deployment.processes)
    assert all(p.poll() is not None for p in deployment.processes)
    assert_same_run(tmp_path / "flower", tmp_path / "inprocess")
