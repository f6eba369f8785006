"""The binary bodies phones send: the HMFT feature tensor and the HMUP upload plaintext."""

import json

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis.extra import numpy as hnp

from harmony_mobile.protocol.messages import FeatureUpload
from harmony_mobile.protocol.wire import (
    UploadMetadata,
    WireFormatError,
    decode_tensor,
    decode_upload,
    encode_tensor,
    encode_upload,
)


def metadata(rows: int, **changes) -> UploadMetadata:
    fields = dict(
        label_tokens=tuple(f"{i:016x}" for i in range(rows)),
        split_depths=tuple(1 + i % 3 for i in range(rows)),
        family="cnn",
        tier="entry-android",
        model_version="v1",
    )
    fields.update(changes)
    return UploadMetadata(**fields)


def test_tensor_layout_is_the_documented_one():
    body = encode_tensor(np.array([[1.0, -2.5]], dtype=np.float32))
    assert body.hex() == "484d46540101020001000000020000000000803f000020c0"


@settings(max_examples=60, deadline=None)
@given(hnp.arrays(np.float32, hnp.array_shapes(min_dims=1, max_dims=6, min_side=1, max_side=4)))
def test_tensor_round_trip(array):
    decoded = decode_tensor(encode_tensor(array))
    assert decoded.dtype == np.float32 and decoded.shape == array.shape
    np.testing.assert_array_equal(decoded, array)


def header(magic=b"HMFT", version=1, dtype=1, ndim=2, reserved=0, dims=(1, 2)) -> bytes:
    return magic + bytes([version, dtype, ndim, reserved]) + b"".join(d.to_bytes(4, "little") for d in dims)


@pytest.mark.parametrize(
    "body,message",
    [
        (b"HMF", "shorter than the 8-byte fixed header"),
        (header(magic=b"NOPE") + bytes(8), "magic"),
        (header(version=2) + bytes(8), "version 2 is not supported"),
        (header(dtype=2) + bytes(8), "dtype code 2 is not supported"),
        (header(ndim=0, dims=()), "ndim 0 is out of range"),
        (header(ndim=7, dims=(1,) * 7) + bytes(4), "ndim 7 is out of range"),
        (header(reserved=1) + bytes(8), "reserved byte 7 must be 0"),
        (header(ndim=3, dims=(1, 2)), "shorter than its 20-byte header"),
        (header(dims=(0, 2)), "contain a zero"),
        (header() + bytes(7), "promises dims \\[1, 2\\] = 8 data bytes, body has 7"),
        (header() + bytes(9), "body has 9"),
    ],
)
def test_tensor_header_errors_say_what_is_wrong(body, message):
    with pytest.raises(WireFormatError, match=message):
        decode_tensor(body)


def test_encode_rejects_other_dtypes():
    with pytest.raises(WireFormatError, match="only float32"):
        encode_tensor(np.zeros((2, 2), dtype=np.float64))


def test_upload_round_trip_gives_a_feature_upload():
    features = np.random.default_rng(0).standard_normal((3, 64, 8, 8)).astype(np.float32)
    meta = metadata(3, clip_norm=4.0, noise_multiplier=0.5)
    payload = decode_upload(encode_upload(meta, features))
    assert payload.metadata == meta
    np.testing.assert_array_equal(payload.features, features)
    upload = payload.to_feature_upload("dev_1", "e-5")
    assert isinstance(upload, FeatureUpload)
    assert upload.label_tokens[1] == bytes.fromhex("0000000000000001")
    assert upload.split_depths == (1, 2, 3) and upload.label_epoch == "e-5" and upload.tier == "entry-android"


def raw_upload(meta_json: bytes, tensor: bytes, magic=b"HMUP", version=1) -> bytes:
    return magic + bytes([version]) + len(meta_json).to_bytes(4, "little") + meta_json + tensor


def good_meta_json(rows=1, **changes) -> bytes:
    return metadata(rows, **changes).model_dump_json().encode()


TENSOR_1 = encode_tensor(np.zeros((1, 64, 8, 8), dtype=np.float32))


@pytest.mark.parametrize(
    "plaintext,message",
    [
        (b"HMUP", "shorter than its 9-byte header"),
        (raw_upload(good_meta_json(), TENSOR_1, magic=b"XXXX"), "magic"),
        (raw_upload(good_meta_json(), TENSOR_1, version=9), "version 9"),
        (b"HMUP\x01" + (10**6).to_bytes(4, "little") + b"{}", "exceeds the payload"),
        (raw_upload(b"\xff\xfe", TENSOR_1), "not UTF-8 JSON"),
        (raw_upload(b"[1, 2", TENSOR_1), "not UTF-8 JSON"),
        (raw_upload(json.dumps({"label": [3]}).encode(), TENSOR_1), "metadata is invalid"),
        (
            raw_upload(json.dumps({**json.loads(good_meta_json()), "labels": [3]}).encode(), TENSOR_1),
            "labels: Extra inputs are not permitted",
        ),
        (
            raw_upload(
                json.dumps({**json.loads(good_meta_json()), "label_tokens": ["ABCDEF0123456789"]}).encode(),
                TENSOR_1,
            ),
            "lowercase hex",
        ),
        (raw_upload(good_meta_json(), TENSOR_1[:-1]), "binary tensor header promises"),
        (raw_upload(good_meta_json(), encode_tensor(np.zeros((2, 64, 8, 8), np.float32))), "2 feature rows"),
        (raw_upload(good_meta_json(), encode_tensor(np.zeros((1, 64), np.float32))), "must be 4-d"),
    ],
)
def test_upload_errors_say_what_is_wrong(plaintext, message):
    with pytest.raises(WireFormatError, match=message):
        decode_upload(plaintext)


def test_upload_metadata_validation():
    with pytest.raises(ValueError, match="split depths"):
        metadata(1, split_depths=(0,))
    with pytest.raises(ValueError):
        metadata(1, clip_norm=-1.0)
    with pytest.raises(WireFormatError, match="1 feature rows but 2 tokens"):
        encode_upload(metadata(2), np.zeros((1, 64, 8, 8), np.float32))


def test_upload_vector_is_documented():
    """docs/PROTOCOL.md appendix A.2 is this code's output (the apps implement from the document)."""
    from pathlib import Path

    meta = UploadMetadata(
        label_tokens=("0123456789abcdef", "fedcba9876543210"),
        split_depths=(1, 2),
        family="cnn",
        tier="entry-android",
        model_version="v1",
    )
    features = np.arange(8, dtype=np.float32).reshape(2, 1, 2, 2) / 4
    plaintext = encode_upload(meta, features)
    doc = "".join((Path(__file__).resolve().parents[1] / "docs" / "PROTOCOL.md").read_text().split())
    assert plaintext.hex() in doc
    assert encode_tensor(np.array([[1.0, -2.5]], dtype=np.float32)).hex() in doc
