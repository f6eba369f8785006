"""The golden vectors in tests/vectors are current, and they say what the Python side does.

harmony-core (Java) and HarmonyKit (Swift) assert byte equality against these files; this test
makes sure the files are what tests/vectors/generate.py writes today, so a change in the Python
wire format, sealing, label tokens, exit rule or manifest breaks here first.
"""

from __future__ import annotations

import base64
import hashlib
import importlib.util
import json
import re
import uuid
from pathlib import Path

import httpx
import numpy as np
import pytest
from cryptography.hazmat.primitives.asymmetric.x25519 import X25519PrivateKey
from harmony_mobile.export.manifest import ManifestError, verify_manifest

from harmony_mobile.device.fallback_client import error_detail
from harmony_mobile.protocol import sealing
from harmony_mobile.protocol.wire import decode_upload

ROOT = Path(__file__).resolve().parents[1]
VECTORS = ROOT / "tests" / "vectors"


def _generator():
    spec = importlib.util.spec_from_file_location("harmony_vector_generator", VECTORS / "generate.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _load(name: str) -> dict:
    return json.loads((VECTORS / name).read_text(encoding="utf-8"))


def test_committed_vectors_equal_a_fresh_generation():
    stale = _generator().stale_files()
    assert not stale, (
        f"stale golden vectors {stale}: run `.venv/bin/python tests/vectors/generate.py` and commit"
    )


def test_generation_is_deterministic():
    generator = _generator()
    assert generator.render() == generator.render()


def test_envelope_vector_is_the_one_in_the_protocol_appendix():
    protocol = re.sub(r"\s+", "", (ROOT / "docs" / "PROTOCOL.md").read_text(encoding="utf-8"))
    case = _load("sealed_upload.json")["cases"][0]
    assert case["name"] == "PROTOCOL.md A.1"
    assert case["envelope"] in protocol
    assert case["associated_data"] in protocol


def test_sealed_vectors_open_with_the_server_key_and_hold_valid_uploads():
    vectors = _load("sealed_upload.json")
    server = X25519PrivateKey.from_private_bytes(bytes.fromhex(vectors["server_private_key"]))
    for case in vectors["cases"]:
        ad = sealing.AssociatedData(case["device_id"], case["label_epoch"], uuid.UUID(case["message_id"]))
        assert sealing.open_sealed(server, bytes.fromhex(case["envelope"]), ad).hex() == case["plaintext"]
    upload = decode_upload(bytes.fromhex(vectors["cases"][2]["plaintext"]))
    assert upload.features.shape == (1, 64, 8, 8)


def test_manifest_vector_verifies_with_the_python_verifier(tmp_path):
    vectors = _load("manifest_signature.json")
    for artifact in vectors["artifacts"]:
        path = tmp_path / artifact["path"]
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(base64.b64decode(artifact["content_base64"]))
    (tmp_path / "manifest.json").write_bytes(vectors["manifest_text"].encode("utf-8"))
    (tmp_path / "manifest.sig").write_bytes(vectors["signature_file"].encode("ascii"))
    (tmp_path / "signing_key.pub").write_bytes(vectors["signing_key_pub"].encode("ascii"))
    (tmp_path / "manifest.p256.sig").write_bytes(vectors["p256_signature_file"].encode("ascii"))
    (tmp_path / "signing_key_p256.pub").write_bytes(vectors["signing_key_p256_pub"].encode("ascii"))
    pinned = bytes.fromhex(vectors["public_key"]), bytes.fromhex(vectors["p256_public_key"])
    manifest = verify_manifest(tmp_path, *pinned)
    assert [t.name for t in manifest.tiers] == ["entry-android", "flagship"]

    (tmp_path / "manifest.p256.sig").write_bytes(vectors["signature_file"].encode("ascii"))
    with pytest.raises(ManifestError, match="manifest.p256.sig"):
        verify_manifest(tmp_path, *pinned)
    (tmp_path / "manifest.p256.sig").write_bytes(vectors["p256_signature_file"].encode("ascii"))
    (tmp_path / "entry-android" / "front_fp32.pte").write_bytes(b"tampered")
    with pytest.raises(ManifestError):
        verify_manifest(tmp_path, *pinned)


def test_upload_vectors_decode_to_their_declared_metadata():
    for case in _load("feature_encoding.json")["uploads"]:
        payload = decode_upload(bytes.fromhex(case["plaintext"]))
        assert payload.metadata.model_dump(exclude_none=True) == {
            k: tuple(v) if isinstance(v, list) else v for k, v in case["metadata"].items()
        }
        assert list(payload.features.shape) == case["shape"]


def test_device_normalize_matches_the_normalization_vector():
    from harmony_mobile.device import normalize

    for case in _load("pixel_normalization.json")["cases"]:
        channels = case["channels"]
        pixels = np.array(case["pixels"], dtype=np.uint8).reshape(channels, 1, -1)
        got = normalize(pixels, case).numpy().reshape(-1)
        expected = np.array(case["values"], dtype=np.float32)
        # float32 arithmetic in torch vs float64 then rounding on the phones: a few float32 epsilons
        np.testing.assert_allclose(got, expected, rtol=0, atol=2e-6, err_msg=case["name"])


def test_feature_clipping_vector_is_the_documented_formula():
    """z * min(1, C / ||z||) computed independently in float64; ids = SHA-256 of the float32 row."""
    cases = {case["name"]: case for case in _load("feature_clipping.json")["cases"]}
    assert cases["norm above C: scaled to norm C"]["clipped"][0][:2] == [np.float32(0.6), np.float32(0.8)]
    for case in cases.values():
        rows = np.array(case["rows"], dtype=np.float64)
        norms = np.maximum(np.linalg.norm(rows, axis=1, keepdims=True), 1e-12)
        expected = rows * np.minimum(1.0, case["clip"] / norms)
        np.testing.assert_allclose(case["clipped"], expected, rtol=1e-6, atol=0, err_msg=case["name"])
        ids = [hashlib.sha256(np.asarray(row, "<f4").tobytes()).hexdigest() for row in case["rows"]]
        assert ids == case["sample_ids"], case["name"]


def test_tier_selection_vector_follows_the_documented_rule():
    """Spot checks by hand, so a wrong reference cannot pass just by agreeing with itself."""
    cases = {(c["tiers"], c["device_name"]): c for c in _load("tier_selection.json")["cases"]}
    assert cases[("default", "android mid at 3 GiB")]["selected"] == "mid-android"
    assert cases[("default", "iphone mid")]["selected"] == "mid-ios"  # Core ML preferred on a tie
    assert cases[("default", "android API 28")]["device_class"] == "entry"
    assert cases[("ties and boundaries", "android entry by RAM")]["selected"] == "boundary"  # cost == budget
    assert cases[("ties and boundaries", "android mid at 3 GiB")]["selected"] == "a-tier"  # name tie
    assert cases[("core ml only", "android mid at 3 GiB")]["selected"] is None


@pytest.mark.parametrize("case", _load("error_bodies.json")["cases"], ids=lambda case: case["name"])
def test_the_python_device_shows_the_servers_error_sentence(case):
    """`error` on /v2 routes, `detail` on /v1 routes, the body itself otherwise (as Java and Swift)."""
    response = httpx.Response(case["status"], content=case["body"].encode("utf-8"))
    assert error_detail(response) == case["message"]


def test_error_vectors_match_the_server_routes():
    """The vector's server cases are what the app answers on those routes today."""
    for case in _load("error_bodies.json")["cases"]:
        if case["path"] is not None:
            key = "error" if case["path"] == "/v2" or case["path"].startswith("/v2/") else "detail"
            assert json.loads(case["body"]) == {key: case["message"]}


def test_exit_order_vector_sorts_the_tokens_as_unsigned_bytes():
    """By hand (Python bytes compare unsigned), so a wrong reference cannot pass by agreeing with itself."""
    from harmony_mobile.protocol.label_tokens import class_token, epoch_key

    vectors = _load("exit_order.json")
    secret = bytes.fromhex(vectors["federation_secret"])
    for case in vectors["cases"]:
        key = epoch_key(secret, case["label_epoch"])
        names = case["class_names"]
        assert case["tokens"] == [class_token(key, name).hex() for name in names], case["name"]
        by_token = sorted(range(len(names)), key=lambda i: bytes.fromhex(case["tokens"][i]))
        assert case["exit_classes"] == [names[i] for i in by_token], case["name"]
    unsigned = vectors["cases"][-1]
    firsts = [bytes.fromhex(t)[0] for t in unsigned["tokens"]]
    assert min(firsts) < 0x80 <= max(firsts)
