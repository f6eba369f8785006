"""Fresh virtual environments holding one role's install (`harmony-mobile[<extra>]`), for the
install test (tests/test_install_roles.py) and the footprint report (benchmarks/install_footprint.py).

The package goes in as a built wheel, with requirements.lock as pip constraints, so a role's venv
has the lock's versions of whatever that extra pulls. pip's cache and this machine's local wheels
(the CPU torch) are reused as `pip` finds them. Commands in these venvs run from a directory
outside the source tree: run from the repository root, `import harmony_mobile` would find the
source folder first, which has no harmony_mobile.server or .export (package-dir maps them in only
when installed).
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from tests.helpers.ports import free_port
from tests.helpers.processes import stop, wait_until_ready

ROOT = Path(__file__).resolve().parents[2]
LOCK = ROOT / "requirements.lock"
# what the wheel is built from: pyproject.toml's package-dir and README (the project's readme)
SOURCES = ("pyproject.toml", "README.md", "harmony_mobile", "export", "server")
# distributions a server-only install must not hold: torch (a `--no-alignment` replica serves the
# back-end through ONNX Runtime), training, Flower and exporter stacks
NOT_ON_A_SERVER = ("torch", "ray", "flwr", "coremltools", "executorch", "torchao", "dp-accounting", "mlxtend")


def build_wheel(out: Path) -> Path:
    """The package's wheel, built from a copy of the sources (a build in place leaves build/ and
    an egg-info in the working tree)."""
    source = out / "source"
    source.mkdir(parents=True)
    for name in SOURCES:
        path = ROOT / name
        if path.is_dir():
            shutil.copytree(path, source / name, ignore=shutil.ignore_patterns("__pycache__"))
        else:
            shutil.copy2(path, source / name)
    command = [sys.executable, "-m", "pip", "wheel", "--quiet", "--no-deps", "--no-build-isolation"]
    subprocess.run([*command, "--wheel-dir", str(out), str(source)], check=True, cwd=out)
    (wheel,) = out.glob("harmony_mobile-*.whl")
    return wheel


def create_venv(venv: Path, wheel: Path, extra: str | None, compile_bytecode: bool = True) -> float:
    """A new venv at `venv` with the wheel and `extra` installed under the lock's constraints;
    returns the seconds pip took."""
    subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True)
    target = f"{wheel}[{extra}]" if extra else str(wheel)
    command = [str(venv / "bin" / "pip"), "install", "--quiet", "--disable-pip-version-check"]
    if not compile_bytecode:
        command.append("--no-compile")
    started = time.perf_counter()
    subprocess.run([*command, "--constraint", str(LOCK), target], check=True, cwd=venv.parent)
    return time.perf_counter() - started


def installed(venv: Path) -> dict[str, str]:
    """Normalized distribution name -> version, as the venv's pip sees them."""
    listing = subprocess.run(
        [str(venv / "bin" / "pip"), "list", "--format", "freeze", "--disable-pip-version-check"],
        check=True,
        capture_output=True,
        text=True,
        cwd=venv.parent,
    ).stdout
    pins = (line.split("==") for line in listing.splitlines() if "==" in line)
    return {normalize(name): version for name, version in pins}


def normalize(name: str) -> str:
    return name.lower().replace("_", "-").replace(".", "-")


def tree_bytes(path: Path) -> int:
    """Bytes of the files under `path` (what `du --apparent-size` counts; links not followed)."""
    total = 0
    for folder, _, files in os.walk(path):
        for name in files:
            file = Path(folder) / name
            if not file.is_symlink():
                total += file.stat().st_size
    return total


def rss_bytes(pid: int) -> tuple[int, int]:
    """(resident, peak resident) bytes of one process, from /proc."""
    fields = {}
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        key, _, value = line.partition(":")
        fields[key] = value.strip()
    return int(fields["VmRSS"].split()[0]) * 1024, int(fields["VmHWM"].split()[0]) * 1024


@dataclass
class ServeResult:
    seconds_to_ready: float  # process start to the first 200 from /v2/health/ready
    rss: int  # resident bytes right after ready
    peak_rss: int
    output: str  # the process's stdout and stderr
    probed: Any = None  # what `probe` returned


def serve_until_ready(
    harmony: Path,
    model_dir: Path,
    data_dir: Path,
    workdir: Path,
    timeout: float = 300.0,
    probe: Callable[[str], Any] | None = None,
) -> ServeResult:
    """Start `harmony serve --no-alignment` (one process) on a free port, wait for
    /v2/health/ready, read its memory, call `probe(base_url)` if given, stop it with SIGTERM."""
    port = free_port()
    command = [
        str(harmony), "serve", "--host", "127.0.0.1", "--port", str(port), "--data-dir", str(data_dir),
        "--model-dir", str(model_dir), "--no-alignment", "--torch-threads", "1", "--onnx-threads", "1",
        "--log-level", "warning",
    ]  # fmt: skip
    env = {**os.environ, "HARMONY_LOG_FILE": str(workdir / "harmony.log"), "OMP_NUM_THREADS": "1"}
    env.pop("PYTHONPATH", None)
    log = workdir / f"serve-{port}.out"
    started = time.perf_counter()
    with log.open("w") as sink:
        process = subprocess.Popen(command, cwd=workdir, env=env, stdout=sink, stderr=subprocess.STDOUT)
    try:
        wait_until_ready(process, f"http://127.0.0.1:{port}/v2/health/ready", timeout, log)
        ready = time.perf_counter() - started
        rss, peak = rss_bytes(process.pid)
        probed = probe(f"http://127.0.0.1:{port}") if probe is not None else None
    finally:
        stop(process)
    return ServeResult(ready, rss, peak, log.read_text(), probed)


def run_harmony(venv: Path, args: list[str], workdir: Path, timeout: float = 1800.0):
    """`harmony ARGS` from the venv, run in `workdir` (outside the source tree)."""
    env = {**os.environ, "HARMONY_LOG_FILE": str(workdir / "harmony.log"), "OMP_NUM_THREADS": "1"}
    env.pop("PYTHONPATH", None)
    return subprocess.run(
        [str(venv / "bin" / "harmony"), *args],
        cwd=workdir,
        env=env,
        capture_output=True,
        text=True,
        timeout=timeout,
    )
