"""The `harmony` command's own behaviour: help, info, and clear errors for bad training flags."""

import json
import os
import subprocess
import sys
from pathlib import Path

from typer.testing import CliRunner

from harmony_mobile.cli import app, reflowed
from harmony_mobile.run_dir import RunDir, write_federation_secret

runner = CliRunner()


def test_help_lists_every_sub_command():
    result = runner.invoke(app, ["--help"])
    assert result.exit_code == 0
    for command in ("train", "bench", "export", "serve", "demo", "info"):
        assert command in result.output


def test_help_breaks_a_command_description_only_where_the_terminal_ends():
    """A docstring's own line breaks inside a paragraph would survive into the help and break
    sentences in the middle of an 80-column terminal."""
    result = runner.invoke(app, ["bench", "--help"], terminal_width=80)
    assert result.exit_code == 0, result.output
    lines = [line.strip() for line in result.output.splitlines()]
    paragraph = lines.index(next(line for line in lines if line.startswith("`--resume` reads")))
    short = [line for line in lines[paragraph : paragraph + 4] if len(line) < 60]
    assert len(short) <= 1, lines[paragraph : paragraph + 5]  # only a paragraph's last line is short
    assert reflowed("Run it.\n\nOne\nparagraph.\n\n  harmony x\n  harmony y") == (
        "Run it.\n\nOne paragraph.\n\n  harmony x\n  harmony y"
    )


def test_info_prints_versions_tiers_and_datasets():
    result = runner.invoke(app, ["info"])
    assert result.exit_code == 0, result.output
    for text in ("executorch", "1.5.1", "flagship", "mnist5k"):
        assert text in result.output


def test_train_rejects_bad_flags_with_the_reason(tmp_path):
    result = runner.invoke(app, ["train", str(tmp_path / "run"), "--algorithm", "nope"])
    assert result.exit_code == 2
    assert "unknown algorithm 'nope'" in result.output

    result = runner.invoke(app, ["train", str(tmp_path / "run2"), "--partition", "zigzag"])
    assert result.exit_code == 2
    assert "partition" in result.output

    result = runner.invoke(
        app, ["train", str(tmp_path / "run3"), "--dataset", "cifar10", "--data-root", str(tmp_path)]
    )
    assert result.exit_code == 2
    assert "cifar-10-batches-py" in result.output

    result = runner.invoke(app, ["train", str(tmp_path / "run4"), "--config", str(tmp_path / "missing.yaml")])
    assert result.exit_code == 2
    assert "config file not found" in result.output

    bad_config = tmp_path / "bad.yaml"
    bad_config.write_text("rounds: 3\nlearning_rate: 1\n")
    result = runner.invoke(app, ["train", str(tmp_path / "run5"), "--config", str(bad_config)])
    assert result.exit_code == 2
    assert "learning_rate" in result.output


def test_demo_and_export_pass_only_the_flags_given(monkeypatch, tmp_path):
    """A flag left out keeps the default of the object it configures (written there only)."""
    import harmony_mobile.export.pipeline as pipeline

    import harmony_mobile.demo as demo_package
    from harmony_mobile.demo import DemoConfig

    demos, exports = [], []
    monkeypatch.setattr(demo_package, "run_demo", lambda config, console: demos.append(config))
    monkeypatch.setattr(pipeline, "export_run", lambda *args, **kwargs: exports.append(kwargs) or _raise())
    assert runner.invoke(app, ["demo"]).exit_code == 0
    assert runner.invoke(app, ["demo", "--seed", "4", "--rounds", "2", "--out", str(tmp_path)]).exit_code == 0
    assert demos[0] == DemoConfig()
    assert (demos[1].seed, demos[1].rounds, demos[1].out, demos[1].dataset) == (
        4,
        2,
        tmp_path,
        DemoConfig().dataset,
    )

    runner.invoke(app, ["export", str(tmp_path), "--out", str(tmp_path / "x")])
    runner.invoke(app, ["export", str(tmp_path), "--out", str(tmp_path / "y"), "--threads", "2"])
    assert "threads" not in exports[0] and "max_batch" not in exports[0]
    assert exports[1]["threads"] == 2 and "max_batch" not in exports[1]


def _raise():
    raise ValueError("stopped after the call was recorded")


def test_bench_rejects_malformed_comma_lists_before_any_run(tmp_path):
    work = ["--work-dir", str(tmp_path / "work"), "--out", str(tmp_path / "out")]
    result = runner.invoke(app, ["bench", "--seeds", "0,one", *work])
    assert result.exit_code == 2
    assert "--seeds '0,one': expected comma-separated integers" in result.output

    result = runner.invoke(app, ["bench", "--methods", "harmony,,fedavg", *work])
    assert result.exit_code == 2
    assert "--methods 'harmony,,fedavg': an empty name" in result.output

    result = runner.invoke(app, ["bench", "--extend", "--seeds", "0", *work])
    assert result.exit_code == 2 and "name them with --settings" in result.output

    result = runner.invoke(app, ["bench", "--reuse-runs-from", str(tmp_path / "r.json"), *work])
    assert result.exit_code == 2 and "--reuse-runs-from needs --resume" in result.output
    assert not (tmp_path / "work").exists()


def test_bench_script_is_the_bench_command():
    script = Path(__file__).parents[1] / "benchmarks" / "bench.py"
    wide = {**os.environ, "COLUMNS": "200"}  # rich would cut long flag names at 80 columns
    result = subprocess.run(
        [sys.executable, str(script), "--help"], capture_output=True, text=True, timeout=120, env=wide
    )
    assert result.returncode == 0, result.stderr
    for flag in ("--settings", "--jobs", "--resume", "--report-only", "--extend", "--reuse-runs-from"):
        assert flag in result.stdout


def test_two_runs_share_a_lineage_on_purpose_and_then_give_the_same_numbers(tmp_path):
    """A run's federation secret and label epoch are random; --lineage-from copies another run's,
    so the same configuration trains to the same numbers (without it, two runs differ)."""
    config = tmp_path / "small.yaml"
    config.write_text("dataset_limit: 600\nalgorithm_config: {local_steps: 2, personalize_epochs: 1}\n")
    small = ["--dataset", "digits", "--rounds", "1", "--clients-per-tier", "1", "--seed", "3"]
    small += ["--config", str(config)]
    runs = {}
    for name, extra in (
        ("first", []),
        ("shared", ["--lineage-from", str(tmp_path / "first")]),
        ("fresh", []),
    ):
        result = runner.invoke(app, ["train", str(tmp_path / name), *small, *extra])
        assert result.exit_code == 0, result.output
        runs[name] = json.loads((tmp_path / name / "final_metrics.json").read_text())
    assert json.dumps(runs["shared"]["mean"]) == json.dumps(runs["first"]["mean"])
    assert json.dumps(runs["fresh"]["mean"]) != json.dumps(runs["first"]["mean"])
    first, shared = RunDir(tmp_path / "first"), RunDir(tmp_path / "shared")
    assert shared.federation_secret() == first.federation_secret()
    assert shared.info.label_epoch == first.info.label_epoch


def test_lineage_from_refuses_a_folder_that_is_no_run_and_a_used_run_dir(tmp_path):
    result = runner.invoke(app, ["train", str(tmp_path / "a"), "--lineage-from", str(tmp_path)])
    assert result.exit_code == 2 and "not a run dir" in result.output
    (tmp_path / "used").mkdir()
    (tmp_path / "used" / "notes.txt").write_text("x")
    source = tmp_path / "source"
    write_federation_secret(source, b"s" * 32)
    (source / "run.json").write_text(json.dumps({"label_epoch": "e-1"}))
    result = runner.invoke(app, ["train", str(tmp_path / "used"), "--lineage-from", str(source)])
    assert result.exit_code == 2 and "needs a new run directory" in result.output


def test_a_long_progress_line_stays_one_line_in_a_log_file(capsys):
    """`harmony bench ... > log` prints one line per finished run, however long, so a log can be grepped."""
    from harmony_mobile.cli import console

    line = "[12/64] budget fashion-family harmony 48 rounds seed=101: " + "acc p=0 0.799, " * 12
    console.print(line)
    assert capsys.readouterr().out == line + "\n"
