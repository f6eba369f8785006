"""The benchmark scripts under benchmarks/ refuse bad arguments before they start any run."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

REPO_ROOT = Path(__file__).resolve().parent.parent
RUN_COST = REPO_ROOT / "benchmarks/run_cost.py"


@pytest.mark.parametrize(
    ("argument", "named"),
    [("--setting=mnist5k-everything", "mnist5k-everything"), ("--methods=harmony,fedsgd", "fedsgd")],
)
def test_run_cost_names_an_unknown_setting_or_method_before_training(tmp_path, argument, named):
    result = subprocess.run(
        [sys.executable, str(RUN_COST), f"--baseline={REPO_ROOT}", f"--out={tmp_path}", argument],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert result.returncode == 2, result.stderr
    assert named in result.stderr and "Traceback" not in result.stderr
    assert not (tmp_path / "report.md").exists()
