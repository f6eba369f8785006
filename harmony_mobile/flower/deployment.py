"""A Flower deployment on this machine: one SuperLink and one SuperNode per client as separate
processes on loopback, and `flwr run` of flower_app/ against them.

This is the deployment path at its smallest (tests, the README's walk-through): insecure gRPC on
127.0.0.1 and free ports picked here. A multi-machine deployment swaps `--insecure` for TLS
certificates and enables SuperNode authentication (README: Training on Flower).
"""

from __future__ import annotations

import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

import tomli_w

from harmony_mobile.flower.settings import FlowerSettings

APP_DIR = Path(__file__).resolve().parents[2] / "flower_app"
CONNECTION = "harmony-local"


class DeploymentError(RuntimeError):
    """A Flower process did not start or a run did not finish."""


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def flower_bin(name: str) -> str:
    """A Flower executable of this interpreter's environment (the SuperLink runs the app in it)."""
    candidate = Path(sys.executable).parent / name
    if candidate.is_file():
        return str(candidate)
    found = shutil.which(name)
    if found is None:
        raise DeploymentError(f"{name} not found beside {sys.executable} or on PATH")
    return found


@dataclass
class LocalDeployment:
    """Start with `with LocalDeployment(num_clients) as d: d.run(settings)`; everything it starts
    is stopped on exit, by process id."""

    num_clients: int
    work_dir: Path = field(default_factory=lambda: Path(tempfile.mkdtemp(prefix="harmony-flower-")))
    secret_file: Path | None = None  # federation secret every SuperNode reads (node config)
    processes: list[subprocess.Popen] = field(default_factory=list)
    supernodes: dict[int, subprocess.Popen] = field(default_factory=dict)  # partition -> latest
    port: int = 0

    def environment(self) -> dict[str, str]:
        env = dict(os.environ)
        env["FLWR_HOME"] = str(self.work_dir / "flwr_home")  # not the user's ~/.flwr
        env["PATH"] = f"{Path(sys.executable).parent}{os.pathsep}{env.get('PATH', '')}"
        env["PYTHONUNBUFFERED"] = "1"
        return env

    def _spawn(self, name: str, args: list[str]) -> subprocess.Popen:
        with open(self.work_dir / f"{name}.log", "wb") as log:  # the child keeps its own handle
            return self._popen(args, log)

    def _popen(self, args: list[str], log) -> subprocess.Popen:
        process = subprocess.Popen(
            args,
            stdout=log,
            stderr=subprocess.STDOUT,
            env=self.environment(),
            cwd=self.work_dir,
            start_new_session=True,  # its own process group: stop() also ends the apps it spawns
        )
        self.processes.append(process)
        return process

    def start(self) -> None:
        self.work_dir.mkdir(parents=True, exist_ok=True)
        self.port = free_port()
        superlink = [
            flower_bin("flower-superlink"),
            "--insecure",
            "--host",
            "127.0.0.1",
            "--port",
            str(self.port),
        ]
        superlink += [
            "--disable-runtime-dependency-installation",
            "--database",
            str(self.work_dir / "state.db"),
        ]
        self._spawn("superlink", superlink)
        self._wait_for_port(self.port, "flower-superlink")
        for partition in range(self.num_clients):
            self.start_supernode(partition)
        home = self.work_dir / "flwr_home"
        home.mkdir(parents=True, exist_ok=True)
        connection = {"address": f"127.0.0.1:{self.port}", "insecure": True}
        (home / "config.toml").write_text(
            tomli_w.dumps({"superlink": {"default": CONNECTION, CONNECTION: connection}})
        )

    def start_supernode(self, partition: int) -> subprocess.Popen:
        node_config = f"partition-id={partition} num-partitions={self.num_clients}"
        if self.secret_file is not None:
            node_config += f' federation-secret-file="{self.secret_file}"'
        args = [flower_bin("flower-supernode"), "--insecure", "--superlink", f"127.0.0.1:{self.port}"]
        args += ["--host", "127.0.0.1", "--port", str(free_port()), "--node-config", node_config]
        self.supernodes[partition] = self._spawn(f"supernode-{partition}", args)
        return self.supernodes[partition]

    def supernode_log(self, partition: int) -> Path:
        return self.work_dir / f"supernode-{partition}.log"

    def _wait_for_port(self, port: int, name: str, timeout: float = 60.0) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            with socket.socket() as probe:
                if probe.connect_ex(("127.0.0.1", port)) == 0:
                    return
            if any(p.poll() is not None for p in self.processes):
                break
            time.sleep(0.2)
        raise DeploymentError(f"{name} did not listen on 127.0.0.1:{port}: see {self.work_dir}")

    def run(self, settings: FlowerSettings, timeout: float = 600.0) -> subprocess.CompletedProcess:
        """`flwr run flower_app/ <connection> --stream` with the settings as run config; waits for
        the run to end (the ServerApp writes the run dir)."""
        overrides = self.work_dir / "run_config.toml"
        overrides.write_text(tomli_w.dumps(settings.to_run_config()))
        args = [
            flower_bin("flwr"),
            "run",
            str(APP_DIR),
            CONNECTION,
            "--run-config",
            str(overrides),
            "--stream",
        ]
        result = subprocess.run(
            args, env=self.environment(), cwd=self.work_dir, capture_output=True, text=True, timeout=timeout
        )
        if result.returncode != 0 or not (Path(settings.run_dir) / "final_metrics.json").is_file():
            raise DeploymentError(
                f"flwr run failed (exit {result.returncode}); logs in {self.work_dir}\n{result.stdout[-3000:]}"
                f"\n{result.stderr[-3000:]}"
            )
        return result

    def kill(self, process: subprocess.Popen, sig: int = signal.SIGTERM) -> None:
        """Signal the process group this deployment started for `process`."""
        try:
            os.killpg(process.pid, sig)
        except ProcessLookupError:
            pass

    def stop(self) -> None:
        for process in reversed(self.processes):
            self.kill(process)
        for process in self.processes:
            try:
                process.wait(timeout=15)
            except subprocess.TimeoutExpired:
                self.kill(process, signal.SIGKILL)
                process.wait()

    def __enter__(self) -> LocalDeployment:
        self.start()
        return self

    def __exit__(self, *exc) -> None:
        self.stop()
