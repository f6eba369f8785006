"""Label tokens: what the server gets instead of a label.

    K_e = HKDF-SHA256(federation_secret, salt=None, info="harmony/label-token/" + label epoch, 32)
    t   = first 8 bytes of HMAC-SHA256(K_e, UTF-8 class name)

Within one label epoch (a model lineage: training and its alignment rounds) equal class names give
equal tokens on every client, so the server can keep a slot per token and train over slots;
across epochs the tokens are unlinkable; without the federation secret, which only clients hold,
the server cannot map a token (or its slot) to a class. Java (harmony-core `LabelTokens`) and Swift
(HarmonyKit `LabelTokens`) implement the same bytes (tests/vectors/label_tokens.json,
slot_mapping.json).
"""

from __future__ import annotations

import re
from collections.abc import Iterable

from cryptography.hazmat.primitives import hashes, hmac
from cryptography.hazmat.primitives.kdf.hkdf import HKDF

TOKEN_BYTES = 8
EPOCH_KEY_BYTES = 32
INFO_PREFIX = b"harmony/label-token/"
TOKEN_HEX_PATTERN = re.compile(rf"[0-9a-f]{{{2 * TOKEN_BYTES}}}")  # how a token is serialized


def tokens_to_groups(tokens: Iterable[bytes]) -> list[int]:
    """Server side: replace each token by a small group index (equal tokens -> equal index).

    The indices are arbitrary (first-seen order), so they carry no class identity; they only make
    the SupCon positive mask cheap to build.
    """
    seen: dict[bytes, int] = {}
    return [seen.setdefault(bytes(token), len(seen)) for token in tokens]


# --------------------------------------------------------------------------- label epochs and slots
#
# The slot-space protocol (docs/ALGORITHM.md, "Label tokens" and "Slot table"):
#
#     K_e = HKDF-SHA256(federation_secret, salt=None, info="harmony/label-token/" + epoch, 32)
#     t   = first 8 bytes of HMAC-SHA256(K_e, UTF-8 class name)
#
# One epoch per model lineage (training and its alignment rounds), so the server can keep a
# slot per token and train a classifier over slots. The server assigns slots in order of first
# appearance; a phone turns a slot back into a class by computing the token of every class name
# it knows and looking the slot's token up.

LABEL_EPOCH_PATTERN = r"^[A-Za-z0-9._-]{1,64}$"


def check_label_epoch(label_epoch: str) -> str:
    if not isinstance(label_epoch, str) or re.fullmatch(LABEL_EPOCH_PATTERN, label_epoch) is None:
        raise ValueError(f"a label epoch is 1-64 characters of [A-Za-z0-9._-], got {label_epoch!r}")
    return label_epoch


def epoch_key(federation_secret: bytes, label_epoch: str) -> bytes:
    """K_e: the HMAC key of one label epoch."""
    if len(federation_secret) < 16:
        raise ValueError("the federation secret must be at least 16 bytes")
    hkdf = HKDF(
        algorithm=hashes.SHA256(),
        length=EPOCH_KEY_BYTES,
        salt=None,
        info=INFO_PREFIX + check_label_epoch(label_epoch).encode("ascii"),
    )
    return hkdf.derive(federation_secret)


def class_token(key: bytes, class_name: str) -> bytes:
    """trunc64(HMAC-SHA256(K_e, UTF-8 class name))."""
    if not class_name:
        raise ValueError("a class name is a non-empty string")
    mac = hmac.HMAC(key, hashes.SHA256())
    mac.update(class_name.encode("utf-8"))
    return mac.finalize()[:TOKEN_BYTES]


def class_tokens(key: bytes, class_names: Iterable[str]) -> tuple[bytes, ...]:
    """Tokens for a batch of class names (computed once per distinct name)."""
    names = list(class_names)
    table = {name: class_token(key, name) for name in set(names)}
    return tuple(table[name] for name in names)


def slot_classes(key: bytes, class_names: Iterable[str], slot_table: Iterable[bytes]) -> list[str | None]:
    """Phone side: the class name behind each slot, or None for a slot whose token is none of the
    phone's class names (another epoch, or a class this manifest does not list)."""
    by_token = {class_token(key, name): name for name in class_names}
    return [by_token.get(bytes(token)) for token in slot_table]


def exit_order(key: bytes, class_names: Iterable[str]) -> list[str]:
    """Phone side: the class name behind each output of an exit head. Exit heads are trained and
    shipped in token order (output j = the class with the j-th smallest token of the epoch), so a
    model that leaves the phone carries no class order: only a holder of the federation secret can
    name an output (docs/PRIVACY.md, "Nothing class-ordered leaves a phone")."""
    names = list(class_names)
    tokens = class_tokens(key, names)
    return [name for _, name in sorted(zip(tokens, names, strict=True))]


def exit_positions(key: bytes, class_names: Iterable[str]) -> list[int]:
    """Phone side: the exit output of each class, in the order of `class_names` (exit_order's inverse)."""
    names = list(class_names)
    position = {name: j for j, name in enumerate(exit_order(key, names))}
    return [position[name] for name in names]


def is_token_hex(text: object) -> bool:
    """Whether `text` is a label token's serialized form: 16 lowercase hex characters."""
    return isinstance(text, str) and TOKEN_HEX_PATTERN.fullmatch(text) is not None


def parse_slot_table(hex_tokens: Iterable[str]) -> list[bytes]:
    """A slot table as serialized in the manifest, enrolment, V2 metadata and run state: slot i's
    token at index i, as lowercase hex. The one parser for export, server, phone and run dir."""
    table = []
    for index, text in enumerate(hex_tokens):
        if not is_token_hex(text):
            raise ValueError(
                f"slot {index}: a token is {2 * TOKEN_BYTES} lowercase hex characters, got {text!r}"
            )
        table.append(bytes.fromhex(text))
    return table
