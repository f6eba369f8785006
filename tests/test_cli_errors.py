"""Every bad input to a `harmony` command ends it with one line naming the problem and exit code 2,
before any work starts: no traceback, and nothing secret (a token, a database password) printed."""

from __future__ import annotations

import json

import pytest
from typer.testing import CliRunner

import harmony_mobile.cli as cli
from harmony_mobile.cli import app, export_app
from tests.export_fixtures import make_run_dir

runner = CliRunner()
BROKEN_YAML = "rounds: [1\n"


def refused(args: list[str]) -> str:
    """The command's output, after checking it was refused in one line with exit code 2."""
    result = runner.invoke(app, args)
    output = " ".join(result.output.split())
    assert result.exit_code == 2, result.output
    assert result.exception is None or isinstance(result.exception, SystemExit), result.exception
    assert output.startswith("error:"), result.output
    # one line even in a pipe or log file: never wrapped at 80 columns, never boxed
    assert len(result.output.strip().splitlines()) == 1, result.output
    return output


def test_a_usage_error_is_one_line_naming_the_help_to_read():
    """What click finds (an unknown option, a value out of range, a missing argument) reads like the
    commands' own refusals, not a box of panels."""
    output = refused(["bench", "--jobs", "0"])
    assert output.startswith("error: Invalid value for '--jobs': 0 is not in the range x>=1. (see '")
    assert output.endswith(" bench --help')")  # the runner's program name, `harmony` when installed
    assert "No such option '--nope'" in refused(["train", "--nope"])
    assert "Missing argument 'DIRECTORY'" in refused(["export", "verify"])
    assert refused(["export", "verify"]).endswith(" export verify --help')")
    assert refused(["no-such-command"]).startswith("error: No such command 'no-such-command'.")


def test_a_traceback_never_shows_local_variables():
    """An unexpected error still prints a traceback, but not the locals (tokens, secrets) of its frames."""
    assert app.pretty_exceptions_show_locals is False
    assert export_app.pretty_exceptions_show_locals is False


def test_settings_files_that_are_not_yaml_or_missing(tmp_path):
    broken = tmp_path / "broken.yaml"
    broken.write_text(BROKEN_YAML)
    for args, what in (
        (["train", str(tmp_path / "run"), "--config", str(broken)], "config file"),
        (["train", str(tmp_path / "run"), "--tiers", str(broken)], "tiers file"),
        (["info", "--tiers", str(broken)], "tiers file"),
        (["bench", "--profile", str(broken), "--work-dir", str(tmp_path / "w")], "benchmark profile"),
    ):
        output = refused(args)
        assert f"{what} {broken} is not valid YAML" in output and "(line 2, column 1)" in output
    assert "tiers file not found" in refused(["info", "--tiers", str(tmp_path / "absent.yaml")])
    listed = tmp_path / "list.yaml"
    listed.write_text("- 1\n")
    assert "must hold a mapping" in refused(["bench", "--profile", str(listed), "--work-dir", str(tmp_path)])


def test_a_bad_training_setting_is_named_in_one_line(tmp_path):
    output = refused(["train", str(tmp_path / "run"), "--rounds", "-1"])
    assert (
        output == "error: invalid training configuration: rounds: Input should be greater than or equal to 1"
    )
    output = refused(["train", str(tmp_path / "run"), "--dataset", "cifar10"])
    assert "pass data_root (--data-root of harmony train, bench or info)" in output


def test_serve_refuses_bad_settings_before_it_starts(tmp_path, monkeypatch):
    started = []
    monkeypatch.setattr("harmony_mobile.server.launch.run", lambda *args: started.append(args))
    a_file = tmp_path / "a-file"
    a_file.write_text("")
    data = ["--data-dir", str(tmp_path / "data")]
    assert f"data_dir: {a_file} exists and is not a directory" in refused(
        ["serve", "--data-dir", str(a_file)]
    )
    output = refused(["serve", *data, "--database-url", "mysql://operator:hunter2@db/harmony"])
    assert (
        "database_url: unsupported database 'mysql': use sqlite:// or postgresql://" in output
        and "hunter2" not in output
    )
    assert "one of critical, error" in refused(["serve", *data, "--log-level", "loud"])
    assert "0<=x<=65535" in refused(["serve", *data, "--port", "70000"])
    run = tmp_path / "run"
    run.mkdir()
    (run / "run.json").write_text(json.dumps({}))
    output = refused(["serve", *data, "--model-dir", str(run)])
    assert f"{run} is a training run, not an export" in output
    assert started == []


def test_serve_names_the_port_it_binds():
    settings = cli._serve_settings({"data_dir": None})
    with cli.console.capture() as fixed:
        cli._announce(settings, "127.0.0.1", 8123, 1)
    with cli.console.capture() as free:
        cli._announce(settings, "127.0.0.1", 0, 1)
    assert "http://127.0.0.1:8123" in fixed.get()
    assert "a free port of 127.0.0.1" in free.get() and ":0 " not in free.get()


def test_demo_refuses_bad_settings_before_its_first_step(monkeypatch):
    import harmony_mobile.demo as demo_package

    ran = []
    monkeypatch.setattr(demo_package, "run_demo", lambda config, console: ran.append(config))
    assert "unknown dataset 'nosuch': one of mnist5k" in refused(["demo", "--dataset", "nosuch"])
    assert "-1 is not in the range x>=1" in refused(["demo", "--rounds", "-1"])
    assert "-1 is not in the range x>=0" in refused(["demo", "--drift-steps", "-1"])
    assert "unknown algorithm 'nope'" in refused(["demo", "--algorithm", "nope"])
    assert "fall back to a server: a split method" in refused(["demo", "--algorithm", "fedavg"])
    assert ran == []


@pytest.fixture
def run_dir(tmp_path):
    return make_run_dir(tmp_path / "run")


def test_provision_errors_name_the_fix_and_never_the_token(run_dir, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    output = refused(["provision", "--out", "-"])
    assert "demo-output/run holds no training run's federation secret" in output and "--run" in output
    output = refused(["provision", "--run", str(run_dir), "--out", "-", "--tier", "mid-ios"])
    assert "pass it too" in output
    token = tmp_path / "admin_token"
    token.write_text("admin-token-that-must-not-print")
    output = refused(["provision", "--run", str(run_dir), "--out", "-", "--admin-token-file", str(token)])
    assert "--admin-token-file enrols a device: pass --server-url and --tier too" in output
    enrol = ["--admin-token-file", str(token), "--tier", "mid-ios", "--server-url", "http://127.0.0.1:9"]
    output = refused(["provision", "--run", str(run_dir), "--out", "-", *enrol])
    assert "cannot reach http://127.0.0.1:9" in output and "admin-token-that-must-not-print" not in output


def test_export_input_errors_exit_2_before_any_work(run_dir, tmp_path):
    assert "no run.json" in refused(["export", str(tmp_path / "absent"), "--out", str(tmp_path / "e")])
    assert "unknown tier 'nosuch'" in refused(
        ["export", str(run_dir), "--out", str(tmp_path / "e"), "--tiers", "nosuch"]
    )
    a_file = tmp_path / "a-file"
    a_file.write_text("")
    assert "exists and is not a directory" in refused(["export", str(run_dir), "--out", str(a_file)])
    assert not (tmp_path / "e").exists()
    assert "is not a directory" in refused(["export", "verify", str(tmp_path / "absent")])


def test_serve_help_names_the_extras_it_needs():
    """The help text keeps its bracketed extra names (rich would take them for style tags)."""
    output = " ".join(runner.invoke(app, ["serve", "--help"]).output.split())
    assert "need the [alignment] extra (torch)" in output and "runs on [server] alone" in output


def test_flower_refuses_more_replies_than_a_round_can_get(tmp_path):
    """Known before any SuperNode starts: it used to wait for the nodes, then stop."""
    args = ["train", str(tmp_path / "run"), "--engine", "flower", "--clients-per-tier", "1"]
    output = refused([*args, "--min-replies", "5"])
    assert "min_replies=5, but a round samples 4 of the run's 4 clients" in output
    output = refused([*args, "--clients-per-round", "1", "--min-replies", "2"])
    assert "min_replies=2, but a round samples 1 of the run's 4 clients" in output
    assert not (tmp_path / "run").exists()
    assert "--min-replies is for --engine flower" in refused(
        ["train", str(tmp_path / "run"), "--min-replies", "2"]
    )
