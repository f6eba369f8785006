"""A Flower deployment on this machine: one SuperLink and one SuperNode per client as separate
processes on loopback, and `flwr run` of flower_app/ against them.

This is the deployment path at its smallest (tests, the README's walk-through): insecure gRPC on
127.0.0.1 and free ports picked here. A multi-machine deployment swaps `--insecure` for TLS
certificates and enables SuperNode authentication (README: Training on Flower).
"""

from __future__ import annotations

import argparse
import ctypes
import json
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

import tomli_w

from harmony_mobile.flower.settings import FlowerSettings, app_config_defaults, code_version

APP_DIR = Path(__file__).resolve().parents[2] / "flower_app"
CONNECTION = "harmony-local"


class DeploymentError(RuntimeError):
    """A Flower process did not start or a run did not finish."""


STARTED = re.compile(r"Successfully started run (\d+)")
COMPLETED = "finished:completed"


@dataclass
class FlowerRun:
    """How a `flwr run` ended: its exit code, its output and the SuperLink's status of the run.
    `flwr run --stream` exits 0 even when the ServerApp failed or the run was stopped; the
    status (`flwr ls`) tells: finished:completed, finished:failed or finished:stopped."""

    returncode: int
    output: str
    run_id: int | None
    status: str

    @property
    def completed(self) -> bool:
        return self.returncode == 0 and self.status == COMPLETED

    def describe(self) -> str:
        return f"run {self.run_id} ended {self.status or 'without a status'} (flwr exit {self.returncode})"


def run_status(connection: str, run_id: int, env: dict | None = None, cwd: Path | None = None) -> str:
    """The SuperLink's status of a run (`flwr ls --run-id ... --format json`), "" if unknown."""
    listing = subprocess.run(
        [flower_bin("flwr"), "ls", connection, "--run-id", str(run_id), "--format", "json"],
        env=env,
        cwd=cwd,
        capture_output=True,
        text=True,
        timeout=120,
    )
    try:
        runs = json.loads(listing.stdout).get("runs", [])
    except json.JSONDecodeError:
        return ""
    return str(runs[0].get("status", "")) if runs else ""


def run_and_check(
    flwr_run_args: list[str],
    env: dict | None = None,
    cwd: Path | None = None,
    timeout: float | None = None,
    echo: bool = False,
) -> FlowerRun:
    """`flwr run <args> --stream`, then the run's status from the SuperLink (args[1] is the
    connection). With `echo` the output is also printed as it comes."""
    args = [flower_bin("flwr"), "run", *flwr_run_args, "--stream"]
    process = subprocess.Popen(
        args, env=env, cwd=cwd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True
    )
    lines = []
    timer = threading.Timer(timeout, process.kill) if timeout is not None else None
    if timer is not None:
        timer.start()
    for line in process.stdout:
        lines.append(line)
        if echo:
            print(line, end="", flush=True)
    if timer is not None:
        timer.cancel()
    returncode = process.wait()
    output = "".join(lines)
    started = STARTED.search(output)
    run_id = int(started.group(1)) if started else None
    status = run_status(flwr_run_args[1], run_id, env, cwd) if run_id is not None else ""
    return FlowerRun(returncode, output, run_id, status)


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


def _stop_with_parent() -> None:
    """In the child before it runs: SIGTERM when the process that started it dies, so a killed test
    run or CLI leaves no SuperLink or SuperNode behind (Linux; elsewhere stop() alone ends them)."""
    if sys.platform == "linux":
        ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGTERM)  # 1 = PR_SET_PDEATHSIG


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
            preexec_fn=_stop_with_parent,
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

    def run(self, settings: FlowerSettings, timeout: float = 600.0) -> FlowerRun:
        """`flwr run flower_app/ <connection> --stream` with the settings as run config; waits for
        the run to end (the ServerApp writes the run dir) and raises unless it completed."""
        overrides = self.work_dir / "run_config.toml"
        overrides.write_text(tomli_w.dumps(settings.to_run_config()))
        args = [str(APP_DIR), CONNECTION, "--run-config", str(overrides)]
        result = run_and_check(args, env=self.environment(), cwd=self.work_dir, timeout=timeout)
        if not result.completed or not (Path(settings.run_dir) / "final_metrics.json").is_file():
            raise DeploymentError(
                f"flwr run: {result.describe()}; logs in {self.work_dir}\n{result.output[-3000:]}"
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


def app_config_toml() -> str:
    """flower_app/pyproject.toml's [tool.flwr.app.config] table (settings.app_config_defaults)."""
    return tomli_w.dumps({"tool": {"flwr": {"app": {"config": app_config_defaults()}}}})


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m harmony_mobile.flower.deployment")
    commands = parser.add_subparsers(dest="command", required=True)
    commands.add_parser(
        "code-version", help="print this installation's code version (run config code-version)"
    )
    commands.add_parser("app-config", help="print flower_app/pyproject.toml's [tool.flwr.app.config] table")
    run = commands.add_parser(
        "run", help="flwr run ... --stream, exiting 1 unless the SuperLink reports the run finished:completed"
    )
    run.add_argument("flwr_run_args", nargs=argparse.REMAINDER, help="APP CONNECTION [flwr run options]")
    args = parser.parse_args(argv)
    if args.command == "code-version":
        print(code_version())
        return 0
    if args.command == "app-config":
        print(app_config_toml(), end="")
        return 0
    if len(args.flwr_run_args) < 2:
        parser.error("run needs APP and CONNECTION (then any flwr run options)")
    result = run_and_check(args.flwr_run_args, echo=True)
    print(f"harmony: {result.describe()}", file=sys.stderr)
    return 0 if result.completed else 1


if __name__ == "__main__":
    sys.exit(main())
