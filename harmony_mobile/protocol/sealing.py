"""Sealed uploads: encrypt a payload to the server's X25519 public key (docs/PROTOCOL.md, section 4).

    shared  = X25519(ephemeral_private, server_public)
    key     = HKDF-SHA256(ikm=shared, salt=ephemeral_public || server_public,
                          info="harmony/upload-seal/v1", length=32)
    sealed  = AES-256-GCM(key, nonce, plaintext, associated_data=AD)
    AD      = "harmony/upload-ad/v2" || u16le(len(device_id)) || device_id (UTF-8)
              || u8(len(label_epoch)) || label_epoch (ASCII) || message_id (16 raw UUID bytes)

    envelope = "HMSE" || 0x01 || ephemeral_public (32) || nonce (12) || ciphertext || tag (16)

A fresh ephemeral key per upload gives forward secrecy for the device (it keeps no long-term
secret) and binds every envelope to one key; the associated data binds it to the authenticated
device, the label epoch its tokens were computed in and the message id, so an envelope replayed
under another device, epoch or message id fails to open. `seal` accepts a fixed ephemeral key and nonce only so that golden
vectors (tests/vectors) are reproducible across Python, Java and Swift; production callers pass
neither.
"""

from __future__ import annotations

import os
import uuid
from dataclasses import dataclass

from cryptography.exceptions import InvalidTag
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric.x25519 import X25519PrivateKey, X25519PublicKey
from cryptography.hazmat.primitives.ciphers.aead import AESGCM
from cryptography.hazmat.primitives.kdf.hkdf import HKDF

from harmony_mobile.protocol.label_tokens import check_label_epoch

ENVELOPE_MAGIC = b"HMSE"
ENVELOPE_VERSION = 1
KEY_BYTES = 32
NONCE_BYTES = 12
TAG_BYTES = 16
HEADER_BYTES = len(ENVELOPE_MAGIC) + 1 + KEY_BYTES + NONCE_BYTES  # 49
HKDF_INFO = b"harmony/upload-seal/v1"
AD_LABEL = b"harmony/upload-ad/v2"
MAX_DEVICE_ID_BYTES = 255


class SealError(ValueError):
    """An envelope is malformed, tampered with, bound to other metadata, or sealed to another key."""


@dataclass(frozen=True)
class AssociatedData:
    """What an envelope is bound to: checked by AES-GCM, never encrypted."""

    device_id: str
    label_epoch: str
    message_id: uuid.UUID

    def __post_init__(self) -> None:
        device = self.device_id.encode("utf-8")
        if not 1 <= len(device) <= MAX_DEVICE_ID_BYTES:
            raise ValueError(f"device id must be 1..{MAX_DEVICE_ID_BYTES} UTF-8 bytes, got {len(device)}")
        check_label_epoch(self.label_epoch)
        if not isinstance(self.message_id, uuid.UUID):
            raise TypeError("message_id must be a uuid.UUID")

    def encode(self) -> bytes:
        device = self.device_id.encode("utf-8")
        return (
            AD_LABEL
            + len(device).to_bytes(2, "little")
            + device
            + len(self.label_epoch).to_bytes(1, "little")
            + self.label_epoch.encode("ascii")
            + self.message_id.bytes
        )


def generate_private_key() -> X25519PrivateKey:
    return X25519PrivateKey.generate()


def public_key_bytes(key: X25519PrivateKey | X25519PublicKey) -> bytes:
    """The raw 32-byte X25519 public key (what enrolment hands to devices, base64-encoded)."""
    public = key.public_key() if isinstance(key, X25519PrivateKey) else key
    return public.public_bytes(serialization.Encoding.Raw, serialization.PublicFormat.Raw)


def private_key_bytes(key: X25519PrivateKey) -> bytes:
    return key.private_bytes(
        serialization.Encoding.Raw, serialization.PrivateFormat.Raw, serialization.NoEncryption()
    )


def _derive_key(shared: bytes, ephemeral_public: bytes, server_public: bytes) -> bytes:
    hkdf = HKDF(
        algorithm=hashes.SHA256(), length=KEY_BYTES, salt=ephemeral_public + server_public, info=HKDF_INFO
    )
    return hkdf.derive(shared)


def seal(
    server_public_key: bytes | X25519PublicKey,
    plaintext: bytes,
    associated_data: AssociatedData,
    *,
    ephemeral_private_key: bytes | None = None,
    nonce: bytes | None = None,
) -> bytes:
    """Encrypt `plaintext` to the server key; returns the envelope bytes."""
    if isinstance(server_public_key, bytes):
        if len(server_public_key) != KEY_BYTES:
            raise ValueError(f"an X25519 public key is {KEY_BYTES} bytes, got {len(server_public_key)}")
        server_public_key = X25519PublicKey.from_public_bytes(server_public_key)
    ephemeral = (
        X25519PrivateKey.from_private_bytes(ephemeral_private_key)
        if ephemeral_private_key is not None
        else X25519PrivateKey.generate()
    )
    nonce = nonce if nonce is not None else os.urandom(NONCE_BYTES)
    if len(nonce) != NONCE_BYTES:
        raise ValueError(f"the AES-GCM nonce is {NONCE_BYTES} bytes, got {len(nonce)}")
    ephemeral_public = public_key_bytes(ephemeral)
    server_public = public_key_bytes(server_public_key)
    key = _derive_key(ephemeral.exchange(server_public_key), ephemeral_public, server_public)
    ciphertext = AESGCM(key).encrypt(nonce, plaintext, associated_data.encode())
    return ENVELOPE_MAGIC + bytes([ENVELOPE_VERSION]) + ephemeral_public + nonce + ciphertext


def open_sealed(
    server_private_key: X25519PrivateKey, envelope: bytes, associated_data: AssociatedData
) -> bytes:
    """Decrypt an envelope; raises SealError with the reason if it cannot be authenticated."""
    if len(envelope) < HEADER_BYTES + TAG_BYTES:
        raise SealError(
            f"envelope is {len(envelope)} bytes, shorter than the minimum {HEADER_BYTES + TAG_BYTES}"
        )
    if envelope[:4] != ENVELOPE_MAGIC:
        raise SealError(f"envelope magic is {envelope[:4]!r}, expected {ENVELOPE_MAGIC!r}")
    if envelope[4] != ENVELOPE_VERSION:
        raise SealError(f"envelope version {envelope[4]} is not supported (expected {ENVELOPE_VERSION})")
    ephemeral_public = envelope[5 : 5 + KEY_BYTES]
    nonce = envelope[5 + KEY_BYTES : HEADER_BYTES]
    ciphertext = envelope[HEADER_BYTES:]
    try:
        shared = server_private_key.exchange(X25519PublicKey.from_public_bytes(ephemeral_public))
    except ValueError as error:  # low-order point: the shared secret would be all zeros
        raise SealError(f"envelope ephemeral key is invalid: {error}") from None
    key = _derive_key(shared, ephemeral_public, public_key_bytes(server_private_key))
    try:
        return AESGCM(key).decrypt(nonce, ciphertext, associated_data.encode())
    except InvalidTag:
        # One message for every cause (tampered bytes, other device/epoch/message id, other key):
        # telling them apart would need the key the attacker lacks anyway.
        raise SealError(
            "envelope failed authentication (tampered, sealed to another server key, "
            "or bound to another device id / label epoch / message id)"
        ) from None
