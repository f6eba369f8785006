"""A server process a test (or a benchmark) started: wait until it answers, then stop it."""

from __future__ import annotations

import http.client
import signal
import subprocess
import time
import urllib.request
from pathlib import Path

POLL_SECONDS = 0.2


def _output(process: subprocess.Popen, log: Path | None) -> str:
    """What the process wrote: its log file, else its stdout (or stderr) pipe, read only once it
    has exited, since reading a live process's pipe blocks."""
    if log is not None:
        return log.read_text()
    pipe = process.stdout if process.stdout is not None else process.stderr
    written = pipe.read() if pipe is not None else ""
    return written.decode(errors="replace") if isinstance(written, bytes) else written


def wait_until_ready(process: subprocess.Popen, url: str, timeout: float, log: Path | None = None) -> None:
    """Poll `url` until it answers 200. Fails (AssertionError, with what the process wrote) when the
    process exits first or `timeout` seconds pass."""
    deadline = time.monotonic() + timeout
    while True:
        if process.poll() is not None:
            raise AssertionError(f"the server exited with {process.returncode}:\n{_output(process, log)}")
        try:
            with urllib.request.urlopen(url, timeout=5) as response:
                if response.status == 200:
                    return
        except (OSError, http.client.HTTPException):
            pass  # not listening yet, or not ready (urllib raises on 503 too)
        if time.monotonic() > deadline:
            written = _output(process, log) if log is not None else ""
            raise AssertionError(f"{url} did not answer 200 within {timeout:.0f} s\n{written}")
        time.sleep(POLL_SECONDS)


def stop(process: subprocess.Popen, how: signal.Signals = signal.SIGTERM, timeout: float = 30.0) -> bool:
    """Ask the process to stop with `how`; kill it if it has not within `timeout` seconds. Returns
    whether it stopped in time."""
    process.send_signal(how)
    try:
        process.wait(timeout=timeout)
    except subprocess.TimeoutExpired:
        process.kill()
        process.wait()
        return False
    return True
