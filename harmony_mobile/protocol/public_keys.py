"""The signing public keys an export ships and a phone pins, in their file formats.

    signing_key.pub       base64 (standard alphabet, padded, no newline) of the raw 32-byte Ed25519 key
    signing_key_p256.pub  base64 (no newline) of the P-256 key's X.509 SubjectPublicKeyInfo DER

The exporter (export/keys.py) and the phone runtime (device/manifest.py) both decode through here,
so what one writes the other reads. Errors are ValueErrors that say what is wrong; each side wraps
them in its own error type and names the key's source.
"""

from __future__ import annotations

import base64

from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PublicKey

ED25519_PUBLIC_KEY_BYTES = 32


def _ascii(text: bytes | str) -> bytes:
    # a non-ASCII character becomes "?", which strict base64 then refuses with a clear message
    return text.encode("ascii", errors="replace") if isinstance(text, str) else text


def decode_base64_of_size(text: bytes | str, size: int) -> bytes:
    """Strict base64 (surrounding whitespace tolerated) of exactly `size` bytes, else a ValueError
    that says which of the two it is not."""
    try:
        raw = base64.b64decode(_ascii(text).strip(), validate=True)
    except ValueError as error:
        raise ValueError(f"not base64: {error}") from None
    if len(raw) != size:
        raise ValueError(f"must hold {size} raw bytes (base64), holds {len(raw)} bytes")
    return raw


def decode_ed25519_public_key(text: bytes | str) -> Ed25519PublicKey:
    """The content of a `signing_key.pub` file."""
    return Ed25519PublicKey.from_public_bytes(decode_base64_of_size(text, ED25519_PUBLIC_KEY_BYTES))


def decode_p256_public_key(text: bytes | str) -> ec.EllipticCurvePublicKey:
    """The content of a `signing_key_p256.pub` file; a key on another curve is refused."""
    try:
        key = serialization.load_der_public_key(base64.b64decode(_ascii(text).strip(), validate=True))
    except ValueError as error:
        raise ValueError(f"is not base64 of an X.509 public key: {error}") from None
    if not isinstance(key, ec.EllipticCurvePublicKey) or key.curve.name != "secp256r1":
        raise ValueError("is not a P-256 public key")
    return key
