"""Install by role: pyproject.toml's extras, requirements.lock and the commands' extra checks.

The fast tests read the files and the CLI. The slow one installs each role's extra into a fresh
venv and runs that role's smallest real command; `.ci/run` runs it after the suite.
"""

from __future__ import annotations

import importlib.metadata
import importlib.util
import re
import shutil
import tomllib
from pathlib import Path

import httpx
import pytest
from packaging.requirements import Requirement
from packaging.version import Version
from typer.testing import CliRunner

from harmony_mobile import cli
from tests.helpers import role_venv

ROOT = Path(__file__).resolve().parents[1]
PROJECT = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
SELF = "harmony-mobile"
EXTRAS = tuple(PROJECT["optional-dependencies"])


def lock_pins() -> dict[str, Version]:
    pins = {}
    for line in (ROOT / "requirements.lock").read_text().splitlines():
        line = line.split("#")[0].strip()
        if line:
            name, _, version = line.partition("==")
            assert version, f"requirements.lock pins exactly: {line!r}"
            pins[role_venv.normalize(Requirement(name).name)] = Version(version)
    return pins


def extra_requirements(extra: str) -> list[Requirement]:
    """The extra's requirements, with the extras it names (harmony-mobile[...]) followed."""
    found = []
    for text in PROJECT["optional-dependencies"][extra]:
        requirement = Requirement(text)
        if requirement.name == SELF:
            for inner in sorted(requirement.extras):
                found += extra_requirements(inner)
        else:
            found.append(requirement)
    return found


def test_the_lock_pins_every_requirement_inside_its_range():
    pins = lock_pins()
    requirements = [Requirement(text) for text in PROJECT["dependencies"]]
    requirements += extra_requirements("all")
    for requirement in requirements:
        name = role_venv.normalize(requirement.name)
        assert name in pins, f"{name} is missing from requirements.lock: run `make lock`"
        assert requirement.specifier.contains(pins[name], prereleases=True), (
            f"requirements.lock has {name}=={pins[name]}, outside {requirement}: run `make lock`"
        )


def test_every_extra_is_in_all_and_nothing_is_pinned_exactly_without_a_reason():
    named = set().union(*(Requirement(text).extras for text in PROJECT["optional-dependencies"]["all"]))
    assert named == set(PROJECT["optional-dependencies"]) - {"all"}
    exact = [
        text
        for texts in [PROJECT["dependencies"], *PROJECT["optional-dependencies"].values()]
        for text in texts
        if "==" in text
    ]
    # the phone apps embed this ExecuTorch release (tests/test_ios_contract.py reads the pin)
    assert exact == ["executorch==1.5.1"]


def test_each_extra_lists_the_distributions_of_the_modules_its_commands_check():
    distributions = importlib.metadata.packages_distributions()
    for extra, modules in cli.EXTRA_MODULES.items():
        listed = {role_venv.normalize(r.name) for r in extra_requirements(extra)}
        for module in modules:
            provided_by = {role_venv.normalize(d) for d in distributions[module]}
            assert provided_by & listed, f"[{extra}] must list what provides {module}: {provided_by}"


def test_the_server_extra_holds_no_training_flower_or_exporter_stack():
    listed = {role_venv.normalize(r.name) for r in extra_requirements("server")}
    listed |= {role_venv.normalize(Requirement(text).name) for text in PROJECT["dependencies"]}
    assert not listed & set(role_venv.NOT_ON_A_SERVER)


def test_torch_is_in_the_roles_that_train_export_or_run_a_phone_runtime_only():
    names = {extra: {role_venv.normalize(r.name) for r in extra_requirements(extra)} for extra in EXTRAS}
    core = {role_venv.normalize(Requirement(text).name) for text in PROJECT["dependencies"]}
    assert "torch" not in core | names["server"]
    assert "onnxruntime" in names["server"]  # what a replica without torch serves with
    assert names["server"] | {"torch", "onnx", "onnxscript"} <= names["alignment"]
    for extra in ("alignment", "device", "export", "train", "flower", "bench"):
        assert "torch" in names[extra], extra
    assert {"onnx", "onnxscript", "onnxruntime"} <= names["export"]  # writes and checks backend.onnx
    assert "torch" not in cli.EXTRA_MODULES["server"] and "torch" in cli.EXTRA_MODULES["alignment"]


def test_a_replica_without_alignment_needs_no_torch(monkeypatch, tmp_path):
    real = importlib.util.find_spec
    monkeypatch.setattr(
        importlib.util, "find_spec", lambda name, *a: None if name == "torch" else real(name, *a)
    )
    started = []
    monkeypatch.setattr("harmony_mobile.server.launch.run", lambda settings, *args: started.append(settings))
    monkeypatch.setattr("harmony_mobile.server.launch.check_can_start", lambda *args: None)  # port 8000
    result = CliRunner().invoke(cli.app, ["serve", "--no-alignment", "--data-dir", str(tmp_path / "data")])
    assert result.exit_code == 0, result.output
    assert started and not started[0].run_alignment


@pytest.mark.parametrize(
    ("args", "hidden", "message"),
    [
        (["serve"], "fastapi", "harmony serve needs the server extra: pip install 'harmony-mobile[server]'"),
        (
            ["serve"],
            "torch",
            "harmony serve needs the alignment extra: pip install 'harmony-mobile[alignment]'",
        ),
        (
            ["serve", "--runtime", "torch", "--no-alignment"],
            "torch",
            "the torch runtime needs PyTorch, which is not installed: pip install 'harmony-mobile[alignment]'",
        ),
        (
            ["train", "run"],
            "dp_accounting",
            "harmony train needs the train extra: pip install 'harmony-mobile[train]'",
        ),
        (
            ["train", "run", "--engine", "flower"],
            "flwr",
            "harmony train needs the flower extra: pip install 'harmony-mobile[flower]'",
        ),
        (["export", "run", "run", "--out", "x"], "coremltools", "harmony export needs the export extra"),
        (["bench"], "scipy", "harmony bench needs the bench extra: pip install 'harmony-mobile[bench]'"),
        (["demo"], "executorch", "harmony demo needs the export extra: pip install 'harmony-mobile[export]'"),
    ],
)
def test_a_command_whose_extra_is_missing_names_it(monkeypatch, tmp_path, args, hidden, message):
    real = importlib.util.find_spec
    monkeypatch.setattr(
        importlib.util, "find_spec", lambda name, *a: None if name == hidden else real(name, *a)
    )
    monkeypatch.chdir(tmp_path)
    result = CliRunner().invoke(cli.app, args)
    assert result.exit_code == 2, result.output
    assert message in re.sub(r"\s+", " ", result.output)
    assert hidden in result.output
    assert not (tmp_path / "run").exists()  # stopped before doing any work


def test_a_command_without_a_role_runs_on_the_core(monkeypatch):
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None)
    result = CliRunner().invoke(cli.app, ["export", "verify", "--help"])
    assert result.exit_code == 0, result.output


def infer_once(url: str, data_dir: Path) -> tuple[int, dict]:
    """Enrol a phone of the export's one tier with the server's admin token and infer one row of
    zeros (64x8x8 interface)."""
    admin = {"Authorization": f"Bearer {(data_dir / 'admin_token').read_text().strip()}"}
    with httpx.Client(base_url=url, timeout=30) as client:
        device = client.post("/v1/devices", json={"name": "phone", "tier": "entry-android"}, headers=admin)
        if device.status_code != 201:
            return device.status_code, device.json()
        auth = {"Authorization": f"Bearer {device.json()['token']}"}
        body = {
            "inputs": [{"name": "features", "shape": [1, 64, 8, 8], "datatype": "FP32", "data": [0.0] * 4096}]
        }
        answer = client.post("/v2/models/harmony-backend/infer", json=body, headers=auth)
    return answer.status_code, answer.json()


@pytest.mark.slow
def test_each_role_installs_alone_and_runs_its_smallest_command(tmp_path_factory):
    """train one round with [train]; export it with [export]; serve it with [server] (no torch:
    ONNX Runtime) until /v2/health/ready and answer an infer; a command of another role names its
    extra."""
    work = tmp_path_factory.mktemp("roles")
    wheel = role_venv.build_wheel(work / "wheel")

    train_venv = work / "train-venv"
    role_venv.create_venv(train_venv, wheel, "train", compile_bytecode=False)
    run_dir = work / "run"
    args = ["train", str(run_dir), "--dataset", "digits", "--rounds", "1", "--clients-per-tier", "1"]
    trained = role_venv.run_harmony(train_venv, args, work)
    assert trained.returncode == 0, trained.stdout + trained.stderr
    assert (run_dir / "run.json").is_file(), sorted(p.name for p in run_dir.iterdir())
    refused = role_venv.run_harmony(train_venv, ["serve"], work)
    assert refused.returncode == 2
    assert "pip install 'harmony-mobile[server]'" in refused.stdout
    shutil.rmtree(train_venv)  # about 1 GB each: the three never sit on disk together

    export_venv = work / "export-venv"
    role_venv.create_venv(export_venv, wheel, "export", compile_bytecode=False)
    export_dir = work / "export"
    args = ["export", "run", str(run_dir), "--out", str(export_dir), "--tiers", "entry-android"]
    exported = role_venv.run_harmony(
        export_venv, [*args, "--key-dir", str(work / "keys"), "--threads", "1"], work
    )
    assert exported.returncode == 0, exported.stdout + exported.stderr
    assert (export_dir / "manifest.json").is_file()
    assert (export_dir / "backend" / "backend.pt").is_file()
    assert (export_dir / "backend" / "backend.onnx").is_file()  # what the torch-free server serves
    shutil.rmtree(export_venv)

    server_venv = work / "server-venv"
    role_venv.create_venv(server_venv, wheel, "server", compile_bytecode=False)
    on_server = role_venv.installed(server_venv)
    assert not set(on_server) & set(role_venv.NOT_ON_A_SERVER), sorted(on_server)
    pins = lock_pins()
    # pip and setuptools are the venv's own (ensurepip's), not installed from the lock
    drifted = {
        name: version
        for name, version in on_server.items()
        if name in pins and name not in ("pip", "setuptools") and Version(version) != pins[name]
    }
    assert not drifted, f"not the lock's versions: {drifted}"
    data_dir = work / "serve-data"
    served = role_venv.serve_until_ready(
        server_venv / "bin" / "harmony",
        export_dir,
        data_dir,
        work,
        probe=lambda url: infer_once(url, data_dir),
    )
    assert "Traceback" not in served.output, served.output
    status, answer = served.probed  # answered by ONNX Runtime: the venv has no torch
    assert status == 200, answer
    assert {o["name"] for o in answer["outputs"]} == {"slot_scores", "top_slot", "confidence"}
    refused = role_venv.run_harmony(server_venv, ["serve", "--model-dir", str(export_dir)], work)
    assert refused.returncode == 2  # alignment rounds are on by default and need torch
    assert "pip install 'harmony-mobile[alignment]'" in refused.stdout
    refused = role_venv.run_harmony(server_venv, ["train", str(work / "other-run")], work)
    assert refused.returncode == 2
    assert "pip install 'harmony-mobile[train]'" in refused.stdout
