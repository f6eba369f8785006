"""Stage 5: a phone's on-device personalization drifts its front-end away from what the server's
back-end was trained on; the phone re-exports its .pte and recalibrates its exit threshold tau."""

from __future__ import annotations

import warnings
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F

from harmony_mobile.algorithms.base import calibrate_threshold, exit_confidence
from harmony_mobile.demo.config import DemoConfig, DemoError
from harmony_mobile.demo.phones import PhoneData
from harmony_mobile.device.engine import FrontEndProgram
from harmony_mobile.device.manifest import normalize
from harmony_mobile.run_dir import RunDir, RunInfo


def drift_front_end(run: RunDir, data: PhoneData, dataset, config: DemoConfig):
    """What a phone's on-device personalization does over time: exit-loss-only fine-tuning on its own
    labelled data. Nothing keeps the connector's features where the server expects them."""
    torch.manual_seed(config.seed)
    front_end = run.front_end(data.client).train()
    images = dataset.images[np.asarray(data.client.train_idx)]
    labels = run.exit_labels(dataset.labels[np.asarray(data.client.train_idx)])  # exits: token order
    optimizer = torch.optim.Adam(front_end.parameters(), lr=config.drift_lr)
    generator = torch.Generator().manual_seed(config.seed)
    losses = []
    for _ in range(config.drift_steps):
        batch = torch.randint(len(labels), (min(config.drift_batch, len(labels)),), generator=generator)
        logits, _ = front_end(images[batch])
        loss = F.cross_entropy(logits, labels[batch])
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        losses.append(loss.item())
    return front_end.eval(), images, float(np.mean(losses[-10:]))


def export_drifted(front_end, calibration: torch.Tensor, info, quantization: str, path: Path) -> bytes:
    """The same export steps as `harmony export` (wrap, PT2E int8, XNNPACK lowering, delegation check)."""
    from harmony_mobile.export import steps

    module = steps.wrap_front_end(front_end, tuple(info.input_shape), info.num_classes)
    with warnings.catch_warnings():  # torch 2.13 pytree FutureWarnings on every export: noise only
        warnings.simplefilter("ignore", FutureWarning)
        build = steps.build_pte(module, tuple(info.input_shape), quantization, calibration[:256], 1)
    steps.serialize(build, path)
    return path.read_bytes()


def calibration_target(info: RunInfo) -> float:
    """The local-exit accuracy target training calibrated tau with: the run's algorithm config
    (`calibration_target`, its default when the run did not override it)."""
    from harmony_mobile.algorithms.registry import build_algorithm

    algorithm = build_algorithm(info.algorithm, info.train_config.get("algorithm_config") or {})
    target = getattr(algorithm.config, "calibration_target", None)
    if target is None or algorithm.exit_rule != "max_softmax":
        raise DemoError(
            f"algorithm {info.algorithm!r} does not calibrate a max-softmax exit threshold; "
            "the device runtime exits on max softmax >= tau"
        )
    return float(target)


def calibrate_on_device(
    program: FrontEndProgram, data: PhoneData, normalization: dict, target: float, exit_labels
) -> float:
    """What a phone does after personalizing its front-end: tau from its own held-out ID samples run
    through the .pte it answers with; the same rule and target as training's `calibrate_client`.
    `exit_labels` maps class ids to exit outputs (token order, through the phone's secret)."""
    logits, _ = program.run(normalize(data.val_pixels, normalization))
    logits = logits.float()
    correct = logits.argmax(dim=1) == exit_labels(torch.as_tensor(data.val_labels))
    return calibrate_threshold(exit_confidence(logits, "max_softmax"), correct, target)


def feature_shift(program_before: FrontEndProgram, program_after: FrontEndProgram, images) -> float:
    """Relative L2 change of the interface features on the same images."""
    _, before = program_before.run(images)
    _, after = program_after.run(images)
    return float((after - before).norm() / before.norm())
