"""A deployment's SuperNode SIGKILLed mid-round (a SuperLink and 2 SuperNodes as processes on
loopback): the run neither stalls nor corrupts, stops clearly when too few replied, and resumes
with the in-process engine's numbers for the same loss. Its own file so that it runs beside
test_flower_engines.py (it waits on the SuperLink's heartbeat timeout)."""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest
import torch

from harmony_mobile.flower.deployment import DeploymentError
from harmony_mobile.flower.run import FlowerRunError
from harmony_mobile.flower.settings import FlowerSettings
from harmony_mobile.run_dir import RunDir
from tests.helpers.flower_deployment import (
    REPLY_TIMEOUT,
    assert_same_run,
    provisioned_run_dir,
)
from tests.test_flower import metric_lines, run_on_loopback, same_lineage, tiny_config


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


def test_a_deployment_whose_parent_is_killed_leaves_no_process_behind(tmp_path):
    """SIGKILL skips every cleanup in the parent: the SuperLink must still stop by itself."""
    script = (
        "import os, signal, sys\n"
        "from pathlib import Path\n"
        "from harmony_mobile.flower.deployment import LocalDeployment\n"
        f"d = LocalDeployment(0, work_dir=Path({str(tmp_path)!r}))\n"
        "d.start()\n"
        "print(d.processes[0].pid, flush=True)\n"
        "os.kill(os.getpid(), signal.SIGKILL)\n"
    )
    parent = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=120)
    assert parent.returncode == -signal.SIGKILL, parent.stderr
    superlink = int(parent.stdout.split()[0])
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline and running(superlink):
        time.sleep(0.2)
    left_behind = running(superlink)
    if left_behind:
        os.kill(superlink, signal.SIGKILL)
    assert not left_behind


def running(pid: int) -> bool:
    """Whether the process exists and is not a zombie waiting to be reaped."""
    stat = Path(f"/proc/{pid}/stat")
    try:
        return stat.read_text().rsplit(")", 1)[1].split()[0] != "Z"
    except (FileNotFoundError, ProcessLookupError):
        return False
