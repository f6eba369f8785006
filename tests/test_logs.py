"""Quiet by default: third-party log lines and warnings reach the log file, not the terminal."""

import io
import logging
import subprocess
import sys
import warnings

from rich.console import Console

from harmony_mobile.logs import configure_logging


def _emit_everything() -> None:
    logging.getLogger("coremltools").warning("Torch version has not been tested with coremltools")
    logging.getLogger("torch.utils._pytree").warning("Enum subclass is now natively supported")
    warnings.warn("a third-party UserWarning", UserWarning, stacklevel=1)
    logging.getLogger("harmony_mobile.export").warning("our own warning")


def test_terminal_gets_only_our_warnings_and_the_file_gets_everything(tmp_path):
    terminal = io.StringIO()
    log_file = configure_logging(log_file=tmp_path / "h.log", console=Console(file=terminal, width=200))
    _emit_everything()
    logging.shutdown()
    shown, logged = terminal.getvalue(), log_file.read_text()
    assert "our own warning" in shown
    assert "coremltools" not in shown and "Enum subclass" not in shown and "UserWarning" not in shown
    for line in ("not been tested with coremltools", "natively supported", "UserWarning", "our own warning"):
        assert line in logged


def test_verbose_shows_third_party_lines_too(tmp_path):
    terminal = io.StringIO()
    configure_logging(verbose=True, log_file=tmp_path / "h.log", console=Console(file=terminal, width=200))
    _emit_everything()
    assert "not been tested with coremltools" in terminal.getvalue()


def test_importing_the_export_stack_prints_nothing(tmp_path):
    """The real libraries, in a fresh interpreter: coremltools/torchao/torch notices go to the file."""
    code = (
        "from pathlib import Path; from harmony_mobile.logs import configure_logging;"
        f"configure_logging(log_file=Path({str(tmp_path / 'h.log')!r}));"
        "import harmony_mobile.export.pipeline, coremltools, torchao"
    )
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stderr
    assert result.stderr == "" and result.stdout == ""
    assert "coremltools" in (tmp_path / "h.log").read_text()


def test_flowers_deprecation_notice_goes_to_the_log_file(tmp_path):
    """Flower logs through its own terminal handler; the Flower engine adopts its logger."""
    code = (
        "from pathlib import Path; from harmony_mobile.logs import configure_logging;"
        f"configure_logging(log_file=Path({str(tmp_path / 'h.log')!r}));"
        "from harmony_mobile.flower.run import quiet_simulation_entry; quiet_simulation_entry();"
        "from flwr.common.logger import warn_deprecated_feature;"
        "warn_deprecated_feature('The `run_simulation` function')"
    )
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stderr
    assert result.stderr == "" and result.stdout == ""
    assert "The `run_simulation` function" in (tmp_path / "h.log").read_text()
