"""The benchmark scripts under benchmarks/ refuse bad arguments before they start any run."""

from __future__ import annotations

import importlib.util
import subprocess
import sys
from pathlib import Path

import pytest

REPO_ROOT = Path(__file__).resolve().parent.parent
RUN_COST = REPO_ROOT / "benchmarks/run_cost.py"


def load_run_cost():
    spec = importlib.util.spec_from_file_location("run_cost", RUN_COST)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.mark.parametrize(
    ("argument", "named"),
    [
        ("--setting=mnist5k-everything", "mnist5k-everything"),
        ("--methods=harmony,fedsgd", "fedsgd"),
        ("--profile=no-such-profile", "no-such-profile"),
    ],
)
def test_run_cost_names_an_unknown_setting_method_or_profile_before_training(tmp_path, argument, named):
    baseline = tmp_path / "baseline"  # only its interpreter's presence is checked before the names
    (baseline / ".venv/bin").mkdir(parents=True)
    (baseline / ".venv/bin/python").touch()
    out = tmp_path / "out"
    result = subprocess.run(
        [sys.executable, str(RUN_COST), f"--baseline={baseline}", f"--out={out}", argument],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert result.returncode == 2, result.stderr
    assert named in result.stderr and "Traceback" not in result.stderr, result.stderr
    assert not out.exists()


def test_run_cost_takes_any_setting_of_the_profile_and_spaced_method_lists():
    checked_methods = load_run_cost().checked_methods
    assert checked_methods("standard", "digits-dirichlet-0.1", "harmony, splitgp") == ["harmony", "splitgp"]
    assert "centralized" in checked_methods("standard", "mnist5k-family", None)
    with pytest.raises(ValueError, match="harmony-no-meta"):  # a renamed ablation names its new name
        checked_methods("standard", "mnist5k-family", "harmony-meta")
