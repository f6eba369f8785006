"""The Flower app on Flower's real engines, against the in-process engine: the Simulation Engine
(Ray, virtual SuperNodes) and a deployment (a SuperLink and 2 SuperNodes as processes on
loopback, `flwr run`). Same seed, data and budget give the same numbers, bit for bit: the
arithmetic of every client turn is the same (test_flower.py explains why). The deployment's
SuperNodes are SIGKILLed mid-round too: the run goes on, stops clearly, and resumes."""

from __future__ import annotations

import json
import os
import re
import signal
import threading

import pytest
import torch
import yaml

from harmony_mobile.flower.deployment import DeploymentError, LocalDeployment
from harmony_mobile.flower.run import FlowerRunError, train_flower
from harmony_mobile.flower.settings import FlowerSettings
from harmony_mobile.models.tiers import DEFAULT_TIERS_FILE
from harmony_mobile.run_dir import SECRET_FILE, RunDir, write_federation_secret
from harmony_mobile.training import train
from tests.test_flower import SPLIT_TINY, metric_lines, run_on_loopback, same_lineage, tiny_config

# A SuperNode that dies stops sending heartbeats; the SuperLink marks it offline after two missed
# ones (at most a minute) and answers messages to it with an error, so the ServerApp learns of the
# death without waiting out reply_timeout, which can then stay long enough for live turns on a
# busy machine (a deployed ClientApp is a fresh process per message: import torch, load the data).
REPLY_TIMEOUT = 300.0


def assert_same_run(flower_path, inprocess_path) -> None:
    assert metric_lines(flower_path) == metric_lines(inprocess_path)
    flower, reference = RunDir(flower_path), RunDir(inprocess_path)
    expected = reference.final_metrics()
    expected["summary"].pop("alignment_score", None)  # needs pooled labelled features: in-process only
    for key in ("summary", "mean", "thresholds"):
        assert json.dumps(flower.final_metrics()[key], sort_keys=True) == json.dumps(
            expected[key], sort_keys=True
        )
    assert flower.info.model_version == reference.info.model_version
    for a, b in zip(flower.clients(), reference.clients(), strict=True):
        assert all(torch.equal(a.front_end_state[k], b.front_end_state[k]) for k in b.front_end_state)
        flower.front_end(a)  # what `harmony export` loads


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


def two_tier_file(directory):
    tiers = yaml.safe_load(DEFAULT_TIERS_FILE.read_text())
    tiers["tiers"] = tiers["tiers"][:2]
    path = directory / "tiers.yaml"
    path.write_text(yaml.safe_dump(tiers))
    return str(path)


@pytest.fixture(scope="module")
def deployment(tmp_path_factory):
    """One SuperLink and 2 SuperNodes for the module's runs (each `flwr run` is a new Flower run).
    The SuperNodes read the federation secret from the file their node config names; every run
    dir here is provisioned with that file."""
    work_dir = tmp_path_factory.mktemp("deployment")
    write_federation_secret(work_dir, os.urandom(32))
    with LocalDeployment(2, work_dir=work_dir / "flower", secret_file=work_dir / SECRET_FILE) as running:
        running.tiers_file = two_tier_file(work_dir)
        yield running
    assert all(p.poll() is not None for p in running.processes)


def provisioned_run_dir(path, deployment):
    write_federation_secret(path, deployment.secret_file.read_bytes())
    return path


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


class KillOnTurn(threading.Thread):
    """SIGKILLs a SuperNode (its process group: the ClientApp process it started too) as soon as its
    log shows it received its train.round message of `round_id`: the client dies mid-turn."""

    def __init__(self, deployment, partition: int, round_id: int):
        super().__init__(daemon=True)
        self.deployment, self.partition = deployment, partition
        self.log = deployment.supernode_log(partition)
        self.offset = self.log.stat().st_size  # earlier runs' lines do not count
        self.pattern = re.compile(rf"ROUND {round_id}\]\s*\n[^\n]*Receiving: train\.round")
        self.killed = False
        self.stop = threading.Event()

    def run(self) -> None:
        while not self.stop.is_set() and not self.killed:
            text = self.log.read_bytes()[self.offset :].decode(errors="replace")
            if self.pattern.search(text):
                self.deployment.kill(self.deployment.supernodes[self.partition], signal.SIGKILL)
                self.killed = True
            self.stop.wait(0.05)


def test_a_supernode_killed_mid_round_neither_stalls_nor_corrupts_the_run(tmp_path, deployment):
    """Client 1's SuperNode is SIGKILLed during its round-1 turn. With min_replies=2 the run stops
    with a clear error and round 0's checkpoint; the same run with min_replies=1 resumes at round 1,
    which proceeds with client 0's reply, and client 1 keeps its meta-weights. The numbers are those
    of the in-process Grid with client 1 silent from round 1."""
    config = tiny_config(rounds=2, tiers_file=deployment.tiers_file)
    run_path = provisioned_run_dir(tmp_path / "flower", deployment)
    settings = FlowerSettings(
        train_config=config,
        run_dir=str(run_path),
        min_replies=2,
        reply_timeout=REPLY_TIMEOUT,
        node_wait_timeout=10,
    )
    killer = KillOnTurn(deployment, 1, round_id=1)
    killer.start()
    try:
        with pytest.raises(DeploymentError) as stopped:
            deployment.run(settings)
    finally:
        killer.stop.set()
    assert killer.killed
    assert "round 1: 1 of 2 sampled clients replied, fewer than min_replies=2" in str(stopped.value)
    assert [(m["round"], m["clients"]) for m in metric_lines(run_path)] == [(0, 2)]
    assert torch.load(run_path / "checkpoints/last.pt", weights_only=True)["completed_round"] == 0

    deployment.run(settings.model_copy(update={"min_replies": 1}))
    assert [(m["round"], m["clients"]) for m in metric_lines(run_path)] == [(0, 2), (1, 1)]
    assert RunDir(run_path).final_metrics()["clients_without_personalization"] == [1]

    same_lineage(run_path, tmp_path / "loopback")
    with pytest.raises(FlowerRunError, match="round 1: 1 of 2"):
        run_on_loopback(tmp_path, config, name="loopback", min_replies=2, dies_at={1: 1})
    run_on_loopback(tmp_path, config, name="loopback", dies_at={1: 1})
    assert_same_run(run_path, tmp_path / "loopback")
