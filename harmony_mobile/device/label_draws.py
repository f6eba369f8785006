"""Label DP's draws, kept on the phone: one randomized class per confirmed sample, for good.

Randomized response protects a label only if it is drawn once per sample: a phone that drew again
each time a sample is uploaded would let the server average the draws back to the true class.
So the draw is stored in device-local storage (a 0600 JSON file next to the upload queue), keyed
by a sample id, and reused for every later upload of that sample (a new draw only when the user
confirms another label for it). The draws come from the phone's CSPRNG-seeded generator.
"""

from __future__ import annotations

import hashlib
import json
import os
from pathlib import Path

import torch

from harmony_mobile.files import open_private
from harmony_mobile.privacy.label_dp import randomized_response


def feature_sample_ids(features: torch.Tensor) -> list[str]:
    """A default sample id: the SHA-256 of the row's features before noise (the same image through
    the same front-end gives the same id; pass your own ids to keep draws across model updates)."""
    rows = features.detach().float().contiguous().numpy()
    return [hashlib.sha256(row.tobytes()).hexdigest() for row in rows]


class LabelDraws:
    def __init__(self, path: str | Path):
        self.path = Path(path)
        self._draws: dict[str, list[int]] = json.loads(self.path.read_text()) if self.path.is_file() else {}

    def randomize(
        self, sample_ids: list[str], labels: torch.Tensor, epsilon: float, classes: int, generator
    ) -> torch.Tensor:
        """Each sample's stored draw if its confirmed label is unchanged, else a new one (saved)."""
        fresh = randomized_response(labels, epsilon, classes, generator)
        out = []
        for sample_id, label, new in zip(sample_ids, labels.tolist(), fresh.tolist(), strict=True):
            stored = self._draws.get(sample_id)
            if stored is None or stored[0] != label:
                self._draws[sample_id] = stored = [label, new]
            out.append(stored[1])
        self._save()
        return torch.tensor(out, dtype=torch.int64)

    def _save(self) -> None:
        temporary = self.path.with_name(f".tmp-{self.path.name}")
        with open_private(temporary, "w") as out:
            json.dump(self._draws, out)
            out.flush()
            os.fsync(out.fileno())
        temporary.replace(self.path)  # atomic: a crash keeps the old draws or the new, never half
