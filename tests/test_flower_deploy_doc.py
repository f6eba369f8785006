"""docs/FLOWER.md's deployment, step by step, run as written: each `deploy-step` block in a fresh
bash after the `setup` block, with only the ports and the work folder chosen here (the variables
the document reads from the environment). A SuperLink and two SuperNodes as processes, a run that
completes (wrapper exit 0), a run for other code refused (exit 1), a run stopped with `flwr stop`
(exit 1, finished:stopped), then the document's shutdown."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from harmony_mobile.flower.deployment import free_port
from harmony_mobile.run_dir import SECRET_FILE, RunDir

REPO = Path(__file__).resolve().parents[1]
STEP = re.compile(r"<!-- deploy-step: (\w+) -->\n```bash\n(.*?)```", re.S)


def doc_steps() -> dict[str, str]:
    return dict(STEP.findall((REPO / "docs" / "FLOWER.md").read_text()))


@pytest.fixture
def shell(tmp_path):
    """Runs `setup` + a step of the document in bash (repository root, this interpreter's
    environment first on PATH); everything it starts shares one session, ended at teardown."""
    env = dict(os.environ)
    env["PATH"] = f"{Path(sys.executable).parent}{os.pathsep}{env.get('PATH', '')}"
    env.update(WORK=str(tmp_path), LINK_PORT=str(free_port()))
    env.update(NODE_PORT_0=str(free_port()), NODE_PORT_1=str(free_port()))
    steps, sessions = doc_steps(), []

    def start(step: str, extra: str = "") -> subprocess.Popen:
        script = "set -euo pipefail\n" + steps["setup"] + steps[step] + extra
        process = subprocess.Popen(
            ["bash", "-c", script],
            cwd=REPO,
            env=env,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
            start_new_session=True,
        )
        sessions.append(process.pid)
        return process

    def run(step: str, timeout: float = 300) -> subprocess.CompletedProcess:
        process = start(step)
        output, _ = process.communicate(timeout=timeout)
        return subprocess.CompletedProcess(step, process.returncode, output)

    run.start, run.env = start, env
    yield run
    for session in sessions:  # the document's shutdown ran already, unless a step failed
        try:
            os.killpg(session, signal.SIGTERM)
        except ProcessLookupError:
            pass


def status_of_runs(shell) -> list[str]:
    listing = subprocess.run(
        ["flwr", "ls", "local-deploy", "--format", "json"],
        env=shell.env,
        capture_output=True,
        text=True,
        timeout=60,
    )
    return [run["status"] for run in json.loads(listing.stdout).get("runs", [])]


def test_the_documented_deployment_runs_as_written(shell, tmp_path):
    assert set(doc_steps()) == {"setup", "start", "run", "refused", "stop", "shutdown"}
    started = shell("start")
    assert started.returncode == 0, started.stdout

    completed = shell("run")
    assert completed.returncode == 0, completed.stdout[-3000:]
    assert "finished:completed" in completed.stdout
    run = RunDir(tmp_path / "run")
    assert run.final_metrics()["summary"]["accuracy_without_ood"] > 0
    assert len(run.clients()) == 2 and (tmp_path / "run" / SECRET_FILE).is_file()

    refused = shell("refused")
    assert refused.returncode == 0 and "refused, exit 1" in refused.stdout, refused.stdout[-3000:]
    assert "finished:failed" in refused.stdout and "code-version" in refused.stdout

    # a long run to stop: the document's run config with more rounds and another run dir
    long_config = (tmp_path / "run.toml").read_text().replace("rounds = 1", "rounds = 500")
    long_config = long_config.replace(f'run-dir = "{tmp_path / "run"}"', f'run-dir = "{tmp_path / "long"}"')
    (tmp_path / "long.toml").write_text(long_config)
    wrapper = shell.start(
        "setup",
        'python -m harmony_mobile.flower.deployment run flower_app local-deploy --run-config "$WORK/long.toml"\n',
    )
    deadline = time.monotonic() + 120
    while "running" not in status_of_runs(shell) and time.monotonic() < deadline:
        time.sleep(2)  # each look is a `flwr ls` process: about 1 CPU-second
    stop = shell("stop")
    assert stop.returncode == 0, stop.stdout[-3000:]
    output, _ = wrapper.communicate(timeout=120)
    assert wrapper.returncode == 1 and "finished:stopped" in output, output[-3000:]

    assert shell("shutdown").returncode == 0
