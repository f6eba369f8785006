"""Quiet by default: the terminal shows our progress and results; third-party log lines and Python
warnings (coremltools' version notices, torchao's CUDA-only libraries, torch's pytree notices) go
to a log file. `harmony -v` shows them on the terminal too.
"""

from __future__ import annotations

import logging
import os
from pathlib import Path

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
    propagate to our handlers instead."""
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
