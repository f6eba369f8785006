"""`harmony serve` settings: a flag wins, else its HARMONY_* environment variable, else the default;
with several workers the flags given reach the worker processes through the environment."""

from __future__ import annotations

import os

import harmony_mobile.server.launch as launch
import pytest
from harmony_mobile.server.core.settings import Settings
from typer.testing import CliRunner

from harmony_mobile.cli import app


@pytest.fixture
def captured(monkeypatch):
    calls = []
    monkeypatch.setattr(launch, "run", lambda settings, explicit, *rest: calls.append((settings, rest)))
    # what the settings resolve to, not whether port 8000 or ./serve-data is free on this machine
    monkeypatch.setattr(launch, "check_can_start", lambda *args: None)
    for name in ("HARMONY_MAX_BATCH", "HARMONY_MAX_WAIT_MS", "HARMONY_DATA_DIR", "HARMONY_RUN_ALIGNMENT"):
        monkeypatch.delenv(name, raising=False)
    return calls


def test_environment_settings_are_respected(captured, monkeypatch, tmp_path):
    monkeypatch.setenv("HARMONY_MAX_BATCH", "7")
    monkeypatch.setenv("HARMONY_MAX_WAIT_MS", "0.5")
    monkeypatch.setenv("HARMONY_DATA_DIR", str(tmp_path / "from-env"))
    monkeypatch.setenv("HARMONY_RUN_ALIGNMENT", "false")
    result = CliRunner().invoke(app, ["serve", "--workers", "3"])
    assert result.exit_code == 0, result.output
    [(settings, (host, port, workers, log_level))] = captured
    assert settings.max_batch == 7 and settings.max_wait_ms == 0.5 and settings.run_alignment is False
    assert settings.data_dir == tmp_path / "from-env" and workers == 3


def test_a_flag_wins_over_the_environment(captured, monkeypatch, tmp_path):
    monkeypatch.setenv("HARMONY_MAX_BATCH", "7")
    result = CliRunner().invoke(app, ["serve", "--max-batch", "3", "--data-dir", str(tmp_path)])
    assert result.exit_code == 0, result.output
    settings = captured[0][0]
    assert settings.max_batch == 3 and settings.max_wait_ms == Settings.model_fields["max_wait_ms"].default


def test_defaults_without_flags_or_environment(captured, monkeypatch):
    result = CliRunner().invoke(app, ["serve"])
    assert result.exit_code == 0, result.output
    settings = captured[0][0]
    assert str(settings.data_dir) == launch.DEFAULT_DATA_DIR and settings.max_batch == 32


def test_invalid_environment_value_is_a_clear_error(captured, monkeypatch, tmp_path):
    monkeypatch.setenv("HARMONY_MAX_BATCH", "zero")
    result = CliRunner().invoke(app, ["serve", "--data-dir", str(tmp_path)])
    assert result.exit_code == 2 and "max_batch" in result.output and not captured


def test_workers_get_the_flags_through_the_environment(monkeypatch, tmp_path):
    for name in ("HARMONY_MAX_BATCH", "HARMONY_DATA_DIR", "HARMONY_ADMIN_TOKEN"):
        monkeypatch.setenv(name, "recorded")  # so monkeypatch restores it after the export below
        monkeypatch.delenv(name)
    explicit = {"data_dir": tmp_path, "max_batch": 5, "admin_token": "secret-token", "max_wait_ms": None}
    settings = launch.resolve_settings(explicit)
    launch.export_to_environment(settings, explicit)
    in_worker = Settings()
    assert in_worker.max_batch == 5 and in_worker.data_dir == tmp_path
    assert in_worker.admin_token.get_secret_value() == "secret-token"


def test_workers_answer_health_pings_before_importing_the_server(monkeypatch, tmp_path):
    """uvicorn unpickles its config in each worker before the worker answers the supervisor's health
    pings, and kills a worker that misses one: the config names the protocol by import path (the
    class would import torch first) and the pings wait longer than a busy machine's worker start."""
    from harmony_mobile.server.core.http_guards import GuardedHttpToolsProtocol
    from uvicorn.importer import import_from_string

    monkeypatch.setenv("HARMONY_DATA_DIR", str(tmp_path))  # restored after the export in `run`
    monkeypatch.setenv("PROMETHEUS_MULTIPROC_DIR", "recorded")  # `run` points it at its metrics folder
    calls = []
    monkeypatch.setattr(launch.uvicorn, "run", lambda app, **options: calls.append((app, options)))
    launch.run(Settings(data_dir=tmp_path), {}, "127.0.0.1", 8000, 2, "warning")
    [(app, options)] = calls
    assert isinstance(app, str) and isinstance(options["http"], str)
    assert import_from_string(options["http"]) is GuardedHttpToolsProtocol
    assert options["timeout_worker_healthcheck"] >= 30
    metrics_dir = tmp_path / "prometheus-multiproc" / str(os.getpid())
    assert os.environ["PROMETHEUS_MULTIPROC_DIR"] == str(metrics_dir) and metrics_dir.is_dir()


def _real_export(directory):
    """An export dir whose backend/backend.pt is a real (untrained) back-end file."""
    from harmony_mobile.models import Backend, InterfaceSpec, ProjectionHead
    from harmony_mobile.protocol.slots import SlotTable
    from harmony_mobile.run_dir import save_backend

    (directory / "backend").mkdir(parents=True)
    table = SlotTable("e-test", 10, [bytes([i]) * 8 for i in range(10)])
    backend = Backend(InterfaceSpec(), 10)
    save_backend(
        directory / "backend" / "backend.pt", backend, ProjectionHead(128), "v", tuple("0123456789"), table
    )
    return directory


def _serve_error(tmp_path, model_dir):
    result = CliRunner().invoke(
        app, ["serve", "--data-dir", str(tmp_path / "data"), "--model-dir", str(model_dir)]
    )
    assert result.exit_code == 2, result.output
    assert result.exception is None or isinstance(result.exception, SystemExit)
    [line] = result.output.strip().splitlines()  # one line, no traceback
    return line


def test_a_placeholder_backend_is_a_one_line_error(captured, tmp_path):
    from tests.export_fixtures import fake_export_dir

    export = fake_export_dir(tmp_path / "export", tmp_path / "keys")
    line = _serve_error(tmp_path, export)
    assert "backend.pt" in line and "not a back-end file" in line and "torch.load failed" in line
    assert not captured


def test_garbage_truncated_or_foreign_backends_are_one_line_errors(captured, tmp_path):
    import torch

    good = (_real_export(tmp_path / "good") / "backend" / "backend.pt").read_bytes()
    cases = {
        "garbage": b"\x00\xff" * 300,
        "truncated": good[: len(good) // 2],
        "empty": b"",
        "foreign": None,  # a loadable torch file that is not a back-end
    }
    for name, content in cases.items():
        backend = _real_export(tmp_path / name) / "backend" / "backend.pt"
        if content is None:
            torch.save({"weights": torch.zeros(2)}, backend)
        else:
            backend.write_bytes(content)
        line = _serve_error(tmp_path, tmp_path / name)
        assert str(backend) in line.replace("\n", ""), (name, line)
        assert "not a back-end file" in line, (name, line)
    assert not captured


def test_other_bad_model_dirs_are_one_line_errors(captured, tmp_path):
    assert "is not a directory" in _serve_error(tmp_path, tmp_path / "missing")
    export = _real_export(tmp_path / "export")
    (export / "manifest.json").write_bytes(b'{"tiers": "\xff"}')
    assert "manifest.json is not UTF-8" in _serve_error(tmp_path, export)
    assert not captured


def test_a_loadable_export_is_served(captured, tmp_path):
    export = _real_export(tmp_path / "export")
    result = CliRunner().invoke(
        app, ["serve", "--data-dir", str(tmp_path / "data"), "--model-dir", str(export)]
    )
    assert result.exit_code == 0, result.output
    assert captured[0][0].model_dir == export
