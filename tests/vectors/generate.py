"""Golden vectors shared by the Python code, harmony-core (Java) and HarmonyKit (Swift).

Every number here is computed by the project's own Python functions (export/manifest.py,
harmony_mobile/protocol/sealing.py, harmony_mobile/protocol/label_tokens.py,
harmony_mobile/protocol/wire.py, harmony_mobile/algorithms/base.py, server/core/errors.py), from fixed
keys, nonces and inputs, so the phone implementations can assert byte equality against them. The
server cases of error_bodies.json also carry the request that makes a live server write them
(tests/test_protocol_replay.py replays them).

    .venv/bin/python tests/vectors/generate.py          # rewrite tests/vectors/*.json
    .venv/bin/python tests/vectors/generate.py --check  # exit 1 if a committed file is stale

tests/test_vectors.py runs the check in `make test`. Conventions in the JSON files: bytes are
lowercase hex unless a key ends in `_base64` (standard alphabet, padded); float32 values are
written as the decimal repr of their exact double value, so parsing then narrowing to float32
gives back the same bits.
"""

from __future__ import annotations

import argparse
import base64
import json
import re
import sys
import tempfile
import uuid
from pathlib import Path

import numpy as np
import torch
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey
from cryptography.hazmat.primitives.asymmetric.x25519 import X25519PrivateKey
from harmony_mobile.export.keys import (
    encode_p256_public_key,
    encode_public_key,
    p256_public_key_der,
    public_key_bytes,
)
from harmony_mobile.export.manifest import (
    BackendEntry,
    Normalization,
    build_manifest,
    encode_signature,
    manifest_to_bytes,
    sign_manifest,
    sign_manifest_p256,
)
from harmony_mobile.server.core.errors import error_response

from harmony_mobile.algorithms.base import exit_confidence
from harmony_mobile.device.label_draws import feature_sample_ids
from harmony_mobile.models.tier_selection import (
    DeviceCapabilities,
    NoRunnableTier,
    TierOption,
    device_class,
    select_tier,
)
from harmony_mobile.privacy.feature_noise import clip_rows
from harmony_mobile.protocol import sealing
from harmony_mobile.protocol.label_tokens import class_token, epoch_key, exit_order, slot_classes
from harmony_mobile.protocol.slot_gate import slot_margin
from harmony_mobile.protocol.wire import UploadMetadata, encode_tensor, encode_upload

# run as a script, only tests/vectors is on the path: the repo root makes tests.helpers importable
sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
from tests.helpers.manifest import digits_tier_entry, write_files

VECTORS_DIR = Path(__file__).resolve().parent
GENERATOR = "tests/vectors/generate.py"

# Fixed key material: test-only, never used anywhere else.
MANIFEST_SIGNING_SEED = bytes(range(0x40, 0x60))
MANIFEST_P256_SCALAR = int.from_bytes(bytes(range(0x20, 0x40)), "big")  # < the P-256 group order
SERVER_PRIVATE = bytes(range(1, 33))
EPHEMERAL_PRIVATE = bytes(range(0x65, 0x85))
NONCE = bytes(range(0xC9, 0xD5))
FEDERATION_SECRET = b"harmony golden federation secret"  # 32 bytes

# Artifacts of the vector manifest: tiny stand-ins for .pte files, so a test can check digests.
ARTIFACTS = {
    "entry-android/front_fp32.pte": b"golden pte fp32 " * 8,
    "entry-android/front_int8.pte": b"golden pte int8 " * 4,
    "flagship/front_fp32.pte": b"golden pte flagship " * 8,
    "backend/backend.pt": b"golden backend state",
    "backend/backend.pt2": b"golden backend program",
}


def _floats(array: np.ndarray) -> list[float]:
    return [float(v) for v in np.asarray(array, dtype=np.float32).reshape(-1)]


def _document(description: str, **content) -> dict:
    return {"generator": GENERATOR, "description": description, **content}


# --------------------------------------------------------------------------- manifest


def _tier(directory: Path, name: str, family: str, depth: int, width: float, threshold: float, artifacts):
    return digits_tier_entry(
        directory,
        name,
        artifacts,
        family=family,
        split_depth=depth,
        width=width,
        threshold=threshold,
        normalization=Normalization(mean=[0.1307], std=[0.3081]),
        client_id=depth,
        parameters=1000 * depth,
        latency_budget_ms=2.0 * depth,
    )


def _golden_slot_table(epoch: str, classes_in_slot_order) -> list[str]:
    key = epoch_key(FEDERATION_SECRET, epoch)
    return [class_token(key, name).hex() for name in classes_in_slot_order]


def manifest_vectors() -> dict:
    key = Ed25519PrivateKey.from_private_bytes(MANIFEST_SIGNING_SEED)
    p256_key = ec.derive_private_key(MANIFEST_P256_SCALAR, ec.SECP256R1())
    with tempfile.TemporaryDirectory() as tmp:
        directory = Path(tmp)
        write_files(directory, ARTIFACTS)
        tiers = [
            _tier(
                directory,
                "entry-android",
                "cnn",
                1,
                1.0,
                0.9,
                [
                    ("xnnpack", "fp32", "entry-android/front_fp32.pte"),
                    ("xnnpack", "int8", "entry-android/front_int8.pte"),
                ],
            ),
            _tier(
                directory,
                "flagship",
                "resnet",
                3,
                2.0,
                0.75,
                [("xnnpack", "fp32", "flagship/front_fp32.pte")],
            ),
        ]
        backend = BackendEntry.describe("golden-v1", [64, 8, 8], 10)
        manifest = build_manifest(
            directory,
            model_version="golden-v1",
            run={"algorithm": "harmony", "dataset": "mnist5k", "seed": 0},
            class_names=[str(i) for i in range(10)],
            interface_shape=[64, 8, 8],
            backend=backend,
            tiers=tiers,
            public_key=key.public_key(),
            created_at="2026-11-29T00:00:00Z",
            p256_public_key=p256_key.public_key(),
            label_epoch="mnist5k-2026-11",
            slot_table=_golden_slot_table("mnist5k-2026-11", "3170952846"),
        )
    data = manifest_to_bytes(manifest)
    signature_file = encode_signature(sign_manifest(data, key))
    p256_signature_file = base64.b64encode(sign_manifest_p256(data, p256_key))
    return _document(
        "An export manifest signed with Ed25519 and with ECDSA P-256 (export/manifest.py). Verify "
        "`signature_file` (the exact manifest.sig content) over the UTF-8 bytes of `manifest_text` with the "
        "pinned raw Ed25519 key, or `p256_signature_file` (manifest.p256.sig: base64 of a DER ECDSA-SHA256 "
        "signature, RFC 6979) with the pinned P-256 key (`p256_public_key`: X.509 SPKI DER). `artifacts` "
        "is a list, sorted by path, of {path, content_base64}: each file of the manifest's `files` (export-relative "
        "path; standard padded base64 of its exact bytes, placeholders), to check against that entry's sha256 and size.",
        public_key=public_key_bytes(key.public_key()).hex(),
        signing_key_pub=encode_public_key(key.public_key()).decode("ascii"),
        p256_public_key=p256_public_key_der(p256_key.public_key()).hex(),
        signing_key_p256_pub=encode_p256_public_key(p256_key.public_key()).decode("ascii"),
        p256_signature_file=p256_signature_file.decode("ascii"),
        manifest_text=data.decode("utf-8"),
        signature_file=signature_file.decode("ascii"),
        artifacts=[
            {"path": path, "content_base64": base64.b64encode(content).decode("ascii")}
            for path, content in sorted(ARTIFACTS.items())
        ],
    )


# --------------------------------------------------------------------------- label tokens


LABEL_EPOCHS = ["0", "e7", "mnist5k-2026-11", "A.b_c-9", "x" * 64]
CLASS_NAMES = [str(i) for i in range(10)] + ["T-shirt/top", "cat", "héllo wörld", "😀", " "]
INVALID_EPOCHS = ["", "a b", "x" * 65, "é", "e/1", "7\n"]


def label_token_vectors() -> dict:
    cases = []
    for epoch in LABEL_EPOCHS:
        key = epoch_key(FEDERATION_SECRET, epoch)
        cases.append(
            {
                "label_epoch": epoch,
                "epoch_key": key.hex(),
                "tokens": {name: class_token(key, name).hex() for name in CLASS_NAMES},
            }
        )
    return _document(
        "Label tokens (harmony_mobile/protocol/label_tokens.py): epoch_key = HKDF-SHA256(secret, no salt, "
        "'harmony/label-token/' + label_epoch, 32); token = HMAC-SHA256(epoch_key, UTF-8 class name)[:8]. "
        "`federation_secret` is the hex of the secret's raw bytes: the HKDF input is those bytes, not the "
        "hex text. A label epoch is a string that matches [A-Za-z0-9._-]{1,64} as a whole (no trailing "
        "newline: Python re.fullmatch, Java Matcher.matches, Swift wholeMatch); every `invalid_epochs` "
        "entry must be rejected.",
        federation_secret=FEDERATION_SECRET.hex(),
        invalid_epochs=INVALID_EPOCHS,
        cases=cases,
    )


# --------------------------------------------------------------------------- slot mapping


def _slot_case(name: str, epoch: str, class_names: list[str], slot_sources: list) -> dict:
    """`slot_sources`: per slot a class name (its token in `epoch`), ("epoch", other, class) for a
    token of another epoch, or raw bytes for a token no class name produces."""
    key = epoch_key(FEDERATION_SECRET, epoch)
    table = []
    for source in slot_sources:
        if isinstance(source, bytes):
            table.append(source)
        elif isinstance(source, tuple):
            table.append(class_token(epoch_key(FEDERATION_SECRET, source[1]), source[2]))
        else:
            table.append(class_token(key, source))
    return {
        "name": name,
        "label_epoch": epoch,
        "class_names": class_names,
        "slot_table": [token.hex() for token in table],
        "slot_classes": slot_classes(key, class_names, table),
    }


def slot_mapping_vectors() -> dict:
    digits = [str(i) for i in range(10)]
    cases = [
        _slot_case("every class, first-appearance order", "mnist5k-2026-11", digits, list("3170952846")),
        _slot_case(
            "unknown token, other epoch, class without a slot",
            "e7",
            digits,
            ["4", bytes.fromhex("0123456789abcdef"), ("epoch", "0", "1"), "9"],
        ),
        _slot_case("non-ASCII names", "A.b_c-9", ["cat", "héllo wörld", "😀", "T-shirt/top"], ["😀", "cat"]),
        _slot_case("empty table (no back-end trained yet)", "0", digits, []),
    ]
    return _document(
        "Slot decoding on the phone (harmony_mobile/protocol/label_tokens.py slot_classes): the token of every class name "
        "under epoch_key(federation_secret, label_epoch) is looked up in `slot_table` (hex tokens, slot i at "
        "index i); `slot_classes[i]` is the class of slot i or null when no class name has that token. "
        "A class with no slot appears in no entry.",
        federation_secret=FEDERATION_SECRET.hex(),
        cases=cases,
    )


# --------------------------------------------------------------------------- exit order


def _signed_order(key: bytes, class_names: list[str]) -> list[str]:
    """The WRONG order an implementation comparing signed bytes (Java's byte) would give."""
    signed = {name: [b - 256 if b >= 0x80 else b for b in class_token(key, name)] for name in class_names}
    return sorted(class_names, key=lambda name: (signed[name], name))


def _straddling_names(epoch: str) -> list[str]:
    """Four names whose tokens need unsigned comparison: two share their first byte and differ in the
    second on either side of 0x80, and the other two have first bytes on either side of 0x80."""
    key = epoch_key(FEDERATION_SECRET, epoch)
    names = [f"class-{i:03d}" for i in range(1000)]
    tokens = {name: class_token(key, name) for name in names}
    pair = next(
        (a, b)
        for i, a in enumerate(names)
        for b in names[i + 1 :]
        if tokens[a][0] == tokens[b][0] and (tokens[a][1] >= 0x80) != (tokens[b][1] >= 0x80)
    )
    high = next(n for n in names if n not in pair and tokens[n][0] >= 0x80)
    low = next(n for n in names if n not in pair and tokens[n][0] < 0x80)
    return [pair[0], high, pair[1], low]


def _exit_case(name: str, epoch: str, class_names: list[str]) -> dict:
    key = epoch_key(FEDERATION_SECRET, epoch)
    return {
        "name": name,
        "label_epoch": epoch,
        "class_names": class_names,
        "tokens": [class_token(key, c).hex() for c in class_names],
        "exit_classes": exit_order(key, class_names),
    }


def exit_order_vectors() -> dict:
    digits = [str(i) for i in range(10)]
    straddling = _straddling_names("e7")
    cases = [
        _exit_case("digits", "mnist5k-2026-11", digits),
        _exit_case("digits, another epoch", "e7", digits),
        _exit_case("non-ASCII names", "A.b_c-9", ["cat", "héllo wörld", "😀", "T-shirt/top"]),
        _exit_case("a single class", "0", ["cat"]),
        _exit_case("unsigned byte order (first and second bytes on either side of 0x80)", "e7", straddling),
    ]
    assert cases[0]["exit_classes"] != cases[1]["exit_classes"], "two epochs, two orders"
    for case in cases:
        first_bytes = {bytes.fromhex(t)[0] >= 0x80 for t in case["tokens"]}
        if first_bytes == {True, False}:  # signed comparison would put the >= 0x80 tokens first
            key = epoch_key(FEDERATION_SECRET, case["label_epoch"])
            assert _signed_order(key, case["class_names"]) != case["exit_classes"], case["name"]
    key = epoch_key(FEDERATION_SECRET, "e7")
    tail = [n for n in _signed_order(key, straddling) if n in straddling[::2]]
    assert tail != [n for n in cases[4]["exit_classes"] if n in straddling[::2]], "second byte decides"
    return _document(
        "Exit-head output order (harmony_mobile/protocol/label_tokens.py exit_order): exit heads are trained and shipped in "
        "token order, so output j of an exit head is the class whose token under "
        "epoch_key(federation_secret, label_epoch) is the j-th smallest, comparing the 8 token bytes as "
        "UNSIGNED bytes, lexicographically (ties, which need equal tokens, broken by name). `tokens` are the "
        "class names' tokens in class order (hex); `exit_classes[j]` is the class name of output j. The last "
        "case's order differs from a signed-byte comparison in the first and in the second byte.",
        federation_secret=FEDERATION_SECRET.hex(),
        cases=cases,
    )


# --------------------------------------------------------------------------- exit decisions


EXIT_CASES = [
    # (logits, threshold): chosen away from the threshold boundary, except exact ties that are exact
    # in any precision (two equal logits give exactly 0.5).
    ([2.0, 0.5, -1.0], 0.9),
    ([6.0, 0.5, -1.0], 0.9),
    ([0.0, 0.0], 0.5),
    ([0.0, 0.0], 0.75),
    ([1.0, 3.0, 3.0, -2.0], 0.4),
    ([-5.0, -7.5, -6.0, -4.0, -9.0], 0.6),
    ([10.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0], 0.99),
    ([0.1, 0.2, 0.3, 0.4, 0.5, 0.6, 0.7, 0.8, 0.9, 1.0], 0.2),
    ([100.0, -100.0], 1.0),
    ([1000.0, 999.0, 0.0], 0.7),
    ([-3.25, 12.5, 4.75, 0.0, 2.0, 1.0, -1.0, 7.0, 3.0, 6.5], 0.995),
]


def exit_vectors() -> dict:
    cases = []
    for logits, threshold in EXIT_CASES:
        # Logits are float32 (what a .pte returns); the softmax is evaluated in float64.
        values = torch.from_numpy(np.array([logits], dtype=np.float32)).double()
        confidence = float(exit_confidence(values, "max_softmax")[0])
        cases.append(
            {
                "logits": _floats(np.array(logits)),
                "threshold": threshold,
                "predicted_class": int(values.argmax(dim=1)[0]),
                "confidence": confidence,
                "exit_locally": confidence >= threshold,
            }
        )
    return _document(
        "Early exit (harmony_mobile/algorithms/base.py exit_confidence, rule max_softmax): answer locally when max softmax "
        ">= threshold; predicted_class = argmax (first index on ties). confidence is computed in float64; "
        "compare with a tolerance of 1e-12.",
        cases=cases,
    )


def _slot_gate_case(features, prototypes, own_slots, logits, threshold) -> dict:
    # Features, prototypes and logits are float32 (what a .pte and the shipped prototypes hold);
    # the margin is evaluated in float64.
    features, prototypes = np.asarray(features, np.float32), np.asarray(prototypes, np.float32)
    margin = float(
        slot_margin(
            torch.from_numpy(features).double()[None],
            torch.from_numpy(prototypes).double(),
            torch.tensor(own_slots, dtype=torch.bool),
        )[0]
    )
    return {
        "features": _floats(features),
        "prototypes": [_floats(row) for row in prototypes],
        "own_slots": list(own_slots),
        "logits": _floats(np.asarray(logits)),
        "threshold": threshold,
        "top_output": int(np.argmax(np.asarray(logits, np.float32))),
        # 12 decimals: the last bits of a float64 sum differ between CPUs' vector units, and the
        # committed file must equal a fresh generation on any machine (consumers compare within 1e-12)
        "margin": round(margin, 12),
        "exit_locally": margin >= threshold,
    }


def _unit_rows(generator: np.random.Generator, slots: int, dim: int) -> np.ndarray:
    rows = generator.standard_normal((slots, dim)).astype(np.float32)
    return (rows / np.linalg.norm(rows, axis=1, keepdims=True)).astype(np.float32)


def slot_gate_vectors() -> dict:
    generator = np.random.default_rng(20261205)
    cases = []
    for threshold in (0.1, -0.05, 0.0, 0.3, 0.02, -0.4):
        prototypes = _unit_rows(generator, 5, 6)
        own = [bool(v) for v in generator.permutation([1, 1, 0, 0, 0])]
        features = generator.standard_normal(6) * 3
        cases.append(_slot_gate_case(features, prototypes, own, generator.standard_normal(4), threshold))
    prototypes = _unit_rows(generator, 4, 6)
    prototypes[1] = 0.0  # an own slot without a prototype takes no part
    prototypes[3] = 0.0  # and so does another slot's
    features = prototypes[0] + 0.1
    cases.append(_slot_gate_case(features, prototypes, [True, True, False, False], [1, 3, 3, -2], 0.5))
    no_own = _unit_rows(generator, 3, 6)
    no_own[0] = 0.0  # the phone's only slot has no prototype: its side counts as -1
    cases.append(_slot_gate_case(no_own[1], no_own, [True, False, False], [0, 0], -1.5))
    all_own = _unit_rows(generator, 3, 6)  # no other slot: that side counts as -1
    cases.append(_slot_gate_case(all_own[2] * 7, all_own, [True, True, True], [2, 1], 1.9))
    zero = _unit_rows(generator, 3, 6)  # a zero feature vector: every cosine is 0, the margin 0
    cases.append(_slot_gate_case(np.zeros(6), zero, [True, False, False], [0.5, 0.25], 0.0))
    exact = np.eye(3, 6, dtype=np.float32)  # the margin equals the threshold exactly: exits
    cases.append(_slot_gate_case([1, 0, 0, 0, 0, 0], exact, [True, False, False], [1, 0], 1.0))
    return _document(
        "Slot gate (harmony_mobile/protocol/slot_gate.py slot_margin): features are normalized to unit "
        "length (divided by max(norm, 1e-12)), cosine = dot with each slot's prototype (prototypes ship "
        "unit-norm; an all-zero row is a slot without one and takes no part). own = the largest cosine "
        "over own slots with a prototype, other = the largest over the remaining slots with one; a side "
        "with none, or below -1, counts as -1. margin = own - other, in [-2, 2]; answer locally when "
        "margin >= threshold (and every feature and logit is finite), with the exit head's top output "
        "(argmax of logits, first index on ties). own_slots comes from the decoded slot table: a slot "
        "is the phone's own when the class it names is one the phone holds. Evaluated in float64, the "
        "margin written to 12 decimals (exit_locally is decided before rounding); "
        "compare with a tolerance of 1e-12.",
        cases=cases,
    )


# --------------------------------------------------------------------------- binary encodings


def _tensor_case(name: str, array: np.ndarray) -> dict:
    return {
        "name": name,
        "shape": list(array.shape),
        "values": _floats(array),
        "hmft": encode_tensor(array).hex(),
    }


def _metadata(rows: int, classes: list[str], label_epoch: str, **extra) -> UploadMetadata:
    key = epoch_key(FEDERATION_SECRET, label_epoch)
    return UploadMetadata(
        label_tokens=tuple(class_token(key, c).hex() for c in classes[:rows]),
        split_depths=tuple(1 + i % 3 for i in range(rows)),
        family="mobilenet",
        tier="mid-android",
        model_version="golden-v1",
        **extra,
    )


def _upload_case(name: str, features: np.ndarray, classes: list[str], label_epoch: str, **extra) -> dict:
    metadata = _metadata(features.shape[0], classes, label_epoch, **extra)
    meta = metadata.model_dump(exclude_none=True)
    return {
        "name": name,
        "label_epoch": label_epoch,
        "class_names": classes,
        "metadata": meta,
        "metadata_json": metadata.model_dump_json(exclude_none=True),
        "shape": list(features.shape),
        "values": _floats(features),
        "plaintext": encode_upload(metadata, features).hex(),
    }


def feature_encoding_vectors() -> dict:
    rng = np.random.default_rng(20261129)
    tensors = [
        _tensor_case("documented 1x2", np.array([[1.0, -2.5]], dtype=np.float32)),
        _tensor_case("1-d", np.array([0.0, -0.0, 1.5, 3.4028234663852886e38], dtype=np.float32)),
        _tensor_case("tiny and subnormal", np.array([[1e-45, -1e-38], [65504.0, 0.1]], dtype=np.float32)),
        _tensor_case("6-d", np.arange(12, dtype=np.float32).reshape(1, 2, 1, 3, 2, 1) / 8),
        _tensor_case("interface row", rng.standard_normal((1, 64, 8, 8)).astype(np.float32)),
    ]
    uploads = [
        _upload_case(
            "two toy rows", np.arange(8, dtype=np.float32).reshape(2, 1, 2, 2) / 4, ["3", "7"], "e7"
        ),
        _upload_case(
            "clip and noise recorded",
            rng.standard_normal((3, 2, 2, 2)).astype(np.float32),
            ["cat", "cat", "😀"],
            "mnist5k-2026-11",
            clip_norm=1.0,
            noise_multiplier=0.5,
        ),
        _upload_case(
            "label DP recorded",
            np.full((1, 1, 1, 3), -0.125, dtype=np.float32),
            ["T-shirt/top"],
            "A.b_c-9",
            label_dp_epsilon=2.5,
        ),
        _upload_case(
            "floats in exponent form",
            np.full((1, 1, 1, 2), 0.5, dtype=np.float32),
            ["3"],
            "e7",
            clip_norm=1e-7,
            noise_multiplier=1.5e20,
            label_dp_epsilon=9.99e-6,
        ),
        _upload_case(
            "floats at the bounds of plain notation",
            np.full((1, 1, 1, 2), 0.5, dtype=np.float32),
            ["7"],
            "e7",
            clip_norm=0.00001,
            noise_multiplier=1e15,
            label_dp_epsilon=1e16,
        ),
    ]
    return _document(
        "HMFT feature tensors and HMUP upload plaintexts (harmony_mobile/protocol/wire.py, docs/PROTOCOL.md 4.4 and 5). "
        "Upload label tokens are those of label_tokens.json (same federation secret) for `class_names` in "
        "`label_epoch`; metadata_json is the exact metadata bytes. Its floats are the shortest digits that "
        "read back as the same double, in plain notation with at least one fractional digit when the decimal "
        "exponent e is in -5..15 (`0.00001`, `1000000000000000.0`), otherwise `d[.ddd]e+X` / `d[.ddd]e-X` "
        "without leading zeros in X (`1e-7`, `1.5e+20`, `1e+16`): not Python's repr (`1e-07`).",
        tensors=tensors,
        uploads=uploads,
    )


# --------------------------------------------------------------------------- sealed uploads


def _sealed_case(name: str, plaintext: bytes, device_id: str, label_epoch: str, message_id: str) -> dict:
    server = X25519PrivateKey.from_private_bytes(SERVER_PRIVATE)
    server_public = sealing.public_key_bytes(server)
    ad = sealing.AssociatedData(device_id, label_epoch, uuid.UUID(message_id))
    envelope = sealing.seal(
        server_public, plaintext, ad, ephemeral_private_key=EPHEMERAL_PRIVATE, nonce=NONCE
    )
    assert sealing.open_sealed(server, envelope, ad) == plaintext
    return {
        "name": name,
        "device_id": device_id,
        "label_epoch": label_epoch,
        "message_id": message_id,
        "associated_data": ad.encode().hex(),
        "plaintext": plaintext.hex(),
        "envelope": envelope.hex(),
    }


def sealed_upload_vectors() -> dict:
    server = X25519PrivateKey.from_private_bytes(SERVER_PRIVATE)
    ephemeral = X25519PrivateKey.from_private_bytes(EPHEMERAL_PRIVATE)
    features = (np.arange(64 * 8 * 8, dtype=np.float32).reshape(1, 64, 8, 8) - 2048) / 512
    upload_plaintext = encode_upload(_metadata(1, ["4"], "e7"), features)
    cases = [
        _sealed_case(
            "PROTOCOL.md A.1",
            b"harmony golden plaintext",
            "dev_golden",
            "e7",
            "00112233-4455-6677-8899-aabbccddeeff",
        ),
        _sealed_case("empty plaintext", b"", "d", "0", "ffffffff-ffff-4fff-bfff-ffffffffffff"),
        _sealed_case(
            "full interface upload, non-ASCII device id",
            upload_plaintext,
            "dev_télé-😀",
            "x" * 64,
            "3f2b8c4e-9d1a-4c55-8a0e-61f0b7d2c9aa",
        ),
    ]
    return _document(
        "Sealed uploads (harmony_mobile/protocol/sealing.py, docs/PROTOCOL.md 4.2-4.3) with a FIXED ephemeral key and nonce "
        "(reproducibility only: production draws both fresh per upload). The third plaintext is an HMUP "
        "upload of one (1, 64, 8, 8) row with values (i - 2048) / 512, class '4' in label epoch 'e7'. "
        "Associated data v2: 'harmony/upload-ad/v2' || u16le(len device_id) || device_id UTF-8 || "
        "u8(len label_epoch) || label_epoch ASCII || 16 message id bytes.",
        server_private_key=SERVER_PRIVATE.hex(),
        server_public_key=sealing.public_key_bytes(server).hex(),
        ephemeral_private_key=EPHEMERAL_PRIVATE.hex(),
        ephemeral_public_key=sealing.public_key_bytes(ephemeral).hex(),
        nonce=NONCE.hex(),
        cases=cases,
    )


# --------------------------------------------------------------------------- tier selection

TIER_SETS = {
    # (name, split depth, width, backends); one artifact per backend
    "default": [
        ("entry-android", 1, 1.0, ["xnnpack"]),
        ("mid-android", 2, 1.0, ["xnnpack"]),
        ("mid-ios", 2, 1.0, ["coreml", "xnnpack"]),
        ("flagship", 3, 2.0, ["coreml", "xnnpack"]),
    ],
    "ties and boundaries": [
        ("b-tier", 2, 1.0, ["xnnpack"]),
        ("a-tier", 2, 1.0, ["xnnpack"]),
        ("boundary", 6, 0.5, ["xnnpack"]),  # cost exactly 1.5, the entry budget
        ("coreml-small", 1, 1.0, ["coreml"]),
        ("wide", 1, 2.5, ["coreml", "xnnpack"]),  # cost 6.25: flagship only
    ],
    "core ml only": [("ios-a", 1, 1.0, ["coreml"]), ("ios-b", 3, 1.5, ["coreml"])],
}

DEVICES = [
    # (name, platform, RAM MiB, big cores, NPU, OS version, low-RAM flag)
    ("android entry by RAM", "android", 3071, 4, True, 35, False),
    ("android mid at 3 GiB", "android", 3072, 2, False, 34, False),
    ("android low-RAM flag", "android", 8192, 4, True, 35, True),
    ("android no big core", "android", 8192, 0, True, 35, False),
    ("android API 28", "android", 8192, 4, True, 28, False),
    ("android API 29 mid", "android", 4096, 2, False, 29, False),
    ("android flagship at 5632 MiB", "android", 5632, 2, True, 34, False),
    ("android mid at 5631 MiB", "android", 5631, 2, True, 34, False),
    ("android one big core", "android", 12288, 1, True, 35, False),
    ("iphone mid", "ios", 4096, 2, True, 17, False),
    ("iphone flagship", "ios", 8192, 2, True, 18, False),
    ("iphone without neural engine", "ios", 4096, 2, False, 17, False),
    ("iphone entry", "ios", 2048, 2, True, 12, False),
]


def _tier_option(name: str, depth: int, width: float, backends: list[str]) -> TierOption:
    return TierOption(name, depth, width, tuple(backends), tuple(backends))


def tier_selection_vectors() -> dict:
    cases = []
    for set_name, tiers in TIER_SETS.items():
        options = [_tier_option(*tier) for tier in tiers]
        for name, *fields in DEVICES:
            device = DeviceCapabilities(*fields)
            try:
                selected = select_tier(options, device).name
            except NoRunnableTier:
                selected = None
            cases.append(
                {
                    "tiers": set_name,
                    "device_name": name,
                    "device": {
                        "platform": device.platform,
                        "total_ram_mb": device.total_ram_mb,
                        "big_cores": device.big_cores,
                        "has_npu": device.has_npu,
                        "os_version": device.os_version,
                        "low_ram_device": device.low_ram_device,
                    },
                    "device_class": device_class(device),
                    "selected": selected,
                }
            )
    return _document(
        "Tier selection (harmony_mobile/models/tier_selection.py; Java TierSelector, Swift TierSelector): "
        "`device_class` of the device, and the tier it runs from the named tier set (each tier has one "
        "artifact per listed backend; relative cost = split_depth * width^2). `selected` null: no tier "
        "has an artifact for a backend of the platform (an error on the phone).",
        tier_sets={
            name: [{"name": n, "split_depth": d, "width": w, "backends": b} for n, d, w, b in tiers]
            for name, tiers in TIER_SETS.items()
        },
        cases=cases,
    )


# --------------------------------------------------------------------------- pixel normalization

NORMALIZATION_CASES = [
    # (name, pixel_scale, mean, std, channels, pixels)
    ("mnist", 1 / 255, [0.1307], [0.3081], 1, [0, 1, 127, 128, 254, 255]),
    ("digits", 1 / 255, [0.3053], [0.3247], 1, [0, 17, 85, 170, 255, 3]),
    (
        "cifar rgb planes",
        1 / 255,
        [0.4914, 0.4822, 0.4465],
        [0.2470, 0.2435, 0.2616],
        3,
        [0, 64, 255, 128, 200, 100, 1, 2, 3, 250, 251, 252],
    ),
    ("raw pixel scale", 1.0, [0.0, 10.0], [1.0, 4.0], 2, [1, 2, 3, 30, 40, 50]),
]


def pixel_normalization_vectors() -> dict:
    cases = []
    for name, scale, mean, std, channels, pixels in NORMALIZATION_CASES:
        plane = len(pixels) // channels
        values = [(pixels[i] * scale - mean[i // plane]) / std[i // plane] for i in range(len(pixels))]
        cases.append(
            {
                "name": name,
                "pixel_scale": scale,
                "mean": mean,
                "std": std,
                "channels": channels,
                "pixels": pixels,
                "values": _floats(np.array(values, dtype=np.float64)),
            }
        )
    return _document(
        "Pixel normalization (the manifest tier's `normalization`): 8-bit pixels, channel planes in NCHW "
        "order (no batch); value = (pixel * pixel_scale - mean[c]) / std[c] computed in float64, then "
        "rounded to float32 (harmony-core Normalization.apply and HarmonyKit Normalization.apply match "
        "exactly; Python device.normalize computes in float32 and stays within 2e-6 absolute).",
        cases=cases,
    )


# --------------------------------------------------------------------------- feature clipping

CLIPPING_CASES = [
    # (name, clip norm C, rows of 8 values: uploads have 4096, the rule is the same)
    ("norm above C: scaled to norm C", 1.0, [[3.0, 4.0, 0, 0, 0, 0, 0, 0]]),
    ("norm below C: unchanged", 10.0, [[3.0, 4.0, 0, 0, 0, 0, 0, 0]]),
    ("norm exactly C: unchanged", 5.0, [[3.0, 4.0, 0, 0, 0, 0, 0, 0]]),
    ("all-zero row stays zero", 1.0, [[0, 0, 0, 0, 0, 0, 0, 0]]),
    (
        "each row on its own",
        2.0,
        [[1, 1, 1, 1, 1, 1, 1, 1], [0.5, -0.5, 0.25, 0, 0, 0, 0, -0.25], [-7.5, 1e-3, 2.5, 0, 0, 0, 100, -3]],
    ),
]


def feature_clipping_vectors() -> dict:
    cases = []
    for name, clip, rows in CLIPPING_CASES:
        features = torch.tensor(rows, dtype=torch.float32)
        cases.append(
            {
                "name": name,
                "clip": clip,
                "rows": [_floats(row) for row in features.numpy()],
                "clipped": [_floats(row) for row in clip_rows(features, clip).numpy()],
                "sample_ids": feature_sample_ids(features),
            }
        )
    return _document(
        "Feature clipping (docs/PROTOCOL.md 4.4, when the manifest's run.feature_clip is C): each row z, "
        "all its values at once, becomes z * min(1, C / ||z||) with ||z|| its L2 norm (Python floors "
        "||z|| at 1e-12, so a zero row stays zero); noise, when on, is added after. `clipped` is "
        "harmony_mobile/privacy/feature_noise.py clip_rows in float32 arithmetic; computing in float64 "
        "and rounding to float32 stays within 1e-6 relative. `sample_ids`: the Python runtime's default "
        "label-DP sample id of each row (harmony_mobile/device/label_draws.py), the SHA-256 (hex) of the "
        "row's float32 values, little-endian, before clipping and noise. Rows here have 8 values; an "
        "upload's have 4096 (64 x 8 x 8).",
        cases=cases,
    )


# --------------------------------------------------------------------------- error bodies

# The replay server (tests/test_protocol_replay.py) serves manifest_signature.json's manifest with a
# back-end of that version, label epoch and class names; a device is enrolled with REPLAY_TIER.
REPLAY_VERSION, REPLAY_EPOCH, REPLAY_TIER = "golden-v1", "mnist5k-2026-11", "entry-android"
DEVICE, ADMIN = {"Authorization": "Bearer {{token}}"}, {"Authorization": "Bearer {{admin token}}"}
JSON_TYPE = {"Content-Type": "application/json"}
CONFLICT_ID = "3f2b8c4e-9d1a-4c55-8a0e-61f0b7d2c9aa"
DEPTH_ID = "5d0c3a51-7e2b-4f8e-9c61-0a4b8e2f7d13"
GIVEN_LOADED = "a back-end is loaded; a device is enrolled with tier entry-android"
GIVEN_EMPTY = "no back-end is loaded; a device is enrolled"


def _request(method: str, target: str, headers: dict | None = None, body: dict | None = None) -> dict:
    text = None if body is None else json.dumps(body, separators=(",", ":"), ensure_ascii=False)
    return {"method": method, "target": target, "headers": headers or {}, "body": text}


def _depth_plaintext() -> bytes:
    """One entry-android row extracted at split depth 99 (the tier's depth is 1)."""
    metadata = UploadMetadata(
        label_tokens=(class_token(epoch_key(FEDERATION_SECRET, REPLAY_EPOCH), "4").hex(),),
        split_depths=(99,),
        family="cnn",
        tier=REPLAY_TIER,
        model_version=REPLAY_VERSION,
    )
    return encode_upload(metadata, np.zeros((1, 64, 8, 8), dtype=np.float32))


def _server_errors() -> list[dict]:
    """Bodies the server writes (through its own error_response), each with the request that makes a
    live `harmony serve` write it and the response headers that go with it."""
    wrong_shape = {
        "inputs": [{"name": "features", "shape": [1, 64, 4, 4], "datatype": "FP32", "data": [0] * 1024}]
    }
    upload = {"label_epoch": REPLAY_EPOCH, "message_id": CONFLICT_ID, "envelope": "AAAA"}
    depth = {"label_epoch": REPLAY_EPOCH, "message_id": DEPTH_ID, "envelope": "{{envelope}}"}
    infer = "/v2/models/harmony-backend/infer"
    return [
        dict(name="v2 infer, wrong shape", status=422, path=infer,
             message="input 'features' has shape [1, 64, 4, 4]; expected [N, 64, 8, 8]",
             request=_request("POST", infer, {**DEVICE, **JSON_TYPE}, wrong_shape)),
        dict(name="v2 model metadata before any back-end", status=503, path="/v2/models/harmony-backend",
             message="no back-end is loaded yet", headers={"Retry-After": "1"}, given=GIVEN_EMPTY,
             request=_request("GET", "/v2/models/harmony-backend", DEVICE)),
        dict(name="v2 unknown model, non-ASCII", status=404, path="/v2/models/modèle",
             message="unknown model 'modèle'; this server serves 'harmony-backend'",
             request=_request("GET", "/v2/models/mod%C3%A8le", DEVICE)),
        dict(name="v2 unknown route", status=404, path="/v2/health/nope",
             message="no route '/v2/health/nope'; see docs/PROTOCOL.md",
             request=_request("GET", "/v2/health/nope")),
        dict(name="v2 wrong method", status=405, path=infer,
             message="method GET is not allowed here; allowed: POST", headers={"Allow": "POST"},
             request=_request("GET", infer, DEVICE)),
        dict(name="v1 missing token", status=401, path="/v1/manifest",
             message="missing bearer token: send 'Authorization: Bearer <token>'",
             headers={"WWW-Authenticate": "Bearer"}, request=_request("GET", "/v1/manifest")),
        dict(name="v1 upload conflict", status=409, path="/v1/uploads",
             message=f"message id {CONFLICT_ID} was already used for a different envelope; use a fresh UUID",
             given=GIVEN_LOADED + "; this device stored an upload with this message_id",
             request=_request("POST", "/v1/uploads", {**DEVICE, **JSON_TYPE}, upload)),
        dict(name="v1 upload, split depth outside the tier", status=422, path="/v1/uploads",
             message="split_depths holds 99; tier 'entry-android' extracts every row at split depth 1",
             request=_request("POST", "/v1/uploads", {**DEVICE, **JSON_TYPE}, depth),
             envelope_plaintext=_depth_plaintext().hex()),
        dict(name="v1 body with an unsupported Content-Encoding", status=415, path="/v1/devices",
             message="Content-Encoding 'br' is not supported; use gzip, deflate or none",
             request=_request("POST", "/v1/devices", {**ADMIN, **JSON_TYPE, "Content-Encoding": "br"},
                              {"name": "pixel-8-br"})),
        dict(name="v1 body whose Content-Type is not JSON", status=422, path="/v1/devices",
             message="invalid request: body: Input should be a valid dictionary or instance of EnrolRequest"
                     " (the body is read as JSON: send Content-Type: application/json, not 'text/plain')",
             request=_request("POST", "/v1/devices", {**ADMIN, "Content-Type": "text/plain"},
                              {"name": "pixel-8-text"})),
        dict(name="v1 unknown round", status=404, path="/v1/alignment/rounds/7",
             message="unknown alignment round 7", request=_request("GET", "/v1/alignment/rounds/7", ADMIN)),
        dict(name="v2-like prefix is not v2", status=404, path="/v2x",
             message="no route '/v2x'; see docs/PROTOCOL.md", request=_request("GET", "/v2x")),
    ]  # fmt: skip


# (name, status, body): what a proxy or another server in between may answer; the message is the body.
FOREIGN_ERRORS = [
    ("plain text from a proxy", 502, "Bad Gateway"),
    ("JSON without either key", 500, '{"message": "upstream failed"}'),
    ("JSON array", 400, '["not", "an", "object"]'),
    ("non-string error", 500, '{"error": 5}'),
    ("empty body", 503, ""),
]


def _server_case(case: dict) -> dict:
    body = error_response(case["path"], case["status"], case["message"]).body.decode("utf-8")
    out = {key: case[key] for key in ("name", "status", "path")}
    out.update(body=body, message=case["message"], headers=case.get("headers", {}))
    out.update(given=case.get("given", GIVEN_LOADED), request=case["request"])
    if "envelope_plaintext" in case:
        out["envelope_plaintext"] = case["envelope_plaintext"]
    return out


def error_body_vectors() -> dict:
    cases = [_server_case(case) for case in _server_errors()]
    for name, status, body in FOREIGN_ERRORS:
        cases.append({"name": name, "status": status, "path": None, "body": body, "message": body})
    return _document(
        "Error bodies (server/core/errors.py error_response) -> the message a client shows. The server puts "
        "its one sentence under `error` on /v2 routes (the V2 inference protocol) and under `detail` "
        "everywhere else; a client reads a string `error`, else a string `detail`, else shows the body "
        "text itself (cases with path null: what a proxy in between may send). Bodies are UTF-8. "
        "Every server case (path not null) is the exact answer of a live `harmony serve` "
        "(tests/test_protocol_replay.py replays it): `request` is what to send (`target` as it goes on "
        "the request line; `body` UTF-8 text or null), `given` the server's state, `headers` response "
        "headers that come with it. In requests, {{token}} is the enrolled device's bearer token, "
        "{{admin token}} the admin token, and {{envelope}} the base64 of `envelope_plaintext` sealed "
        "(docs/PROTOCOL.md 4.2) to the server's key for that device, the body's label_epoch and "
        "message_id. The server serves manifest_signature.json's manifest (model version golden-v1, "
        "label epoch mnist5k-2026-11); Retry-After is the server's --retry-after-seconds (1 here).",
        cases=cases,
    )


# --------------------------------------------------------------------------- files


# Only lists json.dumps broke over lines: a "[" followed by a newline never occurs inside a JSON string.
_NUMBER_LIST = re.compile(r"\[\n\s*(-?[0-9][-+.0-9eE]*(?:,\n\s*-?[0-9][-+.0-9eE]*)*)\n\s*\]")


def _dumps(document: dict) -> str:
    """Indented JSON with every list of numbers on one line (keeps 4096-value tensors readable)."""
    text = json.dumps(document, indent=2, ensure_ascii=False)
    return (
        _NUMBER_LIST.sub(lambda m: "[" + ", ".join(v.strip() for v in m.group(1).split(",")) + "]", text)
        + "\n"
    )


def render() -> dict[str, str]:
    """File name -> exact file text."""
    documents = {
        "manifest_signature.json": manifest_vectors(),
        "label_tokens.json": label_token_vectors(),
        "slot_mapping.json": slot_mapping_vectors(),
        "exit_order.json": exit_order_vectors(),
        "exit_decisions.json": exit_vectors(),
        "slot_gate_decisions.json": slot_gate_vectors(),
        "feature_encoding.json": feature_encoding_vectors(),
        "sealed_upload.json": sealed_upload_vectors(),
        "tier_selection.json": tier_selection_vectors(),
        "pixel_normalization.json": pixel_normalization_vectors(),
        "feature_clipping.json": feature_clipping_vectors(),
        "error_bodies.json": error_body_vectors(),
    }
    return {name: _dumps(doc) for name, doc in documents.items()}


def stale_files(directory: Path = VECTORS_DIR) -> list[str]:
    return [
        name
        for name, text in render().items()
        if not (directory / name).is_file() or (directory / name).read_text(encoding="utf-8") != text
    ]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--check", action="store_true", help="only report stale files")
    args = parser.parse_args(argv)
    if args.check:
        stale = stale_files()
        for name in stale:
            print(f"stale: tests/vectors/{name}", file=sys.stderr)
        return 1 if stale else 0
    for name, text in render().items():
        (VECTORS_DIR / name).write_text(text, encoding="utf-8")
        print(f"wrote tests/vectors/{name}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
