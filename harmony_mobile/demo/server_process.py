"""`harmony serve` in a subprocess on a free loopback port, and SIGTERM handling so that every
exit path of the demo stops it."""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import httpx

from harmony_mobile.demo.config import DemoError


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


class ServerProcess:
    """`harmony serve` in a subprocess on a free loopback port; `stop()` is idempotent."""

    def __init__(self, data_dir: Path, model_dir: Path, log_file: Path, admin_token: str):
        self.data_dir, self.model_dir, self.log_file = data_dir, model_dir, log_file
        self.admin_token = admin_token
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.process: subprocess.Popen | None = None
        self._log = None

    def start(self, timeout: float = 120.0) -> None:
        command = [
            sys.executable, "-m", "harmony_mobile.cli", "serve",
            "--host", "127.0.0.1", "--port", str(self.port),
            "--data-dir", str(self.data_dir), "--model-dir", str(self.model_dir),
            "--torch-threads", "1", "--log-level", "warning",
        ]  # fmt: skip
        env = {
            **os.environ,
            "HARMONY_ADMIN_TOKEN": self.admin_token,
            "OMP_NUM_THREADS": "1",
            # a simulated phone replays days of traffic in seconds: hundreds of fallbacks a second would
            # hit the per-device abuse limit (50/s) and turn into local answers, skewing the accuracies
            "HARMONY_RATE_LIMIT_PER_SECOND": "10000",
            "HARMONY_RATE_LIMIT_BURST": "10000",
        }
        self._log = open(self.log_file, "ab")
        # own process group: a Ctrl-C in the terminal reaches the demo, which then stops the server itself
        self.process = subprocess.Popen(
            command, env=env, stdout=self._log, stderr=subprocess.STDOUT, start_new_session=True
        )
        deadline = time.monotonic() + timeout
        while True:
            if self.process.poll() is not None:
                raise DemoError(
                    f"the server exited with status {self.process.returncode}; see {self.log_file}"
                )
            with contextlib.suppress(httpx.TransportError):
                if httpx.get(f"{self.url}/v2/health/ready", timeout=2).status_code == 200:
                    return
            if time.monotonic() > deadline:
                raise DemoError(f"the server did not become ready in {timeout:.0f} s; see {self.log_file}")
            time.sleep(0.2)

    def stop(self, timeout: float = 20.0) -> int | None:
        process, self.process = self.process, None
        if process is not None and process.poll() is None:
            process.send_signal(signal.SIGTERM)
            try:
                process.wait(timeout=timeout)
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait()
        if self._log is not None:
            self._log.close()
            self._log = None
        return None if process is None else process.returncode

    def admin(self, method: str, path: str, **kwargs) -> httpx.Response:
        headers = {"Authorization": f"Bearer {self.admin_token}"}
        return httpx.request(method, f"{self.url}{path}", headers=headers, timeout=30, **kwargs)


@contextlib.contextmanager
def terminate_on_sigterm():
    """SIGTERM behaves like Ctrl-C (KeyboardInterrupt), so the finally blocks stop the server."""

    def handler(signum, frame):
        raise KeyboardInterrupt(f"signal {signum}")

    previous = signal.signal(signal.SIGTERM, handler)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, previous)
