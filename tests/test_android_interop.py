"""harmony-core (the Android app's plain-Java core) against the real Python code.

1. `mvn -o test` builds android_demo/harmony-core offline from the local Maven cache and runs its
   JUnit suite (golden vectors, manifest tampering, exit decisions, queue durability, retry/backoff
   against an in-JVM HTTP server, JSON edge cases).
2. The live interop test starts the real fallback server (`harmony serve`) on a free loopback port
   with a random back-end, runs the Java client (`InteropMain`: enrol, verify the enrolment
   manifest against pinned Ed25519 and P-256 keys, two sealed confirmed-label uploads through the
   durable queue, a replay, a fallback inference decoded from slot to class, its local exit answer
   from token order), then checks in the server's own store that it decrypted and stored exactly
   what Java sent, that the inference answer is the class of the back-end's top slot, and that the
   local answer is the class Python's exit_order gives the exit head's top output.

Skipped only when `mvn` or `java` is not installed (both are on the image and in CI).
"""

from __future__ import annotations

import base64
import hashlib
import json
import os
import shutil
import signal
import subprocess
import sys
import uuid
from pathlib import Path

import numpy as np
import pytest
import torch
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey
from harmony_mobile.export.keys import public_key_bytes
from harmony_mobile.export.manifest import (
    BackendEntry,
    Normalization,
    TensorSpec,
    TierEntry,
    artifact_entry,
    build_manifest,
    write_signed_manifest,
)

from harmony_mobile.models import Backend, InterfaceSpec, ProjectionHead
from harmony_mobile.protocol.label_tokens import class_token, epoch_key, exit_order
from harmony_mobile.run_dir import load_backend_file, save_backend
from tests.helpers.ports import free_port
from tests.helpers.processes import stop, wait_until_ready

ROOT = Path(__file__).resolve().parents[1]
CORE = ROOT / "android_demo" / "harmony-core"
MVN = shutil.which("mvn")
JAVA = shutil.which("java")
# Every JVM here lives seconds: the optimizing JIT's threads spend more CPU than they save (Maven's
# build and JUnit run took 10.9 CPU-seconds with the defaults, 5.1 with the quick compiler only).
QUICK_JVM = "-XX:TieredStopAtLevel=1 -XX:+UseSerialGC"
JVM_ENV = {
    **os.environ,
    "JAVA_TOOL_OPTIONS": f"{os.environ.get('JAVA_TOOL_OPTIONS', '')} {QUICK_JVM}".strip(),
}
ADMIN_TOKEN = "interop-admin-token-0123456789"
FEDERATION_SECRET = bytes(range(100, 132))
LABEL_EPOCH = "interop-e1"
# The back-end's slots, in the order a server would have met the classes' tokens.
SLOT_ORDER = ["7", "3", "0", "1", "9", "2", "8", "4", "6", "5"]

pytestmark = pytest.mark.skipif(
    MVN is None or JAVA is None, reason="needs Maven and a JDK (`mvn`, `java`) to build harmony-core"
)


@pytest.fixture(scope="module")
def built_core() -> Path:
    """Compile harmony-core and run its JUnit suite once (offline); returns the surefire report dir."""
    result = subprocess.run(
        [MVN, "-o", "-q", "-B", "test"], cwd=CORE, env=JVM_ENV, capture_output=True, text=True, timeout=600
    )
    assert result.returncode == 0, f"mvn -o test failed:\n{result.stdout[-6000:]}\n{result.stderr[-3000:]}"
    return CORE / "target" / "surefire-reports"


def test_harmony_core_junit_suite_passes(built_core):
    counts = {"tests": 0, "failures": 0, "errors": 0}
    for report in built_core.glob("TEST-*.xml"):
        head = report.read_text(encoding="utf-8")[:2000]
        for key in counts:
            marker = f' {key}="'
            start = head.index(marker) + len(marker)
            counts[key] += int(head[start : head.index('"', start)])
    assert counts["failures"] == 0 and counts["errors"] == 0, counts
    assert counts["tests"] >= 90, f"expected the whole JUnit suite, ran {counts['tests']}"


# --------------------------------------------------------------------------- live server


def _model_dir(path: Path) -> tuple[Path, bytes]:
    """An export-like model dir: a random back-end over slots, a stand-in .pte, a manifest signed by
    fresh Ed25519 and P-256 keys."""
    from cryptography.hazmat.primitives.asymmetric import ec
    from harmony_mobile.export.keys import p256_public_key_der

    from harmony_mobile.protocol.slots import SlotTable

    torch.manual_seed(0)
    backend = Backend(InterfaceSpec(64, 8), 10)
    projection = ProjectionHead(backend.feature_dim, 128)
    class_names = tuple(str(i) for i in range(10))
    key_e = epoch_key(FEDERATION_SECRET, LABEL_EPOCH)
    slots = SlotTable(LABEL_EPOCH, 10, [class_token(key_e, name) for name in SLOT_ORDER])
    save_backend(path / "backend" / "backend.pt", backend, projection, "interop-v1", class_names, slots)
    (path / "backend" / "backend.pt2").write_bytes(b"not used by the server")
    (path / "mid-android").mkdir()
    (path / "mid-android" / "front_fp32.pte").write_bytes(b"stand-in pte " * 16)
    tier = TierEntry(
        name="mid-android",
        family="mobilenet",
        split_depth=2,
        width=1.0,
        client_id=0,
        parameters=1,
        input=TensorSpec(name="image", shape=[1, 1, 28, 28]),
        normalization=Normalization(mean=[0.1307], std=[0.3081]),
        outputs=[
            TensorSpec(name="exit_logits", shape=[1, 10]),
            TensorSpec(name="features", shape=[1, 64, 8, 8]),
        ],
        class_names=list(class_names),
        interface_shape=[64, 8, 8],
        threshold=0.9,
        threshold_source="tier",
        quantization=["fp32"],
        backends=["xnnpack"],
        latency_budget_ms=5.0,
        artifacts=[
            artifact_entry(path, "mid-android/front_fp32.pte", backend="xnnpack", quantization="fp32")
        ],
    )
    key = Ed25519PrivateKey.generate()
    p256_key = ec.generate_private_key(ec.SECP256R1())
    manifest = build_manifest(
        path,
        model_version="interop-v1",
        run={"algorithm": "random"},
        class_names=class_names,
        label_epoch=LABEL_EPOCH,
        slot_table=slots.to_hex(),
        interface_shape=[64, 8, 8],
        backend=BackendEntry.describe("interop-v1", [64, 8, 8], 10),
        tiers=[tier],
        public_key=key.public_key(),
        p256_public_key=p256_key.public_key(),
    )
    write_signed_manifest(path, manifest, key, p256_key)
    return path, public_key_bytes(key.public_key()), p256_public_key_der(p256_key.public_key())


@pytest.fixture
def live_server(tmp_path):
    model_dir, pinned_key, pinned_p256_key = _model_dir(tmp_path / "model")
    data_dir = tmp_path / "data"
    port = free_port()
    log = open(tmp_path / "server.log", "w")  # closed in the finally below
    harmony = Path(sys.executable).with_name("harmony")
    command = [str(harmony)] if harmony.exists() else [sys.executable, "-m", "harmony_mobile.cli"]
    process = subprocess.Popen(
        [
            *command,
            "serve",
            "--host",
            "127.0.0.1",
            "--port",
            str(port),
            "--data-dir",
            str(data_dir),
            "--model-dir",
            str(model_dir),
            "--admin-token",
            ADMIN_TOKEN,
            "--torch-threads",
            "1",
            "--log-level",
            "warning",
        ],
        stdout=log,
        stderr=subprocess.STDOUT,
        env={**os.environ, "OMP_NUM_THREADS": "1"},
    )
    base_url = f"http://127.0.0.1:{port}"
    try:
        wait_until_ready(process, f"{base_url}/v2/health/ready", 120.0, tmp_path / "server.log")
        yield {
            "base_url": base_url,
            "data_dir": data_dir,
            "model_dir": model_dir,
            "pinned_key": pinned_key,
            "pinned_p256_key": pinned_p256_key,
        }
    finally:
        stop(process, signal.SIGINT, timeout=20)
        log.close()


def _run_java_client(server: dict, work: Path) -> dict:
    out = work / "java_sent.json"
    classpath = os.pathsep.join([str(CORE / "target" / "classes"), str(CORE / "target" / "test-classes")])
    result = subprocess.run(
        [
            JAVA,
            "-cp",
            classpath,
            "org.harmonymobile.core.interop.InteropMain",
            server["base_url"],
            ADMIN_TOKEN,
            server["pinned_key"].hex(),
            server["pinned_p256_key"].hex(),
            FEDERATION_SECRET.hex(),
            str(work / "queue"),
            str(out),
            str(server["model_dir"]),  # where the export's artifacts are published
        ],
        env=JVM_ENV,
        capture_output=True,
        text=True,
        timeout=180,
    )
    assert result.returncode == 0, f"InteropMain failed:\n{result.stdout[-4000:]}\n{result.stderr[-4000:]}"
    return json.loads(out.read_text(encoding="utf-8"))


def _features(encoded: str) -> np.ndarray:
    return np.frombuffer(base64.b64decode(encoded), dtype="<f4").reshape(1, 64, 8, 8)


def test_java_client_against_the_real_server(built_core, live_server, tmp_path):
    from harmony_mobile.server.core.keys import load_or_create_server_key
    from harmony_mobile.server.services.store import Store
    from harmony_mobile.server.services.uploads import open_upload

    sent = _run_java_client(live_server, tmp_path)

    # Enrolment: the pinned manifest verified in Java, the server key is the server's.
    data_dir = live_server["data_dir"]
    server_key = load_or_create_server_key(data_dir)
    assert sent["server_public_key"] == server_key.public_key().public_bytes_raw().hex()
    assert sent["manifest_model_version"] == "interop-v1"
    assert sent["manifest_p256_model_version"] == "interop-v1"  # what an Android 13-15 phone verifies
    assert sent["manifest_tiers"] == ["mid-android"]
    # Update: the served manifest (GET /v1/manifest + /v1/manifest.p256.sig) installed through the
    # model store, its artifact checked; offered again, it changes nothing.
    served = (live_server["model_dir"] / "manifest.json").read_bytes()
    update = sent["update"]
    assert update["manifest_sha256"] == hashlib.sha256(served).hexdigest()
    assert update["manifest_version"] == json.loads(served)["manifest_version"]
    artifact = live_server["model_dir"] / update["artifact"]
    assert update["artifact_file_sha256"] == hashlib.sha256(artifact.read_bytes()).hexdigest()
    assert update["second_install_changed"] is False
    assert sent["label_epoch"] == LABEL_EPOCH
    key = epoch_key(FEDERATION_SECRET, LABEL_EPOCH)
    assert sent["slot_table"] == [class_token(key, name).hex() for name in SLOT_ORDER]

    # Uploads: delivered, replay acknowledged as a duplicate, stored exactly once each.
    assert sent["delivered"] == 2 and sent["pending_after_flush"] == 0
    assert sent["replay_duplicate"] is True
    assert sent["replay_message_id"] == sent["uploads"][0]["message_id"]
    store = Store(data_dir)
    try:
        stored = sorted(
            (e for e in store.envelopes() if e.device_id == sent["device_id"]), key=lambda e: e.upload_id
        )
    finally:
        store.close()
    assert [e.message_id for e in stored] == [u["message_id"] for u in sent["uploads"]]

    for envelope, upload in zip(stored, sent["uploads"], strict=True):
        assert uuid.UUID(envelope.message_id)
        assert envelope.label_epoch == LABEL_EPOCH
        assert hashlib.sha256(envelope.envelope).hexdigest() == upload["envelope_sha256"]
        payload = open_upload(
            server_key, envelope.device_id, envelope.label_epoch, envelope.message_id, envelope.envelope
        )
        np.testing.assert_array_equal(payload.features, _features(upload["features_f32le_base64"]))
        meta = payload.metadata
        assert (
            meta.label_tokens == (class_token(key, upload["class_name"]).hex(),) == (upload["label_token"],)
        )
        assert meta.split_depths == (2,)
        assert (meta.family, meta.tier, meta.model_version) == ("mobilenet", "mid-android", "interop-v1")

    # Inference: uncertain locally, so the server answered with the top slot of g(z), and Java
    # turned the slot into the class whose token the slot holds.
    inference = sent["inference"]
    assert inference["source"] == "SERVER", inference
    loaded = load_backend_file(live_server["model_dir"] / "backend" / "backend.pt")
    with torch.no_grad():
        scores = loaded.backend(torch.from_numpy(_features(inference["features_f32le_base64"]).copy()))[0]
    assert inference["top_slot"] == int(scores.argmax())
    assert inference["predicted_class"] == int(SLOT_ORDER[int(scores.argmax())])
    np.testing.assert_allclose(np.array(inference["slot_scores"]), scores.numpy(), rtol=1e-4, atol=1e-4)
    assert inference["confidence"] == pytest.approx(float(scores.softmax(0).max()), abs=1e-5)
    # The local (exit) answer: exit output 1 names the class exit_order puts second (token order), not class 1.
    digits = [str(i) for i in range(10)]
    assert inference["local_top_output"] == 1
    assert inference["local_class"] == digits.index(exit_order(key, digits)[1])
