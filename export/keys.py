"""Signing keys for export manifests: Ed25519, and ECDSA P-256 beside it.

Key directory layout (default `~/.config/harmony-mobile/keys`, or `harmony export --key-dir DIR`):

    signing_key         the private key, PKCS#8 PEM, unencrypted, mode 0600 (directory 0700)
    signing_key.pub     the public key: base64 (standard alphabet, with padding, no newline)
                        of the raw 32-byte Ed25519 public key
    signing_key_p256      the ECDSA P-256 private key, PKCS#8 PEM, unencrypted, mode 0600
    signing_key_p256.pub  base64 (no newline) of its X.509 SubjectPublicKeyInfo DER (91 bytes)

Why two algorithms: Android's platform JCA has verified ECDSA P-256 (`SHA256withECDSA`) on every
API level, but Ed25519 only since its 2025 Conscrypt update, so many Android 13-15 phones cannot
check an Ed25519 signature without shipping a crypto library; CryptoKit verifies both. Each app
verifies the signature its platform supports against the key it pins.

The same `signing_key.pub` file is copied into every export directory. The phone apps pin the
public key (they ship it, or compare the copy's bytes against a pinned value), then verify
`manifest.sig` over the exact bytes of `manifest.json` (see manifest.py).

A key is generated on first use. A private key file readable by group or others is refused, as
ssh does, because anyone who can read it can sign models the phones will install.
"""

from __future__ import annotations

import base64
import os
import stat
from pathlib import Path

from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey, Ed25519PublicKey

from harmony_mobile.protocol.public_keys import decode_ed25519_public_key
from harmony_mobile.protocol.public_keys import decode_p256_public_key as protocol_decode_p256_public_key

DEFAULT_KEY_DIR = Path("~/.config/harmony-mobile/keys")
PRIVATE_KEY_FILE = "signing_key"
PUBLIC_KEY_FILE = "signing_key.pub"
P256_PRIVATE_KEY_FILE = "signing_key_p256"
P256_PUBLIC_KEY_FILE = "signing_key_p256.pub"
P256_SPKI_BYTES = 91


class SigningKeyError(ValueError):
    """A signing or public key file is missing, malformed or unsafe."""


def default_key_dir() -> Path:
    return DEFAULT_KEY_DIR.expanduser()


def public_key_bytes(public_key: Ed25519PublicKey) -> bytes:
    """The raw 32-byte public key."""
    return public_key.public_bytes(serialization.Encoding.Raw, serialization.PublicFormat.Raw)


def encode_public_key(public_key: Ed25519PublicKey) -> bytes:
    """The exact content of a `signing_key.pub` file: base64 of the raw 32 bytes, no newline."""
    return base64.b64encode(public_key_bytes(public_key))


def decode_public_key(text: bytes | str, source: str = "public key") -> Ed25519PublicKey:
    """Parse the content of a `signing_key.pub` file."""
    try:
        return decode_ed25519_public_key(text)
    except ValueError as error:
        raise SigningKeyError(f"{source}: {error}") from None


def load_public_key(path: str | Path) -> Ed25519PublicKey:
    path = Path(path)
    if not path.is_file():
        raise SigningKeyError(f"public key file not found: {path}")
    return decode_public_key(path.read_bytes(), str(path))


def key_fingerprint(public_key: Ed25519PublicKey) -> str:
    """sha256 hex of the raw public key: a short way to say which key signed a manifest."""
    import hashlib

    return hashlib.sha256(public_key_bytes(public_key)).hexdigest()


def write_public_key(path: str | Path, public_key: Ed25519PublicKey) -> None:
    Path(path).write_bytes(encode_public_key(public_key))


def load_private_key(path: str | Path, kind: type = Ed25519PrivateKey):
    """Read a PKCS#8 PEM private key of type `kind`; refuse one that group or others can read."""
    path = Path(path)
    if not path.is_file():
        raise SigningKeyError(f"signing key file not found: {path}")
    mode = stat.S_IMODE(path.stat().st_mode)
    if mode & 0o077:
        raise SigningKeyError(
            f"signing key {path} is readable by others (mode {mode:04o}); run `chmod 600 {path}`"
        )
    try:
        key = serialization.load_pem_private_key(path.read_bytes(), password=None)
    except (ValueError, TypeError) as error:
        raise SigningKeyError(f"signing key {path} is not an unencrypted PEM private key: {error}") from None
    if kind is ec.EllipticCurvePrivateKey and isinstance(key, kind) and key.curve.name != "secp256r1":
        raise SigningKeyError(f"signing key {path} is on curve {key.curve.name}, not P-256")
    if not isinstance(key, kind):
        wanted = "an Ed25519" if kind is Ed25519PrivateKey else "a P-256"
        raise SigningKeyError(f"signing key {path} is not {wanted} key ({type(key).__name__})")
    return key


def p256_public_key_der(public_key: ec.EllipticCurvePublicKey) -> bytes:
    """X.509 SubjectPublicKeyInfo DER: what Java's X509EncodedKeySpec and CryptoKit's
    P256.Signing.PublicKey(derRepresentation:) read."""
    return public_key.public_bytes(
        serialization.Encoding.DER, serialization.PublicFormat.SubjectPublicKeyInfo
    )


def encode_p256_public_key(public_key: ec.EllipticCurvePublicKey) -> bytes:
    """The exact content of a `signing_key_p256.pub` file: base64 of the SPKI DER, no newline."""
    return base64.b64encode(p256_public_key_der(public_key))


def decode_p256_public_key(text: bytes | str, source: str = "P-256 public key") -> ec.EllipticCurvePublicKey:
    try:
        return protocol_decode_p256_public_key(text)
    except ValueError as error:
        raise SigningKeyError(f"{source} {error}") from None


def load_p256_public_key(path: str | Path) -> ec.EllipticCurvePublicKey:
    path = Path(path)
    if not path.is_file():
        raise SigningKeyError(f"public key file not found: {path}")
    return decode_p256_public_key(path.read_bytes(), str(path))


def p256_key_fingerprint(public_key: ec.EllipticCurvePublicKey) -> str:
    """sha256 hex of the SPKI DER."""
    import hashlib

    return hashlib.sha256(p256_public_key_der(public_key)).hexdigest()


def _write_private(path: Path, key) -> None:
    pem = key.private_bytes(
        serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
    )
    # O_EXCL: never overwrite a key; 0600 from the start, so the key is never briefly world-readable.
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    try:
        os.write(fd, pem)
    finally:
        os.close(fd)
    os.chmod(path, 0o600)  # in case a umask stripped bits we asked for (never adds any)


def _load_or_create(key_dir: Path, private_file: str, kind: type, generate):
    private_path = key_dir / private_file
    if private_path.exists():
        return load_private_key(private_path, kind), False
    try:
        key_dir.mkdir(parents=True, exist_ok=True, mode=0o700)
    except OSError as error:
        raise SigningKeyError(f"cannot create key directory {key_dir}: {error}") from None
    key = generate()
    try:
        _write_private(private_path, key)
    except OSError as error:
        raise SigningKeyError(f"cannot write signing key {private_path}: {error}") from None
    return key, True


def load_or_create_signing_key(key_dir: str | Path | None = None) -> tuple[Ed25519PrivateKey, bool]:
    """The Ed25519 signing key in `key_dir` (default ~/.config/harmony-mobile/keys); generated on
    first use, together with the directory's P-256 key (see load_or_create_p256_signing_key).

    Returns (key, created). Writes `signing_key` (0600) and `signing_key.pub`; a `signing_key.pub`
    that does not match the private key is an error rather than silently replaced.
    """
    key_dir = Path(key_dir).expanduser() if key_dir is not None else default_key_dir()
    key, created = _load_or_create(key_dir, PRIVATE_KEY_FILE, Ed25519PrivateKey, Ed25519PrivateKey.generate)
    public_path = key_dir / PUBLIC_KEY_FILE
    if public_path.exists():
        if load_public_key(public_path) != key.public_key():
            raise SigningKeyError(
                f"{public_path} does not belong to the private key {key_dir / PRIVATE_KEY_FILE}"
            )
    else:
        write_public_key(public_path, key.public_key())
    load_or_create_p256_signing_key(key_dir)
    return key, created


def load_or_create_p256_signing_key(
    key_dir: str | Path | None = None,
) -> tuple[ec.EllipticCurvePrivateKey, bool]:
    """The ECDSA P-256 signing key in `key_dir`, generated on first use (also in a directory that
    so far held only an Ed25519 key). Returns (key, created)."""
    key_dir = Path(key_dir).expanduser() if key_dir is not None else default_key_dir()
    key, created = _load_or_create(
        key_dir,
        P256_PRIVATE_KEY_FILE,
        ec.EllipticCurvePrivateKey,
        lambda: ec.generate_private_key(ec.SECP256R1()),
    )
    public_path = key_dir / P256_PUBLIC_KEY_FILE
    if public_path.exists():
        shipped = load_p256_public_key(public_path)
        if p256_public_key_der(shipped) != p256_public_key_der(key.public_key()):
            raise SigningKeyError(
                f"{public_path} does not belong to the private key {key_dir / P256_PRIVATE_KEY_FILE}"
            )
    else:
        public_path.write_bytes(encode_p256_public_key(key.public_key()))
    return key, created
