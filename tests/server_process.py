"""A real `harmony serve` process (uvicorn) on a free loopback port, for tests that need real
sockets: standard clients, slow clients, replicas."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import httpx

from tests.helpers.fallback_server import ADMIN_TOKEN


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


@contextmanager
def serve(
    data_dir: Path, model_dir: Path | None, *flags: str, env: dict[str, str] | None = None, ready: bool = True
) -> Iterator[str]:
    """Yields the base URL once /v2/health/live answers (and /ready, if `ready`); SIGTERM on exit.
    The output is checked for tracebacks: an exception that reached uvicorn is a bug."""
    port = free_port()
    command = [
        sys.executable, "-m", "harmony_mobile.cli", "serve", "--host", "127.0.0.1", "--port", str(port),
        "--data-dir", str(data_dir), "--torch-threads", "1", "--log-level", "warning", *flags,
    ]  # fmt: skip
    if model_dir is not None:
        command += ["--model-dir", str(model_dir)]
    environment = {**os.environ, "HARMONY_ADMIN_TOKEN": ADMIN_TOKEN, **(env or {})}
    process = subprocess.Popen(
        command, env=environment, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True
    )
    base = f"http://127.0.0.1:{port}"
    try:
        _wait_until_up(process, base, "/v2/health/ready" if ready else "/v2/health/live")
        yield base
    finally:
        process.send_signal(signal.SIGTERM)
        try:
            process.wait(timeout=30)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()
    output = process.stdout.read()
    assert "Traceback" not in output and "Exception in ASGI application" not in output, output


def _wait_until_up(process: subprocess.Popen, base: str, path: str) -> None:
    deadline = time.monotonic() + 90
    with httpx.Client(base_url=base, timeout=5) as client:
        while True:
            assert process.poll() is None, process.stdout.read()
            try:
                if client.get(path).status_code == 200:
                    return
            except httpx.TransportError:
                pass
            assert time.monotonic() < deadline, f"server did not answer {path} in 90 s"
            time.sleep(0.2)
