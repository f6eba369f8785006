"""The benchmark scripts under benchmarks/ refuse bad arguments before they start any run."""

from __future__ import annotations

import importlib.util
import json
import sys
from pathlib import Path
from unittest import mock

import pytest

REPO_ROOT = Path(__file__).resolve().parent.parent
RUN_COST = REPO_ROOT / "benchmarks/run_cost.py"
STEP_COST = REPO_ROOT / "benchmarks/step_cost.py"


def load_script(path: Path):
    spec = importlib.util.spec_from_file_location(path.stem, path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def run_script(path: Path, capsys, *arguments: str) -> tuple[int | str | None, str]:
    """`python script ARGUMENTS` in this process, where torch is already imported (a new interpreter
    spends seconds on it): the script's main() under that argv, its exit code and stderr. The torch
    state a script sets for its timings (threads, seed) is put back afterwards."""
    import torch

    module = load_script(path)
    threads = torch.get_num_threads()
    started = AssertionError("the script started measuring instead of refusing its arguments")
    try:
        with mock.patch.object(sys, "argv", [str(path), *arguments]), torch.random.fork_rng():
            with (
                mock.patch.object(module, "measure", side_effect=started),
                pytest.raises(SystemExit) as exited,
            ):
                module.main()
    finally:
        torch.set_num_threads(threads)
    return exited.value.code, capsys.readouterr().err


def load_run_cost():
    return load_script(RUN_COST)


def test_step_cost_counts_the_multiply_accumulates_of_convolutions_and_linear_layers():
    from torch import nn

    step_cost = load_script(STEP_COST)
    model = nn.Sequential(
        nn.Conv2d(1, 4, 3, padding=1),  # 28 x 28 x 4 outputs, 9 MACs each
        nn.Conv2d(4, 4, 3, stride=2, padding=1, groups=4),  # depthwise: 14 x 14 x 4 outputs, 9 each
        nn.Flatten(),
        nn.Linear(4 * 14 * 14, 10),
    )
    assert step_cost.macs_per_sample(model) == 28 * 28 * 4 * 9 + 14 * 14 * 4 * 9 + 4 * 14 * 14 * 10
    full, half = (step_cost.macs_per_sample(step_cost.full_depth_model("cnn", w)) for w in (1.0, 0.5))
    assert 3.5 < full / half < 4.5  # channels halve on both sides of every convolution


@pytest.mark.parametrize(
    ("argument", "named"),
    [
        ("--setting=mnist5k-everything", "mnist5k-everything"),
        ("--methods=harmony,fedsgd", "fedsgd"),
        ("--profile=no-such-profile", "no-such-profile"),
    ],
)
def test_run_cost_names_an_unknown_setting_method_or_profile_before_training(
    tmp_path, capsys, argument, named
):
    baseline = tmp_path / "baseline"  # only its interpreter's presence is checked before the names
    (baseline / ".venv/bin").mkdir(parents=True)
    (baseline / ".venv/bin/python").touch()
    out = tmp_path / "out"
    code, stderr = run_script(RUN_COST, capsys, f"--baseline={baseline}", f"--out={out}", argument)
    assert code == 2, stderr
    assert named in stderr and "usage:" in stderr, stderr
    assert not out.exists()


def test_run_cost_takes_any_setting_of_the_profile_and_spaced_method_lists():
    checked_methods = load_run_cost().checked_methods
    assert checked_methods("standard", "digits-dirichlet-0.1", "harmony, splitgp") == ["harmony", "splitgp"]
    assert "centralized" in checked_methods("standard", "mnist5k-family", None)
    with pytest.raises(ValueError, match="harmony-with-meta"):  # a retired name says what to write
        checked_methods("standard", "mnist5k-family", "harmony-meta")


def test_step_cost_times_the_same_computation_in_either_memory_format():
    import torch

    step_cost = load_script(STEP_COST)
    images = torch.randn(8, 1, 28, 28)

    def kernels_in_channels_last(model) -> bool:
        kernels = [p for p in model.parameters() if p.dim() == 4]
        return all(p.is_contiguous(memory_format=torch.channels_last) for p in kernels)

    for family in ("cnn", "mobilenet", "resnet"):
        model = step_cost.full_depth_model(family, 0.5)
        with torch.no_grad():
            contiguous = model(images)
        assert not kernels_in_channels_last(model)
        step_cost.step_seconds(model, batch=8, steps=1, layout="channels_last")
        assert kernels_in_channels_last(model)
        with torch.no_grad():
            channels_last = model(images.contiguous(memory_format=torch.channels_last))
        # the timed steps only back-propagate (no optimizer), so the weights are the same: the outputs
        # agree to rounding
        torch.testing.assert_close(channels_last, contiguous, rtol=1e-4, atol=1e-5)


def test_step_cost_refuses_an_unknown_memory_format_before_timing(tmp_path, capsys):
    code, stderr = run_script(
        STEP_COST, capsys, "--memory-formats=contiguous,nhwc", f"--out={tmp_path / 'out'}"
    )
    assert code == 2 and "nhwc" in stderr and "channels_last" in stderr, stderr
    assert not (tmp_path / "out.md").exists()


@pytest.mark.parametrize("widths", ["1.0,wide", "1.0,0", "1.0,,0.5"])
def test_step_cost_refuses_a_malformed_width_list_before_timing(tmp_path, capsys, widths):
    code, stderr = run_script(STEP_COST, capsys, f"--widths={widths}", f"--out={tmp_path / 'out'}")
    assert code == 2 and "--widths" in stderr and "invalid" in stderr, stderr
    assert not (tmp_path / "out.md").exists()


def test_harmony_variants_summarizes_the_gradient_ratio_by_its_median_and_the_rest_by_the_mean():
    variants = load_script(REPO_ROOT / "benchmarks/harmony_variants.py")
    rounds = [
        {"path_to_noise": 0.5, "variant_spread": 0.2, "contrastive_grad_ratio": 0.2},
        {"path_to_noise": 1.5, "variant_spread": 0.4, "contrastive_grad_ratio": 0.3},
        # a round whose CE is already fit: the ratio's outlier
        {"path_to_noise": 1.0, "variant_spread": 0.6, "contrastive_grad_ratio": 9e6},
    ]
    summary = variants.round_summary({"round_metrics": rounds})
    assert summary == pytest.approx(
        {"path_to_noise": 1.0, "variant_spread": 0.4, "contrastive_grad_ratio": 0.3}
    )
    # a run without the SupCon term logs no ratio, and the summary leaves it out
    no_ratio = [{k: v for k, v in row.items() if k != "contrastive_grad_ratio"} for row in rounds]
    assert "contrastive_grad_ratio" not in variants.round_summary({"round_metrics": no_ratio})


def test_harmony_variants_names_the_seeds_it_ran():
    variants = load_script(REPO_ROOT / "benchmarks/harmony_variants.py")
    assert variants.seed_text([0, 1, 2, 3]) == "0-3"
    assert variants.seed_text([100, 103, 104]) == "100, 103, 104"
    assert variants.seed_text([5]) == "5"


def test_demo_seeds_compares_against_either_side_of_an_earlier_comparison(tmp_path, monkeypatch):
    demo_seeds = load_script(REPO_ROOT / "benchmarks/demo_seeds.py")

    def demo_run(seed: int, accuracy: float) -> Path:
        phases = {
            phase: {"accuracy_with_ood": accuracy, "server_accuracy_ood": accuracy}
            for phase in demo_seeds.PHASES
        }
        report = {
            "config": {"seed": seed},
            "results": {"entry-android": phases, "flagship": phases},
            "train": {"summary": {"accuracy_with_ood": accuracy, "accuracy_without_ood": accuracy}},
        }
        folder = tmp_path / f"run-{seed}-{accuracy}"
        folder.mkdir()
        (folder / "demo-report.json").write_text(json.dumps(report))
        return folder

    earlier = {
        "labels": ["old", "middle"],
        "before": [demo_seeds.summarize(demo_run(s, 0.5)) for s in (0, 1)],
        "after": [demo_seeds.summarize(demo_run(s, 0.6)) for s in (0, 1)],
    }
    (tmp_path / "earlier.json").write_text(json.dumps(earlier))
    now = [str(demo_run(s, 0.7)) for s in (0, 1)]
    for side, label, gap in (("before", "old", 0.2), ("after", "middle", 0.1)):
        out = tmp_path / side
        argv = ["demo_seeds.py", "--before-results", str(tmp_path / "earlier.json"), "--before-from", side]
        monkeypatch.setattr(sys, "argv", [*argv, "--after", *now, "--out", str(out)])
        demo_seeds.main()
        results = json.loads((out / "results.json").read_text())
        assert results["labels"][0] == label
        assert results["after_minus_before"]["aligned/accuracy_with_ood"]["mean"] == pytest.approx(gap)


def _record(folder: Path, method: str, seed: int, accuracy: float, cpu: float) -> None:
    run = folder / "fashion-family" / method / f"seed-{seed}"
    run.mkdir(parents=True)
    record = {
        "setting": "fashion-family",
        "method": method,
        "seed": seed,
        "train_config": {"rounds": 24},
        "validation": {"accuracy_with_ood": accuracy},
        "cpu_seconds": cpu,
        "code": {"commit": "abc1234"},
    }
    (run / "bench.json").write_text(json.dumps(record))


def test_compare_records_pairs_runs_and_says_when_the_ranking_changes(tmp_path):
    compare = load_script(REPO_ROOT / "benchmarks/compare_records.py")
    wide, narrow = tmp_path / "wide", tmp_path / "narrow"
    for seed in (1, 2):
        _record(wide, "harmony", seed, 0.70, 100.0)
        _record(wide, "fedavg", seed, 0.60, 100.0)
        _record(narrow, "harmony", seed, 0.58, 50.0)
        _record(narrow, "fedavg", seed, 0.61, 60.0)
    _record(narrow, "fedproto", 1, 0.9, 50.0)  # only one side holds it: left out
    lines, summary = compare.compare(compare.load_records(wide), compare.load_records(narrow), ("w", "n"))
    row = summary["settings"]["fashion-family"]
    assert row["ranking"] == {"w": ["harmony", "fedavg"], "n": ["fedavg", "harmony"]}
    assert not row["same_ranking"]
    assert row["cpu_ratio"] == pytest.approx({"harmony": 0.5, "fedavg": 0.6})
    assert any("| harmony | 1, 2 | 24 | 70.0 | 58.0 | -12.0 |" in line for line in lines)


def test_compare_records_refuses_a_folder_with_two_runs_of_one_key(tmp_path):
    compare = load_script(REPO_ROOT / "benchmarks/compare_records.py")
    _record(tmp_path / "trial-0", "harmony", 1, 0.7, 10.0)
    _record(tmp_path / "trial-1", "harmony", 1, 0.6, 10.0)
    with pytest.raises(SystemExit, match="a second run of"):
        compare.load_records(tmp_path)


def test_calibration_targets_refuses_a_folder_without_finished_runs(tmp_path, capsys):
    (tmp_path / "fashion-family" / "harmony" / "seed-0").mkdir(parents=True)  # no files: unfinished
    script = REPO_ROOT / "benchmarks/calibration_targets.py"
    code, err = run_script(script, capsys, "--runs-under", str(tmp_path), "--report", str(tmp_path / "r"))
    assert code == 2
    assert "no finished 'harmony' run with its files under" in err
    assert not (tmp_path / "r").exists()
