"""The Flower app on Flower's real engines, against the in-process engine: the Simulation Engine
(Ray, virtual SuperNodes) and a deployment (a SuperLink and 2 SuperNodes as processes on
loopback, `flwr run`). Same seed, data and budget give the same numbers, bit for bit: the
arithmetic of every client turn is the same (test_flower.py explains why). SuperNodes killed
mid-round: test_flower_node_failure.py."""

from __future__ import annotations

import pytest

from harmony_mobile.flower.run import train_flower
from harmony_mobile.flower.settings import FlowerSettings
from harmony_mobile.training import train
from tests.helpers.flower_deployment import (
    REPLY_TIMEOUT,
    assert_same_run,
    provisioned_run_dir,
)
from tests.test_flower import SPLIT_TINY, same_lineage, tiny_config


# multi-exit's arithmetic on Flower is checked on the loopback Grid (test_flower.py) and harmony's
# split turns through Ray here; multi-exit through Ray is one more Ray session, outside `make test`
@pytest.mark.parametrize("algorithm", ["harmony", pytest.param("multi-exit", marks=pytest.mark.slow)])
def test_simulation_engine_matches_the_in_process_engine(tmp_path, algorithm):
    # one client turn of split steps through Ray; personalization without split steps (kept short)
    config = tiny_config(algorithm, rounds=1, clients_per_round=1)
    config = config.model_copy(update={"algorithm_config": {**SPLIT_TINY, "personalize_epochs": 0}})
    train(config, tmp_path / "inprocess", show_progress=False)
    same_lineage(tmp_path / "inprocess", tmp_path / "flower")
    train_flower(FlowerSettings(train_config=config, run_dir=str(tmp_path / "flower"), reply_timeout=300))
    assert_same_run(tmp_path / "flower", tmp_path / "inprocess")


def test_superlink_and_two_supernodes_match_the_in_process_engine(tmp_path, deployment):
    config = tiny_config(rounds=1, tiers_file=deployment.tiers_file)
    train(config, provisioned_run_dir(tmp_path / "inprocess", deployment), show_progress=False)
    same_lineage(tmp_path / "inprocess", tmp_path / "flower")
    settings = FlowerSettings(
        train_config=config, run_dir=str(tmp_path / "flower"), reply_timeout=REPLY_TIMEOUT
    )
    deployment.run(settings)
    assert len(deployment.supernodes) == 2 and all(p.poll() is None for p in deployment.processes)
    assert_same_run(tmp_path / "flower", tmp_path / "inprocess")
