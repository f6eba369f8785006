"""A curious operator's attacks on label privacy, from what it holds (docs/PRIVACY.md).

The operator holds the server part of a run dir (run.json, checkpoints, backend.pt: never
`clients/`) and the model dir it serves (manifest, front-end .pte files, back-end). It knows the
public class-name list. It wants to *name slots*: once a slot is named, every uploaded row's token
gives that row's class away. Attacks here:

* `checkpoint_naming` (no labeled data): synthesize inputs that fire each output j of the family's
  meta front-end in the server's checkpoint (token order), run them through the served .pte, pair
  j with the served output they fire, and j with the slot of the j-th smallest token; the served
  output's position read as a class index is right if the served exit heads were in class order.
* `aux_naming` (k labeled images per class of the domain): push them through a .pte and g and
  give each class the slot its images land in most.
* `row_recovery`: label uploaded rows from their features alone (nearest class mean of k labeled
  images in g's feature space): what feature noise, not label DP, protects.

Scoring needs the truth, which only the client part holds (`RunDir.slot_to_class`).
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch
from scipy.optimize import linear_sum_assignment

from harmony_mobile.device.engine import FrontEndProgram
from harmony_mobile.federation.rounds import CHECKPOINT
from harmony_mobile.models import FamilyModel
from harmony_mobile.privacy.feature_noise import clip_rows
from harmony_mobile.run_dir import BackendFileContents, RunInfo, load_backend_file


@dataclass
class OperatorView:
    """What the attacks may read: the served manifest, one tier's .pte, the back-end."""

    manifest: dict
    program: FrontEndProgram
    backend: BackendFileContents

    @classmethod
    def load(cls, model_dir: Path, server_part: Path, tier: str) -> OperatorView:
        manifest = json.loads((Path(model_dir) / "manifest.json").read_text())
        program = FrontEndProgram((Path(model_dir) / "tiers" / tier / "front_fp32.pte").read_bytes(), tier)
        return cls(manifest, program, load_backend_file(Path(server_part) / "backend.pt"))

    @property
    def slots(self) -> int:
        return len(self.backend.slot_table)

    @torch.no_grad()
    def outputs(self, images: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """(exit logits, slot scores, back-end features) of normalized images; the features clipped
        as the lineage's phones clip theirs (the manifest says how), so g sees what it trained on."""
        logits, features = self.program.run(images)
        clip = self.manifest.get("run", {}).get("feature_clip")
        features = clip_rows(features.float(), clip) if clip else features.float()
        g = self.backend.backend
        return logits.float(), g(features)[:, : self.slots], g.features(features)


def match(score: np.ndarray) -> dict[int, int]:
    """Slot -> column of the assignment that maximizes the total score (Hungarian)."""
    rows, cols = linear_sum_assignment(-score)
    return {int(r): int(c) for r, c in zip(rows, cols, strict=True)}


def meta_front_end(server_part: Path, tier: str) -> torch.nn.Module:
    """The tier's front-end with its family's meta-weights from the server's own checkpoint."""
    info = RunInfo.model_validate_json((Path(server_part) / "run.json").read_text())
    spec = info.tiers.get(tier)
    state = torch.load(Path(server_part) / CHECKPOINT, weights_only=True)["family_weights"][spec.family]
    channels, size, _ = info.input_shape
    model = FamilyModel(spec.family, channels, size, info.num_classes, spec.width, info.interface_spec)
    model.load_state_dict(state)
    return model.eval().front_end(spec.split_depth)


def synthesize(model: torch.nn.Module, output: int, shape, images: int = 8, steps: int = 60) -> torch.Tensor:
    """Inputs that drive `model`'s exit output `output` up (gradient ascent from noise)."""
    generator = torch.Generator().manual_seed(output)
    x = (0.1 * torch.randn(images, *shape, generator=generator)).requires_grad_()
    optimizer = torch.optim.Adam([x], lr=0.1)
    for _ in range(steps):
        optimizer.zero_grad()
        logits, _ = model(x)
        (-torch.log_softmax(logits, 1)[:, output].mean() + 1e-3 * x.pow(2).mean()).backward()
        optimizer.step()
    return x.detach()


def checkpoint_naming(view: OperatorView, server_part: Path, tier: str) -> dict[int, int]:
    """No labeled data: for each output j of the checkpoint's token-ordered meta front-end, inputs
    synthesized to fire it are run through the served .pte; the served output they fire is paired
    with j, and j with the slot of the j-th smallest token."""
    model = meta_front_end(server_part, tier)
    shape = view.manifest["tiers"][0]["input"]["shape"][1:]
    classes = len(view.manifest["class_names"])
    score = np.zeros((classes, classes))
    for j in range(classes):
        served, _, _ = view.outputs(synthesize(model, j, shape))
        score[j] = torch.log_softmax(served, 1).mean(0).numpy()
    served_of_meta = match(score)  # meta output j -> served output r
    by_token = sorted(range(view.slots), key=lambda s: view.backend.slot_table.tokens[s])
    return {by_token[j]: r for j, r in served_of_meta.items() if j < len(by_token)}


def aux_naming(view: OperatorView, images: torch.Tensor, labels: torch.Tensor) -> dict[int, int]:
    """k labeled images per class: slot s is named the class whose images land in it most."""
    _, slots, _ = view.outputs(images)
    votes = np.zeros((view.slots, int(labels.max()) + 1))
    np.add.at(votes, (slots.argmax(1).numpy(), labels.numpy()), 1)
    return match(votes)


def row_recovery(view: OperatorView, rows: torch.Tensor, aux_images, aux_labels) -> torch.Tensor:
    """Each uploaded interface row's class guessed from its features alone: the nearest class mean
    of the aux images in g's feature space."""
    _, _, aux_features = view.outputs(aux_images)
    classes = int(aux_labels.max()) + 1
    means = torch.stack([aux_features[aux_labels == c].mean(0) for c in range(classes)])
    with torch.no_grad():
        row_features = view.backend.backend.features(rows.float())
    return torch.cdist(row_features, means).argmin(1)


def named_right(naming: dict[int, int], truth: torch.Tensor) -> tuple[int, int]:
    """(slots named right, slots with a class); `truth`: class id per slot (-1: none)."""
    known = [s for s in range(len(truth)) if int(truth[s]) >= 0]
    return sum(naming.get(s) == int(truth[s]) for s in known), len(known)


def aux_sample(labels: np.ndarray, k: int, exclude: np.ndarray, seed: int) -> np.ndarray:
    """Indices of k images per class, none of them a client's (the operator's own labeled data)."""
    rng = np.random.default_rng(seed)
    pool = np.setdiff1d(np.arange(len(labels)), exclude)
    return np.concatenate([rng.choice(pool[labels[pool] == c], k, replace=False) for c in np.unique(labels)])
