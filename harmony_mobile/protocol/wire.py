"""Binary bodies phones send: the feature tensor and the sealed-upload plaintext (docs/PROTOCOL.md).

Feature tensor ("HMFT", all integers little-endian):

    offset  size     field
    0       4        magic "HMFT"
    4       1        version = 1
    5       1        dtype code: 1 = float32 (the only one accepted)
    6       1        ndim, 1..6
    7       1        reserved = 0
    8       4*ndim   dims, u32 each, every dim >= 1
    8+4*ndim         data: prod(dims) float32 values, little-endian, C (row-major) order

The header length is a multiple of 4, so the data is 4-byte aligned in the body.

Upload plaintext (what a sealed envelope holds):

    0       4        magic "HMUP"
    4       1        version = 1
    5       4        u32 length M of the metadata JSON
    9       M        metadata JSON, UTF-8 (see UploadMetadata)
    9+M              a feature tensor as above, shape (N, C, S, S)

Every decoder here rejects anything it does not fully understand, with a message that names the
field, because these bytes come from the network.
"""

from __future__ import annotations

import json
import math
import struct
import sys
from dataclasses import dataclass
from typing import TYPE_CHECKING, Annotated

import numpy as np
from pydantic import BaseModel, BeforeValidator, ConfigDict, Field, ValidationError, field_validator

from harmony_mobile.protocol.label_tokens import TOKEN_BYTES, is_token_hex
from harmony_mobile.protocol.validation import validation_problems

if TYPE_CHECKING:  # imported where a tensor is made: a serving replica without torch decodes too
    import torch

    from harmony_mobile.protocol.messages import FeatureUpload

TENSOR_MAGIC = b"HMFT"
TENSOR_VERSION = 1
DTYPE_FLOAT32 = 1
DTYPE_NAMES = {DTYPE_FLOAT32: "float32"}
MAX_NDIM = 6
TENSOR_FIXED_HEADER = 8

UPLOAD_MAGIC = b"HMUP"
UPLOAD_VERSION = 1
UPLOAD_FIXED_HEADER = 9
MAX_METADATA_BYTES = 1 << 20
# Feature rows per sealed upload: the fallback server's limit unless configured (its
# max_upload_rows), and what a phone splits uploads by when its enrolment names no limit.
MAX_UPLOAD_ROWS = 256

_LE_FLOAT32 = np.dtype("<f4")


class WireFormatError(ValueError):
    """Bytes that do not follow the documented binary layout."""


def tensor_header_size(ndim: int) -> int:
    return TENSOR_FIXED_HEADER + 4 * ndim


def encode_tensor(array: np.ndarray | torch.Tensor) -> bytes:
    """A float32 array -> the HMFT body."""
    if "torch" in sys.modules and isinstance(array, sys.modules["torch"].Tensor):
        array = array.detach().cpu().numpy()
    array = np.asarray(array)
    if array.dtype != np.float32:
        raise WireFormatError(f"only float32 tensors are encoded, got {array.dtype}")
    if not 1 <= array.ndim <= MAX_NDIM:
        raise WireFormatError(f"ndim must be 1..{MAX_NDIM}, got {array.ndim}")
    if min(array.shape) < 1:
        raise WireFormatError(f"every dimension must be >= 1, got shape {array.shape}")
    header = TENSOR_MAGIC + bytes([TENSOR_VERSION, DTYPE_FLOAT32, array.ndim, 0])
    header += b"".join(int(d).to_bytes(4, "little") for d in array.shape)
    return header + np.ascontiguousarray(array, dtype=_LE_FLOAT32).tobytes()


def decode_tensor(body: bytes) -> np.ndarray:
    """The HMFT body -> a float32 array (native byte order, a copy). Raises WireFormatError."""
    if len(body) < TENSOR_FIXED_HEADER:
        raise WireFormatError(
            f"binary tensor is {len(body)} bytes, shorter than the {TENSOR_FIXED_HEADER}-byte fixed header"
        )
    if body[:4] != TENSOR_MAGIC:
        raise WireFormatError(f"binary tensor magic is {bytes(body[:4])!r}, expected {TENSOR_MAGIC!r}")
    version, dtype_code, ndim, reserved = body[4], body[5], body[6], body[7]
    if version != TENSOR_VERSION:
        raise WireFormatError(f"binary tensor version {version} is not supported (expected {TENSOR_VERSION})")
    if dtype_code != DTYPE_FLOAT32:
        raise WireFormatError(f"binary tensor dtype code {dtype_code} is not supported (1 = float32 is)")
    if not 1 <= ndim <= MAX_NDIM:
        raise WireFormatError(f"binary tensor ndim {ndim} is out of range 1..{MAX_NDIM}")
    if reserved != 0:
        raise WireFormatError(f"binary tensor reserved byte 7 must be 0, got {reserved}")
    header_size = tensor_header_size(ndim)
    if len(body) < header_size:
        raise WireFormatError(
            f"binary tensor is {len(body)} bytes, shorter than its {header_size}-byte header"
        )
    dims = struct.unpack_from(f"<{ndim}I", body, 8)
    if min(dims) < 1:
        raise WireFormatError(f"binary tensor dims {list(dims)} contain a zero")
    expected = math.prod(dims) * 4
    actual = len(body) - header_size
    if actual != expected:
        raise WireFormatError(
            f"binary tensor header promises dims {list(dims)} = {expected} data bytes, body has {actual}"
        )
    return np.frombuffer(body, dtype=_LE_FLOAT32, offset=header_size).reshape(dims).astype(np.float32)


def _number_not_text(value: object) -> object:
    if isinstance(value, str | bytes | bool):
        raise ValueError("must be a JSON number, not a string or a boolean")
    return value


# Numbers as JSON numbers only: 3 and 3.0 are the integer 3, but "3" and true are no number (pydantic's
# lax mode would read them as 3 and 1, and record a protection or a depth the phone never sent).
Integer = Annotated[int, BeforeValidator(_number_not_text)]
Number = Annotated[float, BeforeValidator(_number_not_text)]


class UploadMetadata(BaseModel):
    """The JSON part of an upload plaintext. No field can hold a class id: tokens only."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    label_tokens: tuple[str, ...] = Field(
        min_length=1, description=f"one {TOKEN_BYTES}-byte label token per feature row, lowercase hex"
    )
    split_depths: tuple[Integer, ...] = Field(min_length=1, description="split depth of each row")
    family: str = Field(min_length=1, max_length=64)
    tier: str = Field(pattern=r"^[a-z0-9][a-z0-9_-]{0,63}$")
    model_version: str = Field(min_length=1, max_length=128, description="front-end model version")
    # allow_inf_nan=False: Python's json reads the non-JSON literals Infinity and NaN, and an
    # infinite clip or epsilon would record a protection that protects nothing
    clip_norm: Number | None = Field(
        default=None, gt=0, allow_inf_nan=False, description="L2 clip C_z applied on the phone"
    )
    noise_multiplier: Number | None = Field(
        default=None, ge=0, allow_inf_nan=False, description="sigma: noise std = sigma * C_z"
    )
    label_dp_epsilon: Number | None = Field(
        default=None,
        gt=0,
        allow_inf_nan=False,
        description="epsilon of the randomized response applied to the tokens, if any",
    )

    @field_validator("label_tokens")
    @classmethod
    def hex_tokens(cls, tokens: tuple[str, ...]) -> tuple[str, ...]:
        for index, token in enumerate(tokens):
            if not is_token_hex(token):
                raise ValueError(f"label_tokens[{index}] must be {2 * TOKEN_BYTES} lowercase hex characters")
        return tokens

    @field_validator("split_depths")
    @classmethod
    def positive_depths(cls, depths: tuple[int, ...]) -> tuple[int, ...]:
        if min(depths) < 1:
            raise ValueError("split depths are >= 1")
        return depths


@dataclass(frozen=True)
class UploadPayload:
    """A decoded upload plaintext."""

    metadata: UploadMetadata
    features: np.ndarray  # (N, C, S, S) float32

    def to_feature_upload(self, client_id: str, label_epoch: str, round_id: int = -1) -> FeatureUpload:
        """The message type the alignment code consumes (the same one the simulation passes)."""
        import torch

        from harmony_mobile.protocol.messages import FeatureUpload

        return FeatureUpload(
            client_id=client_id,
            round_id=round_id,
            label_epoch=label_epoch,
            features=torch.from_numpy(self.features),
            label_tokens=tuple(bytes.fromhex(t) for t in self.metadata.label_tokens),
            split_depths=self.metadata.split_depths,
            family=self.metadata.family,
            tier=self.metadata.tier,
            model_version=self.metadata.model_version,
        )


def encode_upload(metadata: UploadMetadata, features: np.ndarray | torch.Tensor) -> bytes:
    rows = features.shape[0] if features.ndim else 0
    if rows != len(metadata.label_tokens) or rows != len(metadata.split_depths):
        raise WireFormatError(
            f"{rows} feature rows but {len(metadata.label_tokens)} tokens and {len(metadata.split_depths)} depths"
        )
    meta = metadata.model_dump_json(exclude_none=True).encode("utf-8")
    return (
        UPLOAD_MAGIC
        + bytes([UPLOAD_VERSION])
        + len(meta).to_bytes(4, "little")
        + meta
        + encode_tensor(features)
    )


def decode_upload(plaintext: bytes) -> UploadPayload:
    """Upload plaintext -> metadata + features; raises WireFormatError naming what is wrong."""
    if len(plaintext) < UPLOAD_FIXED_HEADER:
        raise WireFormatError(f"upload payload is {len(plaintext)} bytes, shorter than its 9-byte header")
    if plaintext[:4] != UPLOAD_MAGIC:
        raise WireFormatError(f"upload payload magic is {bytes(plaintext[:4])!r}, expected {UPLOAD_MAGIC!r}")
    if plaintext[4] != UPLOAD_VERSION:
        raise WireFormatError(
            f"upload payload version {plaintext[4]} is not supported (expected {UPLOAD_VERSION})"
        )
    meta_len = int.from_bytes(plaintext[5:9], "little")
    if meta_len > MAX_METADATA_BYTES or UPLOAD_FIXED_HEADER + meta_len > len(plaintext):
        raise WireFormatError(f"upload metadata length {meta_len} exceeds the payload")
    try:
        raw = json.loads(plaintext[UPLOAD_FIXED_HEADER : UPLOAD_FIXED_HEADER + meta_len].decode("utf-8"))
        metadata = UploadMetadata.model_validate(raw)
    except (UnicodeDecodeError, json.JSONDecodeError) as error:
        raise WireFormatError(f"upload metadata is not UTF-8 JSON: {error}") from None
    except ValidationError as error:
        problems = validation_problems(error.errors(), whole="metadata")
        raise WireFormatError(f"upload metadata is invalid: {problems}") from None
    features = decode_tensor(plaintext[UPLOAD_FIXED_HEADER + meta_len :])
    rows = features.shape[0]
    if features.ndim != 4:
        raise WireFormatError(f"upload features must be 4-d (N, C, S, S), got shape {list(features.shape)}")
    if rows != len(metadata.label_tokens) or rows != len(metadata.split_depths):
        raise WireFormatError(
            f"upload has {rows} feature rows but {len(metadata.label_tokens)} label tokens "
            f"and {len(metadata.split_depths)} split depths"
        )
    return UploadPayload(metadata, features)
