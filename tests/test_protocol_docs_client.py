"""A client written from docs/PROTOCOL.md alone (tests/protocol_docs_client.py) against a live
`harmony serve` on a real export: provisioning, enrolment, both manifest signatures, the tier's .pte,
the exit rule, HMFT and binary-extension inference, slot naming, a sealed gzip upload and its retry.
"""

from __future__ import annotations

import ast
import json
from pathlib import Path

import numpy as np
import pytest
import torch
from harmony_mobile.export.keys import load_or_create_p256_signing_key, load_or_create_signing_key
from harmony_mobile.export.pipeline import export_run

from harmony_mobile.protocol.label_tokens import epoch_key, exit_order, slot_classes
from harmony_mobile.run_dir import RunInfo, write_run_info
from tests import protocol_docs_client
from tests.export_fixtures import FIXTURE_SECRET, make_run_dir
from tests.helpers.fallback_server import ADMIN_TOKEN
from tests.server_process import serve

torch.set_num_threads(1)
TIER = "tiny"
CLIENT = Path(protocol_docs_client.__file__)


# the protections the run trained with: the manifest's `run` carries them, the client applies them
PRIVACY = {"label_dp_epsilon": 2.0, "features": {"feature_clip": 4.0, "noise_multiplier": 0.5}}


@pytest.fixture(scope="module")
def export_dir(tmp_path_factory) -> Path:
    """The fp32 `tiny` tier of a random-initialized run dir that used every upload protection,
    signed with both keys."""
    root = tmp_path_factory.mktemp("docs-client")
    run = make_run_dir(root / "run")
    info = RunInfo.model_validate_json((run / "run.json").read_text())
    write_run_info(run, info.model_copy(update={"privacy": PRIVACY}))
    key, _ = load_or_create_signing_key(root / "keys")
    p256_key, _ = load_or_create_p256_signing_key(root / "keys")
    export_run(
        run,
        root / "export",
        tiers=[TIER],
        private_key=key,
        p256_private_key=p256_key,
        latency_runs=2,
        test_samples=8,
        progress=False,
    )
    return root / "export"


def test_the_client_imports_no_project_code():
    tree = ast.parse(CLIENT.read_text(encoding="utf-8"))
    modules = {alias.name for node in ast.walk(tree) if isinstance(node, ast.Import) for alias in node.names}
    modules |= {node.module for node in ast.walk(tree) if isinstance(node, ast.ImportFrom) and node.module}
    roots = {module.split(".")[0] for module in modules}
    allowed = {"__future__", "base64", "dataclasses", "gzip", "hashlib", "hmac", "json", "math", "os"}
    allowed |= {
        "pathlib",
        "secrets",
        "struct",
        "uuid",
        "httpx",
        "numpy",
        "cryptography",
        "executorch",
        "torch",
    }
    assert roots <= allowed, roots - allowed


def test_a_client_from_the_document_alone_runs_the_ten_steps(export_dir, tmp_path):
    manifest = json.loads((export_dir / "manifest.json").read_text(encoding="utf-8"))
    assert manifest["run"]["label_dp_epsilon"] == 2.0 and manifest["run"]["feature_clip"] == 4.0
    pixels = np.random.default_rng(0).integers(0, 256, (3, 1, 28, 28)).astype(np.uint8)
    with serve(tmp_path / "data", export_dir) as base:
        seen = protocol_docs_client.run_ten_steps(base, ADMIN_TOKEN, export_dir, FIXTURE_SECRET, TIER, pixels)
    names, key = manifest["class_names"], epoch_key(FIXTURE_SECRET, manifest["label_epoch"])
    assert [names[i] for i in seen.exit_order] == exit_order(key, names)  # the reference's order
    assert seen.asked == 3
    table = [bytes.fromhex(token) for token in manifest["slot_table"]]  # the served back-end's
    reference = slot_classes(key, names, table)
    assert [names[c] for c in seen.named_by_server] == [reference[s] for s in seen.top_slots]
    assert seen.extension_top_slots == seen.top_slots  # the same rows, the other request form
    first, retry = seen.receipts
    assert first["rows"] == 3 and first["duplicate"] is False
    assert retry == {**first, "duplicate": True}
    assert seen.refused and seen.refused[0].startswith("split_depths holds 99;")
