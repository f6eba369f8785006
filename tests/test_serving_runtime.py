"""The back-end through ONNX Runtime: the export's backend.onnx answers like backend.pt, a replica
on the onnx runtime answers the same HTTP as one on torch, follows versions a torch replica
publishes, and imports no torch at all (checked in a subprocess where torch cannot be imported)."""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
from pathlib import Path

import numpy as np
import onnx
import pytest
import torch
from fastapi.testclient import TestClient
from harmony_mobile.export import steps
from harmony_mobile.server import create_app
from harmony_mobile.server.services.registry import ModelRegistry
from harmony_mobile.server.services.runtimes import OnnxRuntime, RuntimeChoiceError, choose_runtime
from harmony_mobile.server.services.store import Store
from harmony_mobile.server.services.torch_runtime import TorchRuntime, served_version

from harmony_mobile.onnx_backend import METADATA_FIELDS, METADATA_KEY, TOLERANCE, load_onnx_backend
from harmony_mobile.protocol.digests import sha256_file
from harmony_mobile.protocol.wire import encode_tensor
from harmony_mobile.run_dir import load_backend_file
from tests.helpers.fallback_server import (
    bearer,
    class_features,
    enrol,
    json_infer_body,
    make_model_dir,
    make_settings,
)

torch.set_num_threads(1)
INFER = "/v2/models/harmony-backend/infer"
ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def export_dir(tmp_path_factory) -> Path:
    """A model dir whose backend/ is what `harmony export` writes: backend.pt, .pt2 and .onnx."""
    source = make_model_dir(tmp_path_factory.mktemp("run"), fit_steps=30)
    out = tmp_path_factory.mktemp("export")
    facts = steps.export_backend(source / "backend" / "backend.pt", out / "backend")
    assert facts["onnx_max_abs_vs_eager"] <= TOLERANCE
    return out


def test_the_exported_onnx_backend_answers_like_backend_pt(export_dir):
    loaded = load_backend_file(export_dir / "backend" / "backend.pt")
    served = load_onnx_backend((export_dir / "backend" / "backend.onnx").read_bytes(), threads=1)
    for rows in (1, 7, 64):
        features = class_features(np.arange(rows) % 10, seed=rows)
        with torch.inference_mode():
            expected = loaded.backend(torch.from_numpy(features)).numpy()
        assert np.abs(served.forward(features) - expected).max() <= TOLERANCE
    assert served.backend_sha256 == sha256_file(export_dir / "backend" / "backend.pt")
    assert served.slot_table.to_hex() == loaded.slot_table.to_hex()
    assert served.slot_table.label_epoch == loaded.label_epoch
    assert served.model_version == loaded.model_version
    assert served.replay_rows == loaded.replay.shape[0]


def test_the_onnx_backend_holds_g_and_label_free_metadata_only(export_dir):
    model = onnx.load(export_dir / "backend" / "backend.onnx")
    meta = {p.key: p.value for p in model.metadata_props}
    assert set(json.loads(meta[METADATA_KEY])) == set(METADATA_FIELDS)
    assert "class_names" not in meta[METADATA_KEY]
    # every weight is one of g's: no projection head h, no replay features
    loaded = load_backend_file(export_dir / "backend" / "backend.pt")
    # (int64 initializers are the graph's shape constants)
    weights = [t for t in model.graph.initializer if t.data_type == onnx.TensorProto.FLOAT]
    assert sorted(int(np.prod(t.dims)) for t in weights) == sorted(
        p.numel() for p in loaded.backend.parameters()
    )


def _answers(client: TestClient, features: np.ndarray) -> dict:
    auth = bearer(enrol(client)["token"])
    answers = {"json": client.post(INFER, json=json_infer_body(features), headers=auth)}
    headers = {**auth, "content-type": "application/octet-stream"}
    answers["binary"] = client.post(INFER, content=encode_tensor(features), headers=headers)
    path = "/v2/models/harmony-backend/versions/v1/infer"  # make_model_dir's version
    answers["version"] = client.post(path, json=json_infer_body(features), headers=auth)
    answers["metadata"] = client.get("/v2/models/harmony-backend", headers=auth)
    return answers


def test_both_runtimes_give_the_same_http_answers(export_dir, tmp_path):
    features = class_features(np.arange(12) % 10, seed=5)
    answers = {}
    for runtime in ("torch", "onnx"):
        settings = make_settings(tmp_path / runtime, export_dir, runtime=runtime, run_alignment=False)
        with TestClient(create_app(settings)) as client:
            assert client.app.state.harmony.registry.runtime.name == runtime
            answers[runtime] = _answers(client, features)
    torch_answers, onnx_answers = answers["torch"], answers["onnx"]
    assert onnx_answers["metadata"].json() == torch_answers["metadata"].json()
    for kind in ("json", "binary", "version"):  # a binary request is answered in JSON unless it asks
        assert onnx_answers[kind].status_code == torch_answers[kind].status_code == 200
        by_name = [{o["name"]: o for o in answers[r][kind].json()["outputs"]} for r in ("torch", "onnx")]
        assert by_name[0]["top_slot"]["data"] == by_name[1]["top_slot"]["data"]
        for name in ("slot_scores", "confidence"):
            difference = np.abs(np.array(by_name[0][name]["data"]) - np.array(by_name[1][name]["data"]))
            assert difference.max() <= TOLERANCE, name


def test_an_onnx_replica_serves_what_a_torch_replica_publishes(export_dir, tmp_path):
    (tmp_path / "shared").mkdir()
    store = Store(tmp_path / "shared", None)
    trainer = ModelRegistry(store, tmp_path / "trainer", TorchRuntime(1))
    trainer.import_backend(export_dir)
    teacher = trainer.load_default()
    backend = type(teacher.backend)(teacher.backend.interface, teacher.num_classes)
    backend.load_state_dict(teacher.backend.state_dict())
    with torch.no_grad():
        backend.classifier.bias += 0.5  # a different version, like an alignment round's
    model = served_version(
        "v1-r1", "", backend, teacher.projection, teacher.class_names, teacher.replay, teacher.slot_table
    )
    trainer.publish("v1-r1", teacher.version, {}, model)
    server = ModelRegistry(store, tmp_path / "server", OnnxRuntime(1))
    served = server.load_default()
    assert served.version == "v1-r1" and served.runtime == "onnx"
    features = class_features(np.arange(9) % 10, seed=3)
    assert np.abs(served.forward(features) - model.forward(features)).max() <= TOLERANCE
    store.close()


def test_the_onnx_runtime_refuses_alignment_and_an_export_without_backend_onnx(tmp_path):
    with pytest.raises(RuntimeChoiceError, match="--no-alignment"):
        choose_runtime("onnx", run_alignment=True)
    model_dir = make_model_dir(tmp_path)  # backend.pt only, as exports made before backend.onnx
    settings = make_settings(tmp_path, model_dir, runtime="onnx", run_alignment=False)
    with pytest.raises(ValueError, match="backend.onnx is missing"):
        create_app(settings)


BLOCK_TORCH = textwrap.dedent(
    """
    import importlib.abc, json, sys

    class NoTorch(importlib.abc.MetaPathFinder):
        def find_spec(self, name, path, target=None):
            if name == "torch" or name.startswith("torch."):
                raise ModuleNotFoundError(f"No module named {name!r} (blocked)", name=name)
            return None

    sys.meta_path.insert(0, NoTorch())
    sys.modules["torch"] = None  # what find_spec reports for a package that is not installed
    """
)

NO_TORCH_SERVER = BLOCK_TORCH + textwrap.dedent(
    """
    import numpy as np
    from fastapi.testclient import TestClient
    from harmony_mobile.server import Settings, create_app
    from harmony_mobile.server.services.runtimes import RuntimeChoiceError

    root, model_dir, features = sys.argv[1], sys.argv[2], np.load(sys.argv[3])
    admin = {"Authorization": "Bearer admin-token-for-tests-0123456789"}

    def settings(data_dir, **overrides):
        return Settings(data_dir=data_dir, model_dir=model_dir, admin_token=admin["Authorization"][7:], **overrides)

    try:
        create_app(settings(root + "/aligning"))
        refused = None
    except RuntimeChoiceError as error:
        refused = str(error)
    body = {"inputs": [{"name": "features", "shape": list(features.shape), "datatype": "FP32",
                        "data": features.ravel().tolist()}]}
    with TestClient(create_app(settings(root, run_alignment=False))) as client:
        ready = client.get("/v2/health/ready").status_code
        device = client.post("/v1/devices", json={"name": "phone", "tier": "mid-android"}, headers=admin).json()
        auth = {"Authorization": "Bearer " + device["token"]}
        infer = client.post("/v2/models/harmony-backend/infer", json=body, headers=auth)
        pages = [client.get(path, headers=admin).status_code for path in ("/", "/metrics", "/v2/models/stats")]
    torch_modules = sorted(m for m, v in sys.modules.items() if v is not None and m.split(".")[0] == "torch")
    print(json.dumps({"ready": ready, "infer": infer.json(), "status": infer.status_code,
                      "refused": refused, "torch_modules": torch_modules, "pages": pages}))
    """
)


def test_a_replica_without_torch_serves_and_imports_no_torch(export_dir, tmp_path):
    features = class_features(np.arange(4) % 10, seed=9)
    np.save(tmp_path / "features.npy", features)
    result = subprocess.run(
        [
            sys.executable,
            "-c",
            NO_TORCH_SERVER,
            str(tmp_path / "data"),
            str(export_dir),
            str(tmp_path / "features.npy"),
        ],
        capture_output=True,
        text=True,
        cwd=ROOT,
        timeout=300,
    )
    assert result.returncode == 0, result.stderr[-3000:]
    answer = json.loads(result.stdout.strip().splitlines()[-1])
    assert answer["torch_modules"] == []
    assert answer["ready"] == 200 and answer["status"] == 200, answer
    assert answer["pages"] == [200, 200, 200]  # status page, metrics, statistics
    assert "harmony-mobile[alignment]" in answer["refused"]
    loaded = load_backend_file(export_dir / "backend" / "backend.pt")
    with torch.inference_mode():
        expected = loaded.backend(torch.from_numpy(features))[:, : len(loaded.slot_table)].numpy()
    outputs = {o["name"]: o for o in answer["infer"]["outputs"]}
    scores = np.array(outputs["slot_scores"]["data"]).reshape(expected.shape)
    assert np.abs(scores - expected).max() <= TOLERANCE
    assert outputs["top_slot"]["data"] == expected.argmax(axis=1).tolist()
