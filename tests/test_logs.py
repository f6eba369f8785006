"""Quiet by default: third-party log lines and warnings reach the log file, not the terminal."""

import io
import logging
import os
import subprocess
import sys
import threading
import warnings

import pytest
from rich.console import Console

from harmony_mobile.logs import configure_logging, native_stderr_to_log_file

NATIVE_LINE = "[cpuinfo_utils.cpp:71] Reading file /sys/devices/soc0/image_version"


@pytest.fixture(autouse=True)
def our_handlers_removed_afterwards():
    """configure_logging changes the process's root logger: later tests in this worker must not
    find a quiet log file installed by one of these."""
    yield
    root = logging.getLogger()
    for handler in [h for h in root.handlers if getattr(h, "harmony_mobile", False)]:
        root.removeHandler(handler)
        handler.close()


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


def _native_print(line: str) -> None:
    os.write(2, (line + "\n").encode())  # what C++ does: straight to fd 2, past sys.stderr


def test_native_stderr_goes_to_the_log_file_and_the_terminal_comes_back(tmp_path, capfd):
    log_file = configure_logging(log_file=tmp_path / "h.log", console=Console(file=io.StringIO()))
    with native_stderr_to_log_file():
        _native_print(NATIVE_LINE)
    _native_print("after the native call")
    terminal = capfd.readouterr().err
    assert NATIVE_LINE not in terminal and "after the native call" in terminal
    assert NATIVE_LINE in log_file.read_text()


def test_verbose_leaves_native_stderr_on_the_terminal(tmp_path, capfd):
    log_file = configure_logging(
        verbose=True, log_file=tmp_path / "h.log", console=Console(file=io.StringIO())
    )
    with native_stderr_to_log_file():
        _native_print(NATIVE_LINE)
    assert NATIVE_LINE in capfd.readouterr().err
    assert NATIVE_LINE not in log_file.read_text()


def test_without_configure_logging_native_stderr_is_left_alone(capfd):
    with native_stderr_to_log_file():
        _native_print(NATIVE_LINE)
    assert NATIVE_LINE in capfd.readouterr().err


def test_overlapping_calls_from_two_threads_give_the_terminal_back(tmp_path, capfd):
    """Thread a enters, b enters, a leaves while b is still inside, then b leaves: b's native line
    still goes to the file, and afterwards fd 2 is the terminal again."""
    log_file = configure_logging(log_file=tmp_path / "h.log", console=Console(file=io.StringIO()))
    a_inside, b_inside, a_left = threading.Event(), threading.Event(), threading.Event()

    def a() -> None:
        with native_stderr_to_log_file():
            a_inside.set()
            b_inside.wait(10)
        a_left.set()

    def b() -> None:
        a_inside.wait(10)
        with native_stderr_to_log_file():
            b_inside.set()
            a_left.wait(10)
            _native_print("b, after a left")

    threads = [threading.Thread(target=a), threading.Thread(target=b)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(20)
    _native_print("after both")
    terminal = capfd.readouterr().err
    assert "b, after a left" not in terminal and "after both" in terminal
    assert "b, after a left" in log_file.read_text()


# A fresh interpreter, quiet, then verbose. The runtime prints its cpuinfo lines when its threadpool
# is created: by the first `set_threads` (harmony export, bench latency) or by the first program
# loaded (a phone, harmony verify); resizing the pool prints a threadpool line. The quiet part does
# both in the order given; then, verbose, the pool is resized again.
EXECUTORCH_RUNTIME_LINES = """
import sys
from pathlib import Path
import torch
from harmony_mobile.logs import configure_logging
log_file, first, pte_file = Path(sys.argv[1]), sys.argv[2], Path(sys.argv[3])
configure_logging(log_file=log_file)
torch.set_num_threads(1)
from harmony_mobile.device import FrontEndProgram
from harmony_mobile.export import steps
if first == "set_threads":
    steps.set_threads(3)
pte = pte_file.read_bytes()
FrontEndProgram(pte).run(torch.zeros(1, 1, 28, 28))
steps.load_method(pte)
steps.set_threads(3)
print("--- verbose from here", file=sys.stderr, flush=True)
configure_logging(verbose=True, log_file=log_file)
steps.set_threads(1)
"""


@pytest.fixture(scope="module")
def tiny_pte(tmp_path_factory):
    """A small front-end's .pte, lowered here once: the runtime that prints is only loaded in the
    child interpreters."""
    import torch
    from harmony_mobile.export import steps

    from harmony_mobile.models import FamilyModel, InterfaceSpec

    torch.manual_seed(0)
    front_end = FamilyModel("cnn", 1, 28, 10, 1.0, InterfaceSpec()).front_end(1)
    module = steps.wrap_front_end(front_end, (1, 28, 28), 10)
    path = tmp_path_factory.mktemp("pte") / "front_end.pte"
    path.write_bytes(steps.lower_to_xnnpack(steps.export_program(module, (1, 28, 28), 1)).buffer)
    return path


@pytest.mark.parametrize("first", ["set_threads", "load_program"])
def test_executorch_runtime_lines_reach_the_terminal_only_when_verbose(tmp_path, first, tiny_pte):
    log_file = tmp_path / "h.log"
    result = subprocess.run(
        [sys.executable, "-c", EXECUTORCH_RUNTIME_LINES, str(log_file), first, str(tiny_pte)],
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert result.returncode == 0, result.stderr
    quiet, verbose = result.stderr.split("--- verbose from here\n")
    logged = log_file.read_text()
    if "Resetting threadpool to 1 threads" not in verbose + logged:
        pytest.skip("this ExecuTorch build prints no threadpool line")
    assert quiet == "" and result.stdout == ""
    assert "threadpool.cpp" in verbose and "Resetting threadpool to 1 threads" in verbose
    assert "Resetting threadpool to 3 threads" in logged
    assert "Resetting threadpool to 1 threads" not in logged
