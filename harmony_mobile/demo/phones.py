"""Each simulated phone's data (its test set, ID + OOD; the samples its user confirms; its val split)
and what a phone does in a phase: classify every test image, confirm labels, deliver sealed uploads."""

from __future__ import annotations

import statistics
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch

from harmony_mobile.data.partition import ClientSplit, ood_test_indices
from harmony_mobile.demo.config import UPLOAD_ROWS, DemoConfig, DemoError, ProgressReport
from harmony_mobile.device.fallback_client import MODEL_NAME
from harmony_mobile.device.phone import Phone
from harmony_mobile.protocol.wire import encode_tensor
from harmony_mobile.run_dir import ClientArtifact, RunDir
from harmony_mobile.training import TrainConfig, client_partition


@dataclass
class PhoneData:
    tier: str
    client: ClientArtifact
    pixels: np.ndarray  # uint8 (N, C, H, W): the test set, ID samples first, then OOD
    labels: np.ndarray
    is_ood: np.ndarray
    confirmed: dict[str, np.ndarray]  # phase -> indices into the dataset of samples the user confirms
    val_pixels: np.ndarray  # the phone's own held-out ID samples (the client's val split): tau calibration
    val_labels: np.ndarray


def to_pixels(images: torch.Tensor, mean, std) -> np.ndarray:
    """Undo the dataset normalization: what the camera gave the phone (0..255)."""
    mean = torch.tensor(mean).view(1, -1, 1, 1)
    std = torch.tensor(std).view(1, -1, 1, 1)
    return ((images * std + mean) * 255).round().clamp(0, 255).to(torch.uint8).numpy()


def confirmation_sets(client: ClientArtifact, clients, labels: np.ndarray, config: DemoConfig, rng) -> dict:
    """Samples whose label the phone's user confirms, per phase, drawn like its traffic: a share
    `ood_fraction` of classes the phone never trained on, the rest of its own classes. ID samples
    come from the phone's own training data, OOD ones from other clients' training data (never from
    any test set, so nothing the phones are scored on reaches the server's alignment)."""
    own = rng.permutation(np.asarray(client.train_idx))
    others = np.concatenate([np.asarray(c.train_idx) for c in clients if c.client_id != client.client_id])
    foreign = rng.permutation(others[~np.isin(labels[others], client.classes)])
    n_ood = min(int(round(config.confirmed * config.ood_fraction)), len(foreign) // 2)
    n_id = min(config.confirmed - n_ood, len(own) // 2)
    return {
        "deployed": np.concatenate([own[:n_id], foreign[:n_ood]]),
        "drifted": np.concatenate([own[n_id : 2 * n_id], foreign[n_ood : 2 * n_ood]]),
    }


def phone_data(run: RunDir, dataset, manifest: dict, config: DemoConfig) -> dict[str, PhoneData]:
    """Each tier's exported client, its ID test samples plus OOD samples (p = ood_fraction) drawn
    from the run's held-out OOD pool exactly as training's evaluation draws them."""
    info, labels = run.info, dataset.labels.numpy()
    if not info.train_config:
        raise DemoError("the run records no training configuration: the demo needs a run of `harmony train`")
    partition = client_partition(
        TrainConfig(**info.train_config), info.tiers, dataset, run.federation_secret()
    )
    clients = {c.client_id: c for c in run.clients()}
    result = {}
    rng = np.random.default_rng(config.seed)
    for entry in manifest["tiers"]:
        client = clients[entry["client_id"]]
        split = partition.clients[client.client_id]
        if split.test.tolist() != list(client.test_idx):
            raise DemoError(f"the partition recomputed for client {client.client_id} differs from the run's")
        test = np.asarray(client.test_idx)
        if config.max_test:
            test = np.sort(rng.choice(test, min(config.max_test, len(test)), replace=False))
        split = ClientSplit(client.client_id, tuple(client.classes), split.train, split.val, test)
        index, is_ood = ood_test_indices(split, labels, partition.ood_pool, config.ood_fraction, config.seed)
        confirmed = confirmation_sets(client, clients.values(), labels, config, rng)
        result[entry["name"]] = PhoneData(
            entry["name"],
            client,
            to_pixels(dataset.images[index], info.mean, info.std),
            labels[index],
            is_ood,
            confirmed,
            to_pixels(dataset.images[np.asarray(client.val_idx)], info.mean, info.std),
            labels[np.asarray(client.val_idx)],
        )
    return result


# --------------------------------------------------------------------------- phases


def classify_all(phone: Phone, data: PhoneData, report: ProgressReport) -> dict[str, Any]:
    """Run every test image through the phone (reporting the count done); metrics of this phase."""
    start_infer = phone.stats.infer_bytes
    phone.stats.local_ms.clear()
    predictions, exit_predictions, sources, features = [], [], [], []
    for done, pixels in enumerate(data.pixels, start=1):
        answer = phone.classify(pixels)
        predictions.append(answer.prediction)
        exit_predictions.append(answer.exit_prediction)
        sources.append(answer.source)
        features.append(answer.features)
        report(done, None)
    server_correct = server_predictions(phone, torch.cat(features)) == data.labels
    predictions, exit_predictions = np.array(predictions), np.array(exit_predictions)
    sources = np.array(sources)
    correct, exit_correct = predictions == data.labels, exit_predictions == data.labels
    ident = ~data.is_ood
    fallback = sources != "local"
    served = sources == "server"
    return {
        "samples": len(data.labels),
        "ood_samples": int(data.is_ood.sum()),
        "exit_rate": float((~fallback).mean()),
        "fallback_rate": float(fallback.mean()),
        "server_failures": int((sources == "local_after_server_failure").sum()),
        "accuracy_without_ood": float(correct[ident].mean()),
        "accuracy_with_ood": float(correct.mean()),
        "exit_only_accuracy_with_ood": float(exit_correct.mean()),
        "exit_only_accuracy_without_ood": float(exit_correct[ident].mean()),
        "server_fallback_accuracy": float(correct[served].mean()) if served.any() else float("nan"),
        "server_accuracy": float(server_correct.mean()),  # what the phone gets if every sample falls back
        "server_accuracy_id": float(server_correct[ident].mean()),
        "server_accuracy_ood": float(server_correct[~ident].mean()) if (~ident).any() else float("nan"),
        "median_latency_ms": statistics.median(phone.stats.local_ms),
        "threshold": phone.threshold,
        "infer_bytes": phone.stats.infer_bytes - start_infer,
    }


def server_predictions(phone: Phone, features: torch.Tensor, rows: int = 64) -> np.ndarray:
    """Measurement only (not phone traffic, not counted in its bytes): the server's answer for every
    test image's features, so drift and recovery show on all samples, not just the fallback share.
    The server answers in slots; the phone names their classes with its secret (-1: a slot with no
    class of the phone, which counts as wrong)."""
    predictions = []
    for start in range(0, len(features), rows):
        response = phone.http.post(
            f"/v2/models/{MODEL_NAME}/infer",
            content=encode_tensor(features[start : start + rows].numpy()),
            headers={"Content-Type": "application/octet-stream"},
        )
        if response.status_code != 200:
            raise DemoError(f"measurement infer failed: {response.status_code} {response.text}")
        answer = response.json()
        outputs = {o["name"]: o["data"] for o in answer["outputs"]}
        slot_classes = phone.slot_classes(answer["model_version"])
        predictions.extend(-1 if slot_classes[s] is None else slot_classes[s] for s in outputs["top_slot"])
    return np.array(predictions)


def confirm(phone: Phone, data: PhoneData, dataset, info, phase: str) -> int:
    """The user confirmed labels of some samples: seal their features + label tokens into the queue."""
    index = data.confirmed[phase]
    pixels = to_pixels(dataset.images[index], info.mean, info.std)
    _, features, _ = phone.run_front_end(pixels)
    labels = dataset.labels[index].tolist()
    for start in range(0, len(labels), UPLOAD_ROWS):  # one upload per confirmation session
        phone.confirm(features[start : start + UPLOAD_ROWS], labels[start : start + UPLOAD_ROWS])
    return len(index)


def deliver(phone: Phone, rows: int) -> dict[str, Any]:
    """Flush the phone's queue; everything must be acknowledged."""
    before = phone.stats.upload_bytes, phone.stats.uploads_acknowledged, phone.stats.duplicates
    result = phone.flush()
    if result.remaining or result.rejected:
        raise DemoError(
            f"{phone.tier}: {result.remaining} uploads still queued ({result.error}), {result.rejected} rejected"
        )
    return {
        "rows": rows,
        "upload_bytes": phone.stats.upload_bytes - before[0],
        "uploads": phone.stats.uploads_acknowledged - before[1],
        "duplicates": phone.stats.duplicates - before[2],
    }
