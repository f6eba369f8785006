"""Sealed uploads: round trip, tamper detection of every AD field and every envelope byte, wrong key,
and the golden vector that the Java and Swift implementations check against (docs/PROTOCOL.md)."""

import uuid
from pathlib import Path

import pytest
from cryptography.hazmat.primitives.asymmetric.x25519 import X25519PrivateKey

from harmony_mobile.protocol.sealing import (
    HEADER_BYTES,
    TAG_BYTES,
    AssociatedData,
    SealError,
    generate_private_key,
    open_sealed,
    public_key_bytes,
    seal,
)

PROTOCOL_DOC = Path(__file__).resolve().parents[1] / "docs" / "PROTOCOL.md"

# Golden vector (also printed in docs/PROTOCOL.md, appendix A).
GOLDEN = {
    "server_private_key": bytes(range(1, 33)),
    "ephemeral_private_key": bytes(range(101, 133)),
    "nonce": bytes(range(201, 213)),
    "device_id": "dev_golden",
    "label_epoch": "e7",
    "message_id": uuid.UUID("00112233-4455-6677-8899-aabbccddeeff"),
    "plaintext": b"harmony golden plaintext",
}


def golden_ad() -> AssociatedData:
    return AssociatedData(GOLDEN["device_id"], GOLDEN["label_epoch"], GOLDEN["message_id"])


def golden_envelope() -> bytes:
    server = X25519PrivateKey.from_private_bytes(GOLDEN["server_private_key"])
    return seal(
        public_key_bytes(server),
        GOLDEN["plaintext"],
        golden_ad(),
        ephemeral_private_key=GOLDEN["ephemeral_private_key"],
        nonce=GOLDEN["nonce"],
    )


GOLDEN_SERVER_PUBLIC_HEX = "07a37cbc142093c8b755dc1b10e86cb426374ad16aa853ed0bdfc0b2b86d1c7c"
GOLDEN_AD_HEX = (
    "6861726d6f6e792f75706c6f61642d61642f76320a006465765f676f6c64656e02653700112233445566778899aabbccddeeff"
)


@pytest.fixture(scope="module")
def server_key():
    return generate_private_key()


@pytest.fixture(scope="module")
def ad():
    return AssociatedData("dev_abc", "mnist-e3", uuid.uuid4())


def test_round_trip(server_key, ad):
    plaintext = b"features and tokens" * 50
    envelope = seal(public_key_bytes(server_key), plaintext, ad)
    assert len(envelope) == HEADER_BYTES + len(plaintext) + TAG_BYTES
    assert open_sealed(server_key, envelope, ad) == plaintext


def test_every_envelope_is_fresh(server_key, ad):
    """A fresh ephemeral key and nonce per call: equal plaintexts give unrelated envelopes."""
    first = seal(public_key_bytes(server_key), b"same", ad)
    second = seal(public_key_bytes(server_key), b"same", ad)
    assert first != second
    assert first[5:49] != second[5:49]


@pytest.mark.parametrize(
    "other",
    [
        lambda ad: AssociatedData(ad.device_id + "x", ad.label_epoch, ad.message_id),
        lambda ad: AssociatedData(ad.device_id, ad.label_epoch + "4", ad.message_id),
        lambda ad: AssociatedData(ad.device_id, ad.label_epoch, uuid.uuid4()),
    ],
    ids=["device_id", "label_epoch", "message_id"],
)
def test_every_associated_data_field_is_bound(server_key, ad, other):
    envelope = seal(public_key_bytes(server_key), b"payload", ad)
    with pytest.raises(SealError, match="failed authentication"):
        open_sealed(server_key, envelope, other(ad))


def test_every_envelope_byte_is_authenticated(server_key, ad):
    envelope = seal(public_key_bytes(server_key), b"0123456789abcdef", ad)
    for index in range(len(envelope)):
        tampered = bytearray(envelope)
        tampered[index] ^= 0x01
        with pytest.raises(SealError):
            open_sealed(server_key, bytes(tampered), ad)


def test_truncated_and_extended_envelopes_are_rejected(server_key, ad):
    envelope = seal(public_key_bytes(server_key), b"payload", ad)
    with pytest.raises(SealError, match="shorter than the minimum"):
        open_sealed(server_key, envelope[: HEADER_BYTES + TAG_BYTES - 1], ad)
    with pytest.raises(SealError, match="failed authentication"):
        open_sealed(server_key, envelope[:-1], ad)
    with pytest.raises(SealError, match="failed authentication"):
        open_sealed(server_key, envelope + b"\x00", ad)


def test_header_errors_name_the_field(server_key, ad):
    envelope = bytearray(seal(public_key_bytes(server_key), b"payload", ad))
    bad_magic = b"XXXX" + bytes(envelope[4:])
    with pytest.raises(SealError, match="magic"):
        open_sealed(server_key, bad_magic, ad)
    envelope[4] = 2
    with pytest.raises(SealError, match="version 2 is not supported"):
        open_sealed(server_key, bytes(envelope), ad)


def test_low_order_ephemeral_key_is_rejected(server_key, ad):
    envelope = bytearray(seal(public_key_bytes(server_key), b"payload", ad))
    envelope[5:37] = bytes(32)  # the all-zero point gives an all-zero shared secret
    with pytest.raises(SealError):
        open_sealed(server_key, bytes(envelope), ad)


def test_wrong_server_key_fails(server_key, ad):
    envelope = seal(public_key_bytes(server_key), b"payload", ad)
    with pytest.raises(SealError, match="failed authentication"):
        open_sealed(generate_private_key(), envelope, ad)


def test_associated_data_validation():
    with pytest.raises(ValueError, match="device id"):
        AssociatedData("", "e0", uuid.uuid4())
    for epoch in ("", "x" * 65, "e 1", "é", 7):
        with pytest.raises(ValueError, match="label epoch"):
            AssociatedData("dev", epoch, uuid.uuid4())
    with pytest.raises(TypeError):
        AssociatedData("dev", "e0", "not-a-uuid")


def test_associated_data_encoding_is_the_documented_one():
    assert golden_ad().encode().hex() == GOLDEN_AD_HEX


def test_golden_vector_is_deterministic_and_documented():
    envelope = golden_envelope()
    assert envelope == golden_envelope()
    server = X25519PrivateKey.from_private_bytes(GOLDEN["server_private_key"])
    assert public_key_bytes(server).hex() == GOLDEN_SERVER_PUBLIC_HEX
    assert open_sealed(server, envelope, golden_ad()) == GOLDEN["plaintext"]
    # The apps implement sealing from the document alone: its vector must be this code's output.
    doc = "".join(PROTOCOL_DOC.read_text().split())
    for value in (GOLDEN_SERVER_PUBLIC_HEX, GOLDEN_AD_HEX, envelope.hex()):
        assert value in doc
