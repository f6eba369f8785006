"""Quiet by default: the terminal shows our progress and results; third-party log lines and Python
warnings (coremltools' version notices, torchao's CUDA-only libraries, torch's pytree notices) go
to a log file, and so does what native code prints straight to the process's stderr around the
calls wrapped in `native_stderr_to_log_file` (the ExecuTorch runtime's cpuinfo and threadpool
lines). `harmony -v` shows them on the terminal too.
"""

from __future__ import annotations

import importlib.util
import logging
import os
import sys
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import IO

from rich.console import Console
from rich.logging import RichHandler

OUR_LOGGER = "harmony_mobile"
LOG_FILE_ENV = "HARMONY_LOG_FILE"
DEFAULT_LOG_FILE = Path("~/.local/state/harmony-mobile/harmony.log")
FILE_FORMAT = "%(asctime)s %(levelname)s %(name)s: %(message)s"
# Libraries that install their own stderr handlers at import time instead of propagating.
SELF_HANDLING_LOGGERS = ("torch",)


class _OursOnly(logging.Filter):
    def filter(self, record: logging.LogRecord) -> bool:
        return record.name == OUR_LOGGER or record.name.startswith(OUR_LOGGER + ".")


def log_file_path(log_file: Path | None = None) -> Path:
    """The log file: the argument, else $HARMONY_LOG_FILE, else ~/.local/state/harmony-mobile/harmony.log."""
    return Path(log_file or os.environ.get(LOG_FILE_ENV) or DEFAULT_LOG_FILE).expanduser()


def configure_logging(
    verbose: bool = False, log_file: Path | None = None, console: Console | None = None
) -> Path:
    """Route every logger and `warnings.warn` to the log file; the terminal gets warnings of our own
    loggers (all loggers with `verbose`). Returns the log file's path."""
    path = log_file_path(log_file)
    path.parent.mkdir(parents=True, exist_ok=True)
    to_file = logging.FileHandler(path, encoding="utf-8")
    to_file.setFormatter(logging.Formatter(FILE_FORMAT))
    to_file.verbose = verbose  # read by native_stderr_to_log_file
    to_terminal = RichHandler(console=console or Console(stderr=True), show_path=False, show_time=False)
    to_terminal.setLevel(logging.INFO if verbose else logging.WARNING)
    if not verbose:
        to_terminal.addFilter(_OursOnly())
    root = logging.getLogger()
    for handler in [h for h in root.handlers if getattr(h, "harmony_mobile", False)]:
        root.removeHandler(handler)  # configured twice in one process (tests): replace, don't stack
        handler.close()
    for handler in (to_file, to_terminal):
        handler.harmony_mobile = True
        root.addHandler(handler)
    root.setLevel(logging.INFO)
    logging.captureWarnings(False)  # re-install over whatever replaced warnings.showwarning since
    logging.captureWarnings(True)
    _adopt_self_handling_loggers()
    return path


def _adopt_self_handling_loggers() -> None:
    """torch attaches a stderr handler to its logger on import: import it now, then let its records
    propagate to our handlers instead. A serving replica installed without torch has none to adopt."""
    if importlib.util.find_spec("torch") is None:
        return
    import torch  # noqa: F401  (installs torch's handlers, which are removed below)

    for name in SELF_HANDLING_LOGGERS:
        _propagate_only(logging.getLogger(name))


def adopt_loggers(*names: str) -> None:
    """For libraries imported only on some paths (Flower, Ray): once imported, their loggers'
    own terminal handlers go and their records reach the log file (and the terminal with `-v`),
    as everything else's. Does nothing unless configure_logging installed our handlers: a program
    that embeds harmony_mobile keeps its own logging setup."""
    if not any(getattr(h, "harmony_mobile", False) for h in logging.getLogger().handlers):
        return
    for name in names:
        _propagate_only(logging.getLogger(name))


def _propagate_only(logger: logging.Logger) -> None:
    for handler in list(logger.handlers):
        if isinstance(handler, logging.StreamHandler) and not isinstance(handler, logging.FileHandler):
            logger.removeHandler(handler)
    logger.propagate = True


class _Fd2Redirect:
    """fd 2 pointed at a file while at least one caller (of any thread) is inside; the terminal's fd
    restored when the last one leaves. Counted, because two threads that each saved and restored fd 2
    on their own could leave it pointing at the file."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._callers = 0
        self._terminal_fd: int | None = None

    def enter(self, sink: IO[str]) -> None:
        with self._lock:
            if self._callers == 0:
                sys.stderr.flush()  # what Python wrote before the call still goes to the terminal
                sink.flush()  # the log file's own lines stay in order with the native ones
                self._terminal_fd = os.dup(2)
                os.dup2(sink.fileno(), 2)
            self._callers += 1

    def leave(self) -> None:
        with self._lock:
            self._callers -= 1
            if self._callers == 0 and self._terminal_fd is not None:
                sys.stderr.flush()
                os.dup2(self._terminal_fd, 2)
                os.close(self._terminal_fd)
                self._terminal_fd = None


_fd2_redirect = _Fd2Redirect()


@contextmanager
def native_stderr_to_log_file() -> Iterator[None]:
    """Around a call into native code that prints to the process's stderr (file descriptor 2)
    itself, where no Python logging setting reaches (the ExecuTorch runtime prints cpuinfo and
    threadpool lines when it first runs XNNPACK and when its threadpool is resized): fd 2 goes to
    the log file for the duration of the call. Nothing changes with `-v`, or when configure_logging
    did not run (a program that embeds harmony_mobile keeps its stderr). Only fd 2 moves: rich
    progress bars draw on stdout; a Python line another thread writes to stderr during the call
    lands in the log file."""
    log_file = _quiet_log_file()
    if log_file is None:
        yield
        return
    _fd2_redirect.enter(log_file)
    try:
        yield
    finally:
        _fd2_redirect.leave()


def _quiet_log_file() -> IO[str] | None:
    """The open log file configure_logging installed, unless it was asked to be verbose (or the
    handler was closed since)."""
    for handler in logging.getLogger().handlers:
        if getattr(handler, "harmony_mobile", False) and isinstance(handler, logging.FileHandler):
            return None if getattr(handler, "verbose", True) else handler.stream
    return None
