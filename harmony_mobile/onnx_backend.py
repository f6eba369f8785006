"""The back-end g as ONNX: what a serving replica without torch runs (ONNX Runtime).

`harmony export` writes it beside backend.pt (backend/backend.onnx), and a replica that publishes
an alignment round's version stores one with it, so a replica installed with `[server]` alone can
serve every version. One file per version: the graph of g with a dynamic batch axis, input
`features` (N, *interface) float32 -> output `logits` (N, num_classes), and under the model's
metadata key METADATA_KEY a JSON object with what serving needs besides the weights:

  format, model_version, label_epoch, slot_table (hex tokens, slot i at index i), num_classes,
  interface (C, S, S), backend_sha256: the sha256 of the backend.pt it was converted from, which
  names the registry version it serves, and replay_rows: how many rows that file's replay set has
  (a count, recorded with the version).

Nothing here that backend.pt does not already hold, and less: no projection head h (only alignment
rounds use it), no replay set, no class names (the server never serves them). This module imports
no torch; the writer is run_dir.save_backend_onnx.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

import numpy as np

from harmony_mobile.protocol.label_tokens import check_label_epoch, parse_slot_table

FORMAT = 1
METADATA_KEY = "harmony.backend"
INPUT_NAME = "features"
OUTPUT_NAME = "logits"
# max |ONNX Runtime logit - PyTorch logit| a written file may show on its check sample: float32
# kernels differ in summation order, measured ~1e-7 on this back-end; 1e-4 still catches any real
# conversion error (a wrong op moves logits by far more)
TOLERANCE = 1e-4
METADATA_FIELDS = (
    "format",
    "model_version",
    "label_epoch",
    "slot_table",
    "num_classes",
    "interface",
    "backend_sha256",
    "replay_rows",
)


class OnnxBackendError(ValueError):
    """A file that is not an ONNX back-end written by harmony; the message is one line."""


def backend_metadata(
    model_version: str,
    label_epoch: str,
    slot_table: list[str],
    num_classes: int,
    interface: tuple[int, int, int],
    backend_sha256: str,
    replay_rows: int,
) -> str:
    """The JSON stored under METADATA_KEY."""
    fields = [FORMAT, model_version, label_epoch, list(slot_table), num_classes, list(interface)]
    fields += [backend_sha256, replay_rows]
    return json.dumps(dict(zip(METADATA_FIELDS, fields, strict=True)), sort_keys=True)


class ServedSlots:
    """The slot table as a serving replica needs it: its label epoch and tokens, read-only (the
    protocol's SlotTable also assigns slots, which only alignment rounds do)."""

    def __init__(self, label_epoch: str, capacity: int, hex_tokens: list[str]):
        self.label_epoch = check_label_epoch(label_epoch)
        self.tokens = parse_slot_table(hex_tokens)
        if len(set(self.tokens)) != len(self.tokens) or len(self.tokens) > capacity:
            raise ValueError(f"a slot table lists each token once, at most {capacity} of them")
        self.capacity = capacity

    def __len__(self) -> int:
        return len(self.tokens)

    def to_hex(self) -> list[str]:
        return [token.hex() for token in self.tokens]


def _parse_metadata(text: str | None) -> dict[str, Any]:
    if text is None:
        raise OnnxBackendError(f"no {METADATA_KEY} metadata: not a back-end written by `harmony export`")
    try:
        meta = json.loads(text)
    except json.JSONDecodeError as error:
        raise OnnxBackendError(f"{METADATA_KEY} metadata is not JSON: {error}") from None
    missing = [key for key in METADATA_FIELDS if not isinstance(meta, dict) or key not in meta]
    if missing:
        raise OnnxBackendError(f"{METADATA_KEY} metadata has no {', '.join(missing)}")
    if meta["format"] != FORMAT:
        raise OnnxBackendError(f"ONNX back-end format {meta['format']!r}; this server reads {FORMAT}")
    return meta


@dataclass
class OnnxBackend:
    """One loaded ONNX back-end: an ONNX Runtime session (thread-safe for concurrent runs) and its
    metadata."""

    session: Any  # onnxruntime.InferenceSession
    model_version: str
    backend_sha256: str
    slot_table: ServedSlots
    num_classes: int
    interface_shape: tuple[int, int, int]
    replay_rows: int

    def forward(self, features: np.ndarray) -> np.ndarray:
        """Logits (N, num_classes) float32 of features (N, *interface)."""
        return self.session.run([OUTPUT_NAME], {INPUT_NAME: np.ascontiguousarray(features, np.float32)})[0]


def session_options(threads: int | None):
    import onnxruntime

    options = onnxruntime.SessionOptions()
    if threads is not None:
        # one forward at a time per process (the micro-batcher's worker): no inter-op parallelism
        options.intra_op_num_threads = threads
        options.inter_op_num_threads = 1
    return options


def load_onnx_backend(content: bytes, threads: int | None = None) -> OnnxBackend:
    """Read an ONNX back-end from its bytes; anything else is a one-line OnnxBackendError."""
    import onnxruntime

    try:
        session = onnxruntime.InferenceSession(
            content, session_options(threads), providers=["CPUExecutionProvider"]
        )
    except Exception as error:  # ORT raises its own exception types on bad bytes
        first = str(error).strip().splitlines()[0] if str(error).strip() else type(error).__name__
        raise OnnxBackendError(f"ONNX Runtime cannot load it: {first}") from None
    meta = _parse_metadata(session.get_modelmeta().custom_metadata_map.get(METADATA_KEY))
    try:
        channels, size, size2 = (int(v) for v in meta["interface"])
        slots = ServedSlots(meta["label_epoch"], int(meta["num_classes"]), meta["slot_table"])
    except (TypeError, ValueError) as error:
        raise OnnxBackendError(f"bad {METADATA_KEY} metadata: {error}") from None
    inputs = [i.name for i in session.get_inputs()]
    if inputs != [INPUT_NAME]:
        raise OnnxBackendError(f"the graph's inputs are {inputs}, not [{INPUT_NAME!r}]")
    return OnnxBackend(
        session,
        str(meta["model_version"]),
        str(meta["backend_sha256"]),
        slots,
        int(meta["num_classes"]),
        (channels, size, size2),
        int(meta["replay_rows"]),
    )
