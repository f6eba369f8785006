"""A local Flower deployment for a test module (a SuperLink and 2 SuperNodes as processes) and the
check that a Flower run gave exactly the in-process engine's numbers."""

from __future__ import annotations

import json
import os
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import torch
import yaml

from harmony_mobile.flower.deployment import LocalDeployment
from harmony_mobile.models.tiers import DEFAULT_TIERS_FILE
from harmony_mobile.run_dir import SECRET_FILE, RunDir, write_federation_secret
from tests.test_flower import metric_lines

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


def two_tier_file(directory):
    tiers = yaml.safe_load(DEFAULT_TIERS_FILE.read_text())
    tiers["tiers"] = tiers["tiers"][:2]
    path = directory / "tiers.yaml"
    path.write_text(yaml.safe_dump(tiers))
    return str(path)


@contextmanager
def local_deployment(work_dir: Path) -> Iterator[LocalDeployment]:
    """One SuperLink and 2 SuperNodes for a module's runs (each `flwr run` is a new Flower run).
    The SuperNodes read the federation secret from the file their node config names; every run
    dir is provisioned with that file (provisioned_run_dir)."""
    write_federation_secret(work_dir, os.urandom(32))
    with LocalDeployment(2, work_dir=work_dir / "flower", secret_file=work_dir / SECRET_FILE) as running:
        running.tiers_file = two_tier_file(work_dir)
        yield running
    assert all(p.poll() is not None for p in running.processes)


def provisioned_run_dir(path, deployment):
    write_federation_secret(path, deployment.secret_file.read_bytes())
    return path
