"""benchmarks/gate_study.py over a benchmark work folder: it finds the finished split runs, studies
every gate score on them (slot_margin from each run's replay set) and writes the report."""

from __future__ import annotations

import json
import sys
from pathlib import Path
from unittest import mock

import pytest

from harmony_mobile import training
from tests.test_bench_scripts import REPO_ROOT, load_script
from tests.test_flower import tiny_config

GATE_STUDY = REPO_ROOT / "benchmarks/gate_study.py"


@pytest.fixture(scope="module")
def work_folder(tmp_path_factory) -> Path:
    root = tmp_path_factory.mktemp("eval")
    for method in ("harmony", "fedavg"):
        config = tiny_config(method, rounds=1)
        training.train(config, root / "tiny" / method / "seed-0", show_progress=False)
    (root / "tiny" / "splitgp" / "seed-0").mkdir(parents=True)  # a run that never finished
    return root


def test_the_study_reads_every_finished_split_run_and_reports_each_gate_alike(work_folder, tmp_path):
    script = load_script(GATE_STUDY)
    assert script.split_runs_under(work_folder) == [work_folder / "tiny" / "harmony" / "seed-0"]
    argv = ["gate_study.py", "--runs-under", str(work_folder), "--report", str(tmp_path), "--threads", "1"]
    with mock.patch.object(sys, "argv", argv):
        script.main()
    records = json.loads((tmp_path / "study.json").read_text())
    assert [(r["setting"], r["method"], r["seed"]) for r in records] == [("tiny", "harmony", 0)]
    curves = records[0]["gates"]["test"]["p=0.2"]["curve"]
    assert "slot_margin" in curves and "max_softmax" in curves
    report = (tmp_path / "report.md").read_text()
    assert "### Every method gated by `slot_margin`" in report
    assert "| harmony | slot_margin |" in report and "| harmony | max_softmax |" in report
    assert "fedavg" not in report


def test_the_study_needs_a_report_folder_and_finished_runs(tmp_path, capsys):
    script = load_script(GATE_STUDY)
    for argv, message in (
        (["--runs-under", str(tmp_path)], "--runs-under needs --report"),
        (["--runs-under", str(tmp_path), "--report", str(tmp_path / "r")], "no finished split run"),
    ):
        with mock.patch.object(sys, "argv", ["gate_study.py", *argv]), pytest.raises(SystemExit):
            script.main()
        assert message in capsys.readouterr().err


def test_gate_combos_scores_its_candidates_and_leaves_the_harness_as_it_was(work_folder, tmp_path):
    """The combination study computes the harness's own slot_margin and max_softmax curves among its
    candidates, and the harness scores by its own gates again afterwards."""
    from harmony_mobile.bench import gates

    script = load_script(REPO_ROOT / "benchmarks/gate_combos.py")
    run = work_folder / "tiny" / "harmony" / "seed-0"
    argv = [
        "gate_combos.py",
        "--runs-under",
        str(work_folder),
        "--method",
        "harmony",
        "--report",
        str(tmp_path),
    ]
    with mock.patch.object(sys, "argv", argv):
        script.main()
    assert gates.gate_scores is not script.candidate_scores and gates.slot_gates is script.SLOT_GATES
    combos = json.loads((tmp_path / "study.json").read_text())["tiny"][0]
    gate_study = load_script(GATE_STUDY).study_run(run)
    for on in ("val", "test"):
        for p in ("p=0.2", "p=0.5"):
            mine, harness = combos[on][p]["curve"], gate_study[on][p]["curve"]
            assert mine["slot_margin"] == harness["slot_margin"]
            assert mine["max_softmax"] == harness["max_softmax"]
            assert {"margin + 0.25 max_softmax", "own-slot mass, T 0.05", "margin, disagreeing last"} <= set(
                mine
            )
    report = (tmp_path / "report.md").read_text()
    assert "## tiny (1 seeds)" in report and "| own-slot mass, T 0.1 |" in report
