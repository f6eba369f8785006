"""Stage 5: a phone personalizes on device: it trains its exit classifier through the export's
ExecuTorch training program (personalize_train.pte, TrainingModule + SGD, labels as exit positions
through its secret), answers with the trained parameters and recalibrates its exit threshold tau.
The same steps run in eager PyTorch beside it (same rows, same seed) for the steps/s ratio and the
loss gap. Only the exit classifier trains (export/personalization.py says why), so the interface
features the server sees do not move."""

from __future__ import annotations

import time
from pathlib import Path

import numpy as np
import torch

from harmony_mobile.algorithms.base import calibrate_threshold
from harmony_mobile.demo.config import DemoConfig, DemoError
from harmony_mobile.demo.phones import PhoneData, to_pixels
from harmony_mobile.device.engine import FrontEndProgram
from harmony_mobile.device.manifest import EXIT_RULES, normalize
from harmony_mobile.device.personalization import Personalizer, batch_indices, personalize_phone
from harmony_mobile.device.phone import Phone
from harmony_mobile.run_dir import RunDir, RunInfo


def own_samples(run: RunDir, data: PhoneData, dataset) -> tuple[np.ndarray, list[int]]:
    """The phone's own labelled samples (its client's training split) as the camera gave them:
    pixels 0..255 and class ids (the phone maps them to exit positions itself)."""
    index = np.asarray(data.client.train_idx)
    pixels = to_pixels(dataset.images[index], run.info.mean, run.info.std)
    return pixels, [int(c) for c in dataset.labels[index]]


def eager_steps(
    front_end, hidden: torch.Tensor, positions: torch.Tensor, indices, lr: float
) -> tuple[list, float]:
    """The same SGD steps in eager PyTorch (the reference for speed and loss): (losses, seconds)."""
    from harmony_mobile.export.personalization import TrainedPart

    part = TrainedPart(front_end, "exit_classifier")
    optimizer = torch.optim.SGD(part.parameters(), lr=lr)
    losses, started = [], time.perf_counter()
    for rows in torch.as_tensor(indices):
        loss, _ = part(hidden[rows], positions[rows])
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        losses.append(loss.item())
    return losses, time.perf_counter() - started


def personalize_on_device(
    export_dir: Path, run: RunDir, phone: Phone, data: PhoneData, dataset, config: DemoConfig, target: float
) -> dict:
    """Train through the .pte on the phone, switch it to the result; what changed and how fast."""
    personalizer = Personalizer(export_dir, phone.manifest, phone.tier, learning_rate=config.drift_lr)
    pixels, class_ids = own_samples(run, data, dataset)
    probe = normalize(data.pixels[:64], phone.normalization)
    deployed_program = phone.program
    result = personalize_phone(
        phone,
        personalizer,
        (pixels, class_ids),
        (data.val_pixels, [int(c) for c in data.val_labels]),
        steps=config.drift_steps,
        seed=config.seed,
        model_version=f"{phone.manifest['model_version']}+local-1",
        target=target,
    )
    hidden, _ = personalizer.frozen.run(normalize(pixels, phone.normalization))
    indices = batch_indices(len(hidden), personalizer.training.batch, config.drift_steps, config.seed)
    eager_losses, eager_seconds = eager_steps(
        run.front_end(data.client),
        hidden,
        phone.exit_positions(class_ids),
        indices,
        personalizer.training.learning_rate,
    )
    np.savez(  # the trained parameters stay on the phone (its simulated storage)
        config.out / "phones" / phone.tier / "personalized_parameters.npz",
        **dict(
            zip(
                personalizer.training.parameter_names,
                [p.numpy() for p in phone.program.parameters],
                strict=True,
            )
        ),
    )
    eager_rate = config.drift_steps / eager_seconds
    return {
        "trained_through": personalizer.entry["training_program"]["path"],
        "runtime": "ExecuTorch TrainingModule + SGD (executorch.extension.training)",
        "scope": personalizer.entry["scope"],
        "steps": config.drift_steps,
        "batch": personalizer.training.batch,
        "learning_rate": personalizer.training.learning_rate,
        "final_exit_loss": float(np.mean(result.losses[-10:])),
        "final_exit_loss_eager": float(np.mean(eager_losses[-10:])),
        "loss_max_abs_vs_eager": float(np.max(np.abs(np.subtract(result.losses, eager_losses)))),
        "steps_per_second_pte": result.steps_per_second,
        "steps_per_second_eager": eager_rate,
        "pte_vs_eager_speed": result.steps_per_second / eager_rate,
        "feature_shift": feature_shift(deployed_program, phone.program, probe),
        "threshold_drifted": result.threshold,
        "val_samples": result.val_samples,
    }


def calibration_target(info: RunInfo) -> float:
    """The local-exit accuracy target training calibrated tau with: the run's algorithm config
    (`calibration_target`, its default when the run did not override it)."""
    from harmony_mobile.algorithms.registry import run_exit_gate

    rule, target = run_exit_gate(info)
    if target is None or rule not in EXIT_RULES:
        raise DemoError(
            f"algorithm {info.algorithm!r} does not calibrate a threshold on a score the device "
            f"runtime computes ({' or '.join(EXIT_RULES)})"
        )
    return float(target)


def calibrate_on_device(
    phone: Phone, program: FrontEndProgram, data: PhoneData, target: float, exit_labels
) -> float:
    """What a phone does after personalizing its front-end: tau from its own held-out ID samples run
    through the .pte it answers with, on the score it exits by (`Phone.exit_scores`); the same rule
    and target as training's `calibrate_client`. `exit_labels` maps class ids to exit outputs (token
    order, through the phone's secret)."""
    logits, features = program.run(normalize(data.val_pixels, phone.normalization))
    logits = logits.float()
    correct = logits.argmax(dim=1) == exit_labels(torch.as_tensor(data.val_labels))
    return calibrate_threshold(phone.exit_scores(logits, features).float(), correct, target)


def feature_shift(program_before: FrontEndProgram, program_after: FrontEndProgram, images) -> float:
    """Relative L2 change of the interface features on the same images."""
    _, before = program_before.run(images)
    _, after = program_after.run(images)
    return float((after - before).norm() / before.norm())
