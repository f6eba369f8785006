"""Manifest signing and verification: every kind of tampering is caught and names the file."""

from __future__ import annotations

import base64
import json
import os
import stat

import pytest
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey
from harmony_mobile.export.keys import (
    P256_PRIVATE_KEY_FILE,
    P256_PUBLIC_KEY_FILE,
    PRIVATE_KEY_FILE,
    PUBLIC_KEY_FILE,
    SigningKeyError,
    encode_public_key,
    load_or_create_p256_signing_key,
    load_or_create_signing_key,
    load_p256_public_key,
    load_public_key,
)
from harmony_mobile.export.manifest import (
    MANIFEST_FILE,
    P256_SIGNATURE_FILE,
    SIGNATURE_FILE,
    ManifestError,
    encode_signature,
    manifest_to_bytes,
    read_manifest,
    sign_manifest,
    sign_manifest_p256,
    signature_info,
    tree_digest,
    verify_manifest,
    write_signed_manifest,
)

from tests.export_fixtures import FAKE_FILES, fake_export_dir


@pytest.fixture
def signed(tmp_path):
    return fake_export_dir(tmp_path / "out", tmp_path / "keys"), tmp_path / "keys"


def problems_of(directory, public_key=None, p256_public_key=None) -> str:
    with pytest.raises(ManifestError) as error:
        verify_manifest(directory, public_key, p256_public_key)
    return str(error.value)


def test_signed_directory_verifies_with_its_own_and_the_pinned_key(signed):
    out, keys = signed
    manifest = verify_manifest(out)
    assert manifest.model_version == "test-v1"
    assert verify_manifest(out, keys / PUBLIC_KEY_FILE).tier("mid-ios").artifacts[0].format == "mlpackage"
    assert (out / PUBLIC_KEY_FILE).read_bytes() == (keys / PUBLIC_KEY_FILE).read_bytes()


def test_signature_and_key_file_formats_are_what_the_apps_parse(signed):
    out, keys = signed
    sig_text = (out / SIGNATURE_FILE).read_bytes()
    pub_text = (out / PUBLIC_KEY_FILE).read_bytes()
    assert b"\n" not in sig_text and b"\n" not in pub_text
    signature, raw_key = base64.b64decode(sig_text, validate=True), base64.b64decode(pub_text, validate=True)
    assert len(signature) == 64 and len(raw_key) == 32
    from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PublicKey

    Ed25519PublicKey.from_public_bytes(raw_key).verify(signature, (out / MANIFEST_FILE).read_bytes())


def test_sign_manifest_is_plain_ed25519_over_the_bytes():
    key = Ed25519PrivateKey.generate()
    data = b'{"a": 1}\n'
    signature = sign_manifest(data, key)
    assert len(signature) == 64
    key.public_key().verify(signature, data)
    assert signature == sign_manifest(data, key)  # Ed25519 is deterministic: golden vectors are stable


def test_mlpackage_digest_is_the_documented_tree_digest(signed):
    out, _ = signed
    artifact = read_manifest(out).tier("mid-ios").artifacts[0]
    import hashlib

    prefix = "mid-ios/front_coreml-fp16.mlpackage/"
    lines = sorted(
        f"{hashlib.sha256(data).hexdigest()}  {path[len(prefix) :]}\n"
        for path, data in FAKE_FILES.items()
        if path.startswith(prefix)
    )
    lines.sort(key=lambda line: line.split("  ", 1)[1])
    assert artifact.sha256 == hashlib.sha256("".join(lines).encode()).hexdigest()
    assert artifact.size == sum(len(d) for p, d in FAKE_FILES.items() if p.startswith(prefix))
    assert tree_digest([])[1] == 0


@pytest.mark.parametrize("relpath", sorted(FAKE_FILES))
def test_a_changed_byte_in_any_file_is_detected_and_named(signed, relpath):
    out, _ = signed
    path = out / relpath
    data = bytearray(path.read_bytes())
    data[len(data) // 2] ^= 0x01
    path.write_bytes(bytes(data))
    assert relpath in problems_of(out)


def test_a_truncated_or_missing_file_is_detected(signed):
    out, _ = signed
    (out / "entry-android/front_int8.pte").write_bytes(b"short")
    (out / "backend/backend.pt2").unlink()
    message = problems_of(out)
    assert "entry-android/front_int8.pte: size 5 bytes" in message
    assert "backend/backend.pt2: missing" in message


def test_an_unlisted_file_is_detected(signed):
    out, _ = signed
    (out / "mid-ios/front_coreml-fp16.mlpackage/Data/extra.bin").write_bytes(b"x")
    assert "mid-ios/front_coreml-fp16.mlpackage/Data/extra.bin: present but not listed" in problems_of(out)


@pytest.mark.parametrize(
    "edit",
    [
        lambda m: m["tiers"][0].__setitem__("threshold", 0.5),
        lambda m: m.__setitem__("model_version", "test-v2"),
        lambda m: m["tiers"][1]["normalization"].__setitem__("mean", [0.0]),
        lambda m: m["files"][0].__setitem__("size", m["files"][0]["size"] + 1),
    ],
    ids=["threshold", "model_version", "normalization", "file-size"],
)
def test_a_changed_field_in_manifest_json_breaks_the_signature(signed, edit):
    out, _ = signed
    manifest = json.loads((out / MANIFEST_FILE).read_text())
    edit(manifest)
    (out / MANIFEST_FILE).write_text(json.dumps(manifest, indent=2) + "\n")
    assert f"{SIGNATURE_FILE}: signature does not match {MANIFEST_FILE}" in problems_of(out)


def test_whitespace_only_change_to_manifest_json_is_detected(signed):
    out, _ = signed
    (out / MANIFEST_FILE).write_bytes((out / MANIFEST_FILE).read_bytes() + b" ")
    assert SIGNATURE_FILE in problems_of(out)


def test_a_swapped_signature_is_detected(signed, tmp_path):
    out, keys = signed
    other = fake_export_dir(tmp_path / "other", tmp_path / "other-keys")
    # a valid signature, but by another key
    (out / SIGNATURE_FILE).write_bytes((other / SIGNATURE_FILE).read_bytes())
    assert "signature does not match" in problems_of(out)
    # a signature by the right key over other bytes
    key, _ = load_or_create_signing_key(keys)
    (out / SIGNATURE_FILE).write_bytes(encode_signature(sign_manifest(b"something else", key)))
    assert "signature does not match" in problems_of(out)
    (out / SIGNATURE_FILE).write_bytes(b"not base64!")
    assert f"{SIGNATURE_FILE}: not base64" in problems_of(out)


def test_an_attacker_resigning_with_their_own_key_fails_against_the_pinned_key(signed, tmp_path):
    out, keys = signed
    manifest = read_manifest(out)
    manifest.tiers[0].threshold = 0.01
    attacker, _ = load_or_create_signing_key(tmp_path / "attacker")
    from harmony_mobile.export.manifest import signature_info

    manifest.signature = signature_info(attacker.public_key())
    write_signed_manifest(out, manifest, attacker)
    verify_manifest(out)  # self-consistent with the key shipped in the directory ...
    message = problems_of(out, keys / PUBLIC_KEY_FILE)  # ... but not with the pinned one
    assert (
        "signature does not match" in message
        and f"{PUBLIC_KEY_FILE}: is not the pinned public key" in message
    )


def test_missing_manifest_or_signature(signed):
    out, _ = signed
    (out / SIGNATURE_FILE).unlink()
    assert f"{SIGNATURE_FILE}: missing" in problems_of(out)


def test_keys_are_generated_once_with_private_permissions(tmp_path):
    key_dir = tmp_path / "cfg" / "keys"
    key, created = load_or_create_signing_key(key_dir)
    assert created
    assert stat.S_IMODE((key_dir / PRIVATE_KEY_FILE).stat().st_mode) == 0o600
    assert stat.S_IMODE(key_dir.stat().st_mode) == 0o700
    again, created_again = load_or_create_signing_key(key_dir)
    assert not created_again and again.public_key() == key.public_key()
    assert load_public_key(key_dir / PUBLIC_KEY_FILE) == key.public_key()
    assert (key_dir / PUBLIC_KEY_FILE).read_bytes() == encode_public_key(key.public_key())


def test_an_unsafe_or_mismatched_key_is_refused(tmp_path):
    key_dir = tmp_path / "keys"
    load_or_create_signing_key(key_dir)
    os.chmod(key_dir / PRIVATE_KEY_FILE, 0o644)
    with pytest.raises(SigningKeyError, match="readable by others"):
        load_or_create_signing_key(key_dir)
    os.chmod(key_dir / PRIVATE_KEY_FILE, 0o600)
    (key_dir / PUBLIC_KEY_FILE).write_bytes(encode_public_key(Ed25519PrivateKey.generate().public_key()))
    with pytest.raises(SigningKeyError, match="does not belong"):
        load_or_create_signing_key(key_dir)


def test_manifest_bytes_are_stable(signed):
    out, _ = signed
    assert manifest_to_bytes(read_manifest(out)) == (out / MANIFEST_FILE).read_bytes()


# --------------------------------------------------------------------------- ECDSA P-256 (what Android checks)


def test_the_p256_signature_verifies_with_the_pinned_key_and_is_deterministic(signed):
    out, keys = signed
    manifest = verify_manifest(out, keys / PUBLIC_KEY_FILE, keys / P256_PUBLIC_KEY_FILE)
    assert manifest.signature.p256.public_key_sha256
    assert (out / P256_PUBLIC_KEY_FILE).read_bytes() == (keys / P256_PUBLIC_KEY_FILE).read_bytes()
    key, _ = load_or_create_p256_signing_key(keys)
    data = (out / MANIFEST_FILE).read_bytes()
    signature = base64.b64decode((out / P256_SIGNATURE_FILE).read_bytes(), validate=True)
    assert signature == sign_manifest_p256(data, key)  # RFC 6979: the same bytes sign the same way
    from cryptography.hazmat.primitives import hashes
    from cryptography.hazmat.primitives.asymmetric import ec

    load_p256_public_key(keys / P256_PUBLIC_KEY_FILE).verify(signature, data, ec.ECDSA(hashes.SHA256()))


def test_a_tampered_or_swapped_p256_signature_is_detected(signed, tmp_path):
    out, keys = signed
    pinned = keys / P256_PUBLIC_KEY_FILE
    other = fake_export_dir(tmp_path / "other", tmp_path / "other-keys")
    (out / P256_SIGNATURE_FILE).write_bytes((other / P256_SIGNATURE_FILE).read_bytes())
    assert f"{P256_SIGNATURE_FILE}: signature does not match" in problems_of(out, None, pinned)
    key, _ = load_or_create_p256_signing_key(keys)
    (out / P256_SIGNATURE_FILE).write_bytes(base64.b64encode(sign_manifest_p256(b"other bytes", key)))
    assert f"{P256_SIGNATURE_FILE}: signature does not match" in problems_of(out, None, pinned)
    (out / P256_SIGNATURE_FILE).unlink()
    assert f"{P256_SIGNATURE_FILE}: missing" in problems_of(out)


def test_a_tampered_manifest_fails_both_signatures(signed):
    out, keys = signed
    data = (out / MANIFEST_FILE).read_bytes().replace(b'"threshold": 0.9', b'"threshold": 0.1')
    (out / MANIFEST_FILE).write_bytes(data)
    message = problems_of(out, keys / PUBLIC_KEY_FILE, keys / P256_PUBLIC_KEY_FILE)
    assert f"{SIGNATURE_FILE}: signature does not match" in message
    assert f"{P256_SIGNATURE_FILE}: signature does not match" in message


def test_an_attacker_resigning_both_fails_against_the_pinned_p256_key(signed, tmp_path):
    out, keys = signed
    manifest = read_manifest(out)
    manifest.tiers[0].threshold = 0.01
    attacker, _ = load_or_create_signing_key(tmp_path / "attacker")
    attacker_p256, _ = load_or_create_p256_signing_key(tmp_path / "attacker")
    manifest.signature = signature_info(attacker.public_key(), attacker_p256.public_key())
    write_signed_manifest(out, manifest, attacker, attacker_p256)
    verify_manifest(out)  # self-consistent with the shipped keys ...
    message = problems_of(out, None, keys / P256_PUBLIC_KEY_FILE)  # ... but not with the pinned one
    assert f"{P256_SIGNATURE_FILE}: signature does not match" in message
    assert f"{P256_PUBLIC_KEY_FILE}: is not the pinned P-256 public key" in message
    assert "signature.p256.public_key_sha256 names another key" in message


def test_a_pinned_p256_key_refuses_a_manifest_without_a_p256_signature(signed):
    out, keys = signed
    ed25519, _ = load_or_create_signing_key(keys)
    manifest = read_manifest(out)
    manifest.signature = signature_info(ed25519.public_key())
    write_signed_manifest(out, manifest, ed25519)
    assert verify_manifest(out, keys / PUBLIC_KEY_FILE).signature.p256 is None
    assert "names no P-256 key" in problems_of(out, None, keys / P256_PUBLIC_KEY_FILE)


def test_the_p256_key_is_created_beside_an_existing_ed25519_key_with_private_permissions(tmp_path):
    key_dir = tmp_path / "keys"
    load_or_create_signing_key(key_dir)
    (key_dir / P256_PRIVATE_KEY_FILE).unlink()
    (key_dir / P256_PUBLIC_KEY_FILE).unlink()
    key, created = load_or_create_p256_signing_key(key_dir)
    assert created and stat.S_IMODE((key_dir / P256_PRIVATE_KEY_FILE).stat().st_mode) == 0o600
    assert len(base64.b64decode((key_dir / P256_PUBLIC_KEY_FILE).read_bytes())) == 91
    other, _ = load_or_create_p256_signing_key(tmp_path / "other")
    from harmony_mobile.export.keys import encode_p256_public_key

    (key_dir / P256_PUBLIC_KEY_FILE).write_bytes(encode_p256_public_key(other.public_key()))
    with pytest.raises(SigningKeyError, match="does not belong"):
        load_or_create_p256_signing_key(key_dir)
    with pytest.raises(SigningKeyError, match="not a P-256"):
        from cryptography.hazmat.primitives.asymmetric import ec
        from harmony_mobile.export.keys import load_private_key

        load_private_key(key_dir / PRIVATE_KEY_FILE, ec.EllipticCurvePrivateKey)
