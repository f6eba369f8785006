"""Label tokens: what the server gets instead of a label.

    K_r = HKDF-SHA256(federation_secret, salt=None, info="harmony/label-token/" + r)
    t   = first 8 bytes of HMAC-SHA256(K_r, class id as 4-byte big-endian)

Within round r equal labels give equal tokens on every client (so the server can form
contrastive positives); across rounds the tokens are unlinkable; without the federation secret,
which only clients hold, the server cannot map a token to a class.
"""

from __future__ import annotations

from collections.abc import Iterable

from cryptography.hazmat.primitives import hashes, hmac
from cryptography.hazmat.primitives.kdf.hkdf import HKDF

TOKEN_BYTES = 8
ROUND_KEY_BYTES = 32
INFO_PREFIX = b"harmony/label-token/"


def round_key(federation_secret: bytes, round_id: int | str) -> bytes:
    """K_r: the per-round (or per key epoch) HMAC key."""
    if len(federation_secret) < 16:
        raise ValueError("the federation secret must be at least 16 bytes")
    hkdf = HKDF(
        algorithm=hashes.SHA256(),
        length=ROUND_KEY_BYTES,
        salt=None,
        info=INFO_PREFIX + str(round_id).encode(),
    )
    return hkdf.derive(federation_secret)


def label_token(key: bytes, class_id: int) -> bytes:
    """trunc64(HMAC-SHA256(K_r, class_id))."""
    if class_id < 0:
        raise ValueError(f"class ids are non-negative, got {class_id}")
    mac = hmac.HMAC(key, hashes.SHA256())
    mac.update(int(class_id).to_bytes(4, "big"))
    return mac.finalize()[:TOKEN_BYTES]


def label_tokens(key: bytes, class_ids: Iterable[int]) -> tuple[bytes, ...]:
    """Tokens for a batch of labels (computed once per distinct class)."""
    class_ids = [int(c) for c in class_ids]
    table = {c: label_token(key, c) for c in set(class_ids)}
    return tuple(table[c] for c in class_ids)


def tokens_to_groups(tokens: Iterable[bytes]) -> list[int]:
    """Server side: replace each token by a small group index (equal tokens -> equal index).

    The indices are arbitrary (first-seen order), so they carry no class identity; they only make
    the SupCon positive mask cheap to build.
    """
    seen: dict[bytes, int] = {}
    return [seen.setdefault(bytes(token), len(seen)) for token in tokens]
