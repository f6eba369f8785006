"""Personalization on the phone: train the exit classifier through the export's ExecuTorch training
program, answer with the trained parameters, recalibrate the exit threshold on own samples.

What a phone does (the tier's `personalization` entry in the signed manifest names the programs,
export/personalization.py builds them):

  1. run `frozen_program` (XNNPACK) once over its own labelled samples: (exit_hidden, features);
  2. map each sample's class to its exit position through the federation secret (the exit head's
     outputs are in token order: `Phone.exit_positions`), never feeding class ids to training;
  3. take SGD steps through `training_program` with ExecuTorch's TrainingModule, batches of exactly
     the manifest's `batch` rows drawn from its samples;
  4. answer with `frozen_program` + `head_program` fed the trained parameters (`PersonalizedFrontEnd`),
     and recalibrate tau on its own validation samples with the rule training uses.

Nothing here imports the training code: tensors are only the ExecuTorch binding's array type (no
autograd, no optimizer of PyTorch's). The trained parameters stay on the phone; their rows are exit
positions, so nothing class-ordered is produced. Counterparts: harmony-core
`org.harmonymobile.core.personalization` (Personalizer, TrainingModule); HarmonyKit
`Personalization/` (a contract type: ExecuTorch's Swift/ObjC bindings expose no training API).
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import torch

from harmony_mobile.device.engine import FrontEndProgram
from harmony_mobile.device.errors import DeviceError
from harmony_mobile.device.manifest import find_tier_entry, normalize, read_verified_artifact
from harmony_mobile.logs import native_stderr_to_log_file


def personalization_entry(manifest: dict, tier: str) -> dict:
    entry = find_tier_entry(manifest, tier).get("personalization")
    if entry is None:
        raise DeviceError(f"tier {tier} of this export ships no personalization programs (export it again)")
    return entry


def batch_indices(samples: int, batch: int, steps: int, seed: int) -> np.ndarray:
    """(steps, batch) sample indices drawn with replacement: every step has exactly `batch` rows
    (the training program's shape), however few samples the phone has."""
    if samples < 1:
        raise DeviceError("personalization needs at least one labelled sample")
    return np.random.default_rng(seed).integers(0, samples, size=(steps, batch))


def calibrate_exit_threshold(confidences, correct, target_accuracy: float) -> float:
    """The most permissive tau (exit iff confidence >= tau) whose local-exit accuracy on the
    validation samples reaches the target; above every confidence when none does (everything
    falls back). The rule training calibrates with (docs/ALGORITHM.md: Inference)."""
    scores = np.asarray(confidences, dtype=np.float32)
    order = np.argsort(-scores, kind="stable")
    sorted_scores = scores[order]
    accuracy = np.cumsum(np.asarray(correct, dtype=np.float64)[order]) / np.arange(1, len(order) + 1)
    last_of_tie = np.append(sorted_scores[1:] < sorted_scores[:-1], True)  # a tau exits its whole tie
    reachable = np.flatnonzero((accuracy >= target_accuracy) & last_of_tie)
    if len(reachable) == 0:
        return float(np.nextafter(sorted_scores[0], np.float32(np.inf))) if len(scores) else 1.0
    return float(sorted_scores[reachable.max()])


class TrainingProgram:
    """A training .pte on ExecuTorch's TrainingModule with its SGD optimizer."""

    def __init__(self, program: bytes, entry: dict, learning_rate: float | None = None):
        with native_stderr_to_log_file():
            from executorch.extension.training import (
                _load_for_executorch_for_training_from_buffer,
                get_sgd_optimizer,
            )

            self.module = _load_for_executorch_for_training_from_buffer(program)
        self._program = program  # the module reads this buffer in place: keep it alive with the module
        self.method = entry["method"]
        self.batch = int(entry["batch"])
        self.parameter_names = list(entry["parameter_names"])
        self.learning_rate = float(learning_rate if learning_rate is not None else entry["learning_rate"])
        self._make_optimizer = get_sgd_optimizer
        self.optimizer = None

    def step(self, hidden: torch.Tensor, exit_positions: torch.Tensor) -> float:
        """One forward-backward + SGD step on exactly `batch` rows; returns the loss before the step."""
        if hidden.shape[0] != self.batch or exit_positions.shape != (self.batch,):
            raise DeviceError(f"a training step takes exactly {self.batch} rows, got {tuple(hidden.shape)}")
        outputs = self.module.forward_backward(self.method, (hidden.contiguous(), exit_positions.long()))
        if self.optimizer is None:  # named_parameters exist only after a first forward_backward
            self.optimizer = self._make_optimizer(
                self.module.named_parameters(), self.learning_rate, 0, 0, 0, False
            )
        self.optimizer.step(self.module.named_gradients())
        return float(outputs[0])

    def parameters(self) -> list[torch.Tensor]:
        """Copies of the current parameters in the manifest's order (the head program's inputs)."""
        if self.optimizer is None:
            raise DeviceError(
                "no training step ran yet: the program's parameters are not readable before one"
            )
        named = self.module.named_parameters()
        if sorted(named) != sorted(self.parameter_names):
            raise DeviceError(f"training program parameters {sorted(named)} are not the manifest's")
        return [named[name].clone() for name in self.parameter_names]


class HeadProgram:
    """The head .pte: (exit_hidden, *trained parameters) -> exit_logits, run `batch` rows at a time."""

    def __init__(self, program: bytes):
        with native_stderr_to_log_file():
            from executorch.runtime import Runtime

            self._program = Runtime.get().load_program(program)
            self.method = self._program.load_method("forward")
        self.batch = int(self.method.metadata.input_tensor_meta(0).sizes()[0])
        self.size = len(program)

    def logits(self, hidden: torch.Tensor, parameters: list[torch.Tensor]) -> torch.Tensor:
        rows = []
        for start in range(0, len(hidden), self.batch):
            chunk = hidden[start : start + self.batch].contiguous()
            padded = torch.cat([chunk, torch.zeros(self.batch - len(chunk), hidden.shape[1])])
            rows.append(self.method.execute([padded, *parameters])[0][: len(chunk)].clone())
        return torch.cat(rows)


class PersonalizedFrontEnd:
    """The front-end after personalization: frozen program + head program with trained parameters.
    Same interface as FrontEndProgram: normalized images -> (exit_logits, features)."""

    def __init__(
        self, frozen: FrontEndProgram, head: bytes, parameters: list[torch.Tensor], description: str = ""
    ):
        self.frozen = frozen
        self.head = HeadProgram(head)
        self.parameters = [p.clone() for p in parameters]
        self.description = description
        self.size = frozen.size + self.head.size

    def run(self, images: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        hidden, features = self.frozen.run(images)
        return self.head.logits(hidden, self.parameters), features


@dataclass
class TrainingResult:
    steps: int
    losses: list[float] = field(repr=False)
    seconds: float
    threshold: float | None = None
    val_samples: int = 0

    @property
    def steps_per_second(self) -> float:
        return self.steps / self.seconds if self.seconds > 0 else float("inf")


class Personalizer:
    """One tier's personalization programs, verified against the signed manifest before loading."""

    def __init__(self, export_dir: str | Path, manifest: dict, tier: str, learning_rate: float | None = None):
        self.entry = personalization_entry(manifest, tier)
        self.tier = tier
        read = lambda key: read_verified_artifact(export_dir, self.entry[key])  # noqa: E731
        self.frozen = FrontEndProgram(read("frozen_program"), self.entry["frozen_program"]["path"])
        self.head = read("head_program")
        self.training = TrainingProgram(read("training_program"), self.entry, learning_rate)

    def train(self, hidden: torch.Tensor, exit_positions, steps: int, seed: int) -> TrainingResult:
        """`steps` SGD steps on the phone's own (exit_hidden, exit position) rows."""
        positions = torch.as_tensor(np.asarray(exit_positions), dtype=torch.int64)
        if len(positions) != len(hidden):
            raise DeviceError(f"{len(hidden)} samples but {len(positions)} exit positions")
        indices = torch.as_tensor(batch_indices(len(hidden), self.training.batch, steps, seed))
        started, losses = time.perf_counter(), []
        for rows in indices:
            losses.append(self.training.step(hidden[rows], positions[rows]))
        return TrainingResult(steps, losses, time.perf_counter() - started)

    def front_end(self) -> PersonalizedFrontEnd:
        return PersonalizedFrontEnd(
            self.frozen, self.head, self.training.parameters(), f"{self.tier} personalized on device"
        )


def recalibrate(front_end, val_images: torch.Tensor, val_positions, target: float, scores=None) -> float:
    """tau of `front_end` on the phone's own validation samples (labels as exit positions), on the
    score the phone exits by (`scores(logits, features)`, `Phone.exit_scores`; default max softmax
    in float32, as the phone compares it with tau)."""
    logits, features = front_end.run(val_images)
    logits = logits.float()
    if scores is None:
        confidence = torch.softmax(logits, dim=1).max(dim=1).values
    else:
        confidence = scores(logits, features)
    correct = logits.argmax(dim=1) == torch.as_tensor(np.asarray(val_positions), dtype=torch.int64)
    return calibrate_exit_threshold(confidence.numpy(), correct.numpy(), target)


def personalize_phone(
    phone,
    personalizer: Personalizer,
    own: tuple[torch.Tensor, list[int]],
    validation: tuple[torch.Tensor, list[int]],
    *,
    steps: int,
    seed: int,
    model_version: str,
    target: float | None = None,
) -> TrainingResult:
    """The whole on-device round: `own` and `validation` are the phone's (pixels, class ids); class
    ids become exit positions here, on the phone. Trains, switches the phone to the personalized
    front-end and (for a calibrated tier) to tau recalibrated on the validation samples."""
    images = normalize(own[0], phone.normalization)
    hidden, _ = personalizer.frozen.run(images)
    result = personalizer.train(hidden, phone.exit_positions(own[1]), steps, seed)
    front_end = personalizer.front_end()
    threshold = phone.threshold
    target = personalizer.entry.get("calibration_target") if target is None else target
    if phone.entry["threshold_source"] == "calibrated" and target is not None:
        val_images = normalize(validation[0], phone.normalization)
        positions = phone.exit_positions(validation[1])
        threshold = recalibrate(front_end, val_images, positions, target, phone.exit_scores)
        result.val_samples = len(val_images)
    result.threshold = threshold
    phone.use_local_front_end(front_end, threshold=threshold, model_version=model_version)
    return result
