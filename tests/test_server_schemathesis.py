"""Schemathesis against server/openapi.json and a real server process: every check (`-c all`),
positive and negative data, a bounded number of examples, once with an enrolled device's token and
once with the admin token. Passing means no 5xx on any input and no status, header or body the
document does not describe.

One documented allowance: some bodies satisfy the JSON Schema and are still refused, for reasons a
schema cannot state: an infer body's `shape` must be [N, 64, 8, 8] and `data` must hold prod(shape)
numbers (422), an upload's envelope must be a sealed envelope that authenticates (400), and an
enrolment's tier must be one the server serves (422: its tiers come from the manifest it was
started with). For those routes positive_data_acceptance also expects 400/422."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import httpx
import pytest

from tests.helpers.fallback_server import ADMIN, ADMIN_TOKEN, make_model_dir
from tests.server_process import serve

SPEC = Path(__file__).resolve().parents[1] / "server" / "openapi.json"
MAX_EXAMPLES = 4
CONFIG = """
[[operations]]
include-path-regex = "(/infer|/v1/uploads|/v1/devices)$"
checks.positive_data_acceptance.expected-statuses = [200, 201, 400, 401, 403, 404, 409, 422, 429, 503]
"""
# the rate limit is not under test here: the fuzzer must reach the endpoints
ENV = {"HARMONY_RATE_LIMIT_PER_SECOND": "100000", "HARMONY_RATE_LIMIT_BURST": "100000"}


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    root = tmp_path_factory.mktemp("schemathesis")
    model_dir = make_model_dir(root)
    manifest = {"model_version": "v1", "tiers": [{"name": "mid-android", "family": "mobilenet"}]}
    (model_dir / "manifest.json").write_text(json.dumps(manifest))
    (model_dir / "manifest.sig").write_text("c2lnbmF0dXJl")
    (root / "schemathesis.toml").write_text(CONFIG)
    with serve(root / "data", model_dir, env=ENV) as base_url:
        yield base_url, root


def run_schemathesis(base_url: str, root: Path, token: str) -> subprocess.CompletedProcess:
    command = [
        sys.executable, "-m", "schemathesis.cli", "--config-file", str(root / "schemathesis.toml"),
        "run", str(SPEC), "--url", base_url, "--checks", "all", "--mode", "all",
        "--max-examples", str(MAX_EXAMPLES), "--seed", "16", "--continue-on-failure",
        "--header", f"Authorization: Bearer {token}", "--workers", "1",
    ]  # fmt: skip
    return subprocess.run(command, capture_output=True, text=True, timeout=300, cwd=root)


@pytest.mark.parametrize("role", ["device", "admin"])
def test_schemathesis_finds_nothing(server, role):
    base_url, root = server
    if role == "admin":
        token = ADMIN_TOKEN
    else:
        token = httpx.post(f"{base_url}/v1/devices", json={"tier": "mid-android"}, headers=ADMIN).json()[
            "token"
        ]
    result = run_schemathesis(base_url, root, token)
    report = result.stdout + result.stderr
    assert result.returncode == 0, report
    assert "No issues found" in report or " passed" in report, report
