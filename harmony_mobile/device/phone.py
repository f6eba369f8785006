"""The phone: classify with the local exit or the server's back-end, and upload confirmed labels sealed.

Counterparts: harmony-core's root package `org.harmonymobile.core` (HarmonyClient, SlotDecoder,
ConfirmedUploads, FederationKey, Classification) with `exit.ExitPolicy` for the threshold;
HarmonyKit `Client/` (HarmonyClient.swift, ConfirmedUploads.swift), `Exit/ExitPolicy.swift`, and
`FederationKey` in Crypto/LabelTokens.swift.
"""

from __future__ import annotations

import base64
import json
import math
import os
import time
import uuid
from collections.abc import Collection
from dataclasses import dataclass, field

import httpx
import torch

from harmony_mobile.device.engine import FrontEndProgram
from harmony_mobile.device.errors import DeviceError
from harmony_mobile.device.fallback_client import (
    MODEL_NAME,
    DeviceCredentials,
    error_detail,
    parse_slot_table,
)
from harmony_mobile.device.label_draws import LabelDraws, feature_sample_ids
from harmony_mobile.device.manifest import find_tier_entry, normalize, tier_exit_rule, upload_privacy
from harmony_mobile.device.queue import PendingUpload, UploadQueue
from harmony_mobile.privacy.feature_noise import privatize_features
from harmony_mobile.protocol.label_tokens import (
    check_label_epoch,
    class_tokens,
    epoch_key,
    exit_order,
    slot_classes,
)
from harmony_mobile.protocol.sealing import AssociatedData, seal
from harmony_mobile.protocol.slot_gate import slot_margin
from harmony_mobile.protocol.wire import MAX_UPLOAD_ROWS, UploadMetadata, encode_tensor, encode_upload

LABEL_DRAWS_FILE = "label_dp_draws.json"  # beside the upload queue: device-local storage
PERMANENT_UPLOAD_STATUSES = (400, 409, 413, 422)  # resending the same bytes cannot fix these


@dataclass(frozen=True)
class FederationKey:
    """Provisioned out of band (never sent to the server): the federation secret. The label epoch
    it is used under comes from the signed manifest."""

    secret: bytes = field(repr=False)

    def __post_init__(self) -> None:
        if len(self.secret) < 16:
            raise ValueError("the federation secret must be at least 16 bytes")


@dataclass
class Classification:
    source: str  # "local", "server", "local_after_server_failure", "local_unnamed_slot"
    prediction: int
    confidence: float
    exit_prediction: int
    exit_confidence: float
    features: torch.Tensor  # (1, C, S, S): what a confirmed label would upload
    local_ms: float
    server_ms: float = 0.0
    server_version: str | None = None
    error: str | None = None


@dataclass
class PhoneStats:
    classified: int = 0
    local: int = 0
    server: int = 0
    server_failures: int = 0
    unnamed_slots: int = 0  # the server's top slot was no class of this phone: the local answer stood
    infer_bytes: int = 0  # request bodies sent to the infer endpoint
    upload_bytes: int = 0  # acknowledged upload request bodies
    uploads_acknowledged: int = 0
    upload_rows_acknowledged: int = 0
    duplicates: int = 0
    local_ms: list[float] = field(default_factory=list)


@dataclass
class FlushResult:
    delivered: int
    rejected: int
    remaining: int
    error: str | None = None


class Phone:
    """One simulated phone of one tier: the front-end .pte, the fallback server, the upload queue."""

    def __init__(
        self,
        *,
        manifest: dict,
        tier: str,
        program: FrontEndProgram,
        server_url: str,
        credentials: DeviceCredentials,
        federation_key: FederationKey,
        queue: UploadQueue,
        model_version: str | None = None,
        threshold: float | None = None,
        timeout: float = 10.0,
        connect_timeout: float = 2.0,
        http: httpx.Client | None = None,
        slot_prototypes: torch.Tensor | None = None,
        own_classes: Collection[str] | None = None,
    ):
        """`threshold`: the exit threshold tau; None = the tier's threshold in the manifest. A tier
        whose `exit_rule` is slot_margin needs the manifest's `slot_prototypes`
        (`load_slot_prototypes`) and `own_classes`: the class names this phone holds (its own data;
        they never leave it)."""
        self.manifest = manifest
        self.entry = find_tier_entry(manifest, tier)
        self.tier = tier
        self.program = program
        self.exit_rule = tier_exit_rule(self.entry)
        self.threshold = exit_threshold(
            self.entry["threshold"] if threshold is None else threshold, self.exit_rule
        )
        self.normalization = self.entry["normalization"]
        self.credentials = credentials
        self.federation_key = federation_key
        self.queue = queue
        self.model_version = model_version or manifest["model_version"]
        self.class_names = list(manifest["class_names"])
        self.label_epoch = check_label_epoch(manifest["label_epoch"])
        self.privacy = upload_privacy(manifest)
        # exit output j -> class index: exit heads ship in token order (protocol/label_tokens.exit_order)
        self._exit_classes = self.decode_exit_order(self.label_epoch)
        # back-end version -> class index of each slot (None: no class name of this phone maps to it)
        self._slot_classes: dict[str, list[int | None]] = {
            manifest["backend"]["model_version"]: self.decode_slot_table(
                self.label_epoch, manifest["slot_table"]
            )
        }
        self._slot_gate = (
            self.slot_gate(slot_prototypes, own_classes) if self.exit_rule == "slot_margin" else None
        )
        self._noise = torch.Generator().manual_seed(int.from_bytes(os.urandom(8), "little") >> 1)
        self.stats = PhoneStats()
        self.server_url = server_url
        self.timeout = httpx.Timeout(timeout, connect=connect_timeout)
        self.http = self.connect(http)

    def connect(self, http: httpx.Client | None = None) -> httpx.Client:
        """(Re)open the HTTP client; tests pass their own (an in-process app, or a dead transport)."""
        http = http or httpx.Client(base_url=self.server_url, timeout=self.timeout)
        http.headers["Authorization"] = f"Bearer {self.credentials.token}"
        self.http = http
        return http

    def close(self) -> None:
        self.http.close()

    def __enter__(self) -> Phone:
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def slot_gate(
        self, prototypes: torch.Tensor | None, own_classes: Collection[str] | None
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """(prototypes in float64, own slot flags) of a slot_margin tier: a slot is this phone's own
        when the class its secret decodes from the manifest's slot table is one the phone holds."""
        if prototypes is None or own_classes is None:
            raise DeviceError(
                f"tier {self.tier} exits by slot_margin: the phone needs the manifest's slot_prototypes "
                "and the class names it holds"
            )
        unknown = set(own_classes) - set(self.class_names)
        if unknown or not own_classes:
            raise DeviceError(
                f"own classes must be some of the manifest's class names; unknown: {sorted(unknown)}"
            )
        decoded = self._slot_classes[self.manifest["backend"]["model_version"]]
        width = math.prod(self.manifest["interface_shape"])
        if list(prototypes.shape) != [len(decoded), width]:
            raise DeviceError(
                f"slot prototypes of shape {list(prototypes.shape)} for {len(decoded)} slots of {width} features"
            )
        own = [c is not None and self.class_names[c] in set(own_classes) for c in decoded]
        return prototypes.double(), torch.tensor(own, dtype=torch.bool)

    def use_local_front_end(self, program: FrontEndProgram, *, threshold: float, model_version: str) -> None:
        """On-device personalization replaced the front-end: answer with `program` from now on, exit
        when its confidence reaches `threshold` (tau recalibrated for it on the phone's own held-out
        samples, docs/ALGORITHM.md: Inference), and stamp uploads with `model_version`."""
        self.threshold = exit_threshold(threshold, self.exit_rule)
        self.program = program
        self.model_version = model_version

    # ---- inference

    def run_front_end(self, pixels) -> tuple[torch.Tensor, torch.Tensor, float]:
        image = normalize(pixels, self.normalization)
        started = time.perf_counter()
        logits, features = self.program.run(image)
        return logits, features, (time.perf_counter() - started) * 1e3

    def exit_answer(self, logits: torch.Tensor, features: torch.Tensor) -> tuple[float, int]:
        """(score, class) of the local exit, the score compared with the threshold: the max softmax,
        or on a slot_margin tier the slot margin of the features (float64, as the golden vectors);
        the top output is named through the secret (outputs are in token order)."""
        output = int(logits[0].argmax())
        return float(self.exit_scores(logits[:1], features[:1])[0]), self._exit_classes[output]

    def exit_scores(self, logits: torch.Tensor, features: torch.Tensor) -> torch.Tensor:
        """Each row's exit score, what the threshold is compared with: the max softmax (float32), or
        on a slot_margin tier the slot margin (float64, as the golden vectors; NaN for a row with a
        non-finite feature or logit, which never exits)."""
        if self._slot_gate is None:
            return torch.softmax(logits.float(), dim=1).max(dim=1).values
        margin = slot_margin(features.double(), *self._slot_gate)
        finite = torch.isfinite(logits.flatten(1)).all(dim=1) & torch.isfinite(features.flatten(1)).all(dim=1)
        return margin.masked_fill(~finite, math.nan)

    def decode_exit_order(self, label_epoch: str) -> list[int]:
        """Class index of each exit output under the epoch the front-end was trained in."""
        key = epoch_key(self.federation_key.secret, label_epoch)
        return [self.class_names.index(name) for name in exit_order(key, self.class_names)]

    def exit_positions(self, class_ids) -> torch.Tensor:
        """The exit output of each class id (through the secret): what on-device training is fed."""
        position = {class_index: output for output, class_index in enumerate(self._exit_classes)}
        try:
            return torch.tensor([position[int(c)] for c in class_ids], dtype=torch.int64)
        except KeyError as error:
            raise ValueError(
                f"class id {error.args[0]} is not one of the {len(self.class_names)} classes"
            ) from None

    def would_exit(self, pixels) -> bool:
        """Whether the phone answers this image locally (without asking the server)."""
        logits, features, _ = self.run_front_end(pixels)
        return self.exit_answer(logits, features)[0] >= self.threshold

    def classify(self, pixels) -> Classification:
        """Answer for one image (C, H, W) of 0..255 pixels: local exit, server fallback, or local after failure."""
        logits, features, local_ms = self.run_front_end(pixels)
        confidence, exit_prediction = self.exit_answer(logits, features)
        self.stats.classified += 1
        self.stats.local_ms.append(local_ms)
        result = Classification(
            "local", exit_prediction, confidence, exit_prediction, confidence, features, local_ms
        )
        if confidence >= self.threshold:
            self.stats.local += 1
            return result
        body = encode_tensor(features.numpy())
        started = time.perf_counter()
        try:
            response = self.http.post(
                f"/v2/models/{MODEL_NAME}/infer",
                content=body,
                headers={"Content-Type": "application/octet-stream", "X-Harmony-Tier": self.tier},
            )
            self.stats.infer_bytes += len(body)
            if response.status_code != 200:
                raise DeviceError(f"{response.status_code}: {error_detail(response)}")
            answer = response.json()
            outputs = {o["name"]: o["data"] for o in answer["outputs"]}
            result.server_version = answer["model_version"]
            decoded = self.slot_classes(result.server_version)
            top_slot = int(outputs["top_slot"][0])
            named = decoded[top_slot] if 0 <= top_slot < len(decoded) else None
            if named is None:
                result.source = "local_unnamed_slot"
                result.error = f"the server's top slot {top_slot} maps to none of this phone's classes"
                self.stats.unnamed_slots += 1
            else:
                result.source = "server"
                result.prediction = named
                result.confidence = float(outputs["confidence"][0])
                self.stats.server += 1
        except (httpx.HTTPError, DeviceError, KeyError, ValueError, IndexError, TypeError) as error:
            result.source = "local_after_server_failure"
            result.error = f"{type(error).__name__}: {error}"
            self.stats.server_failures += 1
        result.server_ms = (time.perf_counter() - started) * 1e3
        return result

    def decode_slot_table(self, label_epoch: str, slot_table: list[str]) -> list[int | None]:
        """Class index of each slot of a table: tokens of this phone's class names under the epoch."""
        key = epoch_key(self.federation_key.secret, label_epoch)
        names = slot_classes(key, self.class_names, parse_slot_table(slot_table))
        return [self.class_names.index(name) if name is not None else None for name in names]

    def slot_classes(self, version: str) -> list[int | None]:
        """The decoded slot table of a back-end version; one the phone has not seen yet is read from
        the V2 model metadata of that version first (docs/PROTOCOL.md, slot table)."""
        if version not in self._slot_classes:
            response = self.http.get(f"/v2/models/{MODEL_NAME}/versions/{version}")
            if response.status_code != 200:
                raise DeviceError(
                    f"slot table of version {version!r}: {response.status_code}: {error_detail(response)}"
                )
            parameters = response.json()["parameters"]
            self._slot_classes[version] = self.decode_slot_table(
                check_label_epoch(parameters["label_epoch"]), parameters["slot_table"]
            )
        return self._slot_classes[version]

    # ---- confirmed uploads

    def confirm(
        self, features: torch.Tensor, labels, sample_ids: list[str] | None = None
    ) -> list[PendingUpload]:
        """Seal and queue features (N, C, S, S) of samples whose labels the user confirmed.

        Rows are split into uploads of at most the server's `max_upload_rows`. Labels become tokens
        of their class names under the manifest's label epoch (after randomized response, when the
        lineage uses label DP: one draw per sample, kept on the phone, `label_draws.py`; samples are
        told apart by `sample_ids`, by default a hash of their features); features are clipped and
        noised when it uses that option. Only sealed bytes reach the disk."""
        features = torch.as_tensor(features).float()
        labels = torch.as_tensor([int(y) for y in labels], dtype=torch.int64)
        if len(labels) != len(features):
            raise ValueError(f"{len(features)} feature rows but {len(labels)} labels")
        if len(labels) and not 0 <= int(labels.min()) <= int(labels.max()) < len(self.class_names):
            raise ValueError(f"labels are class indices 0..{len(self.class_names) - 1}")
        privacy = self.privacy
        if privacy.label_dp_epsilon is not None:
            ids = feature_sample_ids(features) if sample_ids is None else [str(i) for i in sample_ids]
            if len(ids) != len(labels):
                raise ValueError(f"{len(ids)} sample ids for {len(labels)} labels")
            draws = LabelDraws(self.queue.directory / LABEL_DRAWS_FILE)
            labels = draws.randomize(
                ids, labels, privacy.label_dp_epsilon, len(self.class_names), self._noise
            )
        features = privatize_features(features, privacy.feature_clip, privacy.noise_multiplier, self._noise)
        rows = int(self.credentials.limits.get("max_upload_rows", MAX_UPLOAD_ROWS))
        key, epoch = epoch_key(self.federation_key.secret, self.label_epoch), self.label_epoch
        queued = []
        for start in range(0, len(labels), rows):
            chunk, chunk_labels = features[start : start + rows], labels[start : start + rows].tolist()
            metadata = UploadMetadata(
                label_tokens=tuple(
                    t.hex() for t in class_tokens(key, [self.class_names[y] for y in chunk_labels])
                ),
                split_depths=(int(self.entry["split_depth"]),) * len(chunk_labels),
                family=self.entry["family"],
                tier=self.tier,
                model_version=self.model_version,
                clip_norm=privacy.feature_clip,
                noise_multiplier=privacy.noise_multiplier,
                label_dp_epsilon=privacy.label_dp_epsilon,
            )
            plaintext = encode_upload(metadata, chunk.numpy())
            queued.append(
                self.queue.enqueue(lambda message_id, p=plaintext, e=epoch: self._body(p, e, message_id))
            )
        return queued

    def _body(self, plaintext: bytes, label_epoch: str, message_id: str) -> bytes:
        ad = AssociatedData(self.credentials.device_id, label_epoch, uuid.UUID(message_id))
        envelope = seal(self.credentials.server_public_key, plaintext, ad)
        body = {
            "label_epoch": label_epoch,
            "message_id": message_id,
            "envelope": base64.b64encode(envelope).decode(),
        }
        return json.dumps(body, separators=(",", ":")).encode()

    def flush(self) -> FlushResult:
        """Send queued uploads oldest first; stop at the first transient failure (server down, 429, 5xx...)."""
        delivered = rejected = 0
        for upload in self.queue.pending():
            try:
                response = self.http.post(
                    "/v1/uploads", content=upload.body, headers={"Content-Type": "application/json"}
                )
            except httpx.HTTPError as error:
                return FlushResult(delivered, rejected, len(self.queue), f"{type(error).__name__}: {error}")
            if 200 <= response.status_code < 300:
                receipt = response.json()
                self.stats.uploads_acknowledged += 1
                self.stats.upload_rows_acknowledged += int(receipt.get("rows", 0))
                self.stats.upload_bytes += len(upload.body)
                self.stats.duplicates += bool(receipt.get("duplicate"))
                self.queue.remove(upload)
                delivered += 1
            elif response.status_code in PERMANENT_UPLOAD_STATUSES:
                self.queue.reject(upload, f"{response.status_code}: {error_detail(response)}")
                rejected += 1
            else:
                error = f"{response.status_code}: {error_detail(response)}"
                return FlushResult(delivered, rejected, len(self.queue), error)
        return FlushResult(delivered, rejected, len(self.queue))


def exit_threshold(value: float, rule: str = "max_softmax") -> float:
    """A usable tau: a finite number >= 0 for max softmax (above 1 = never exit locally), >= -2 for
    the slot margin (above 2 = never)."""
    threshold, least = float(value), -2.0 if rule == "slot_margin" else 0.0
    if not math.isfinite(threshold) or threshold < least:
        raise ValueError(f"a {rule} exit threshold is a finite number >= {least:g}, got {value!r}")
    return threshold
