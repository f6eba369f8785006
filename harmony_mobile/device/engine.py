"""Running a tier's front-end: the verified .pte on the ExecuTorch runtime, image -> (exit logits, features).

Counterparts: harmony-core `org.harmonymobile.core.engine` (InferenceEngine, FrontEndOutput,
SerializedEngine); HarmonyKit `Engine/` (InferenceEngine.swift, CoreMLEngine.swift) and the
HarmonyKitExecuTorch package (ExecuTorchEngine.swift). The artifact check before loading is
ManifestVerifier's file check in both.
"""

from __future__ import annotations

from pathlib import Path

import torch

from harmony_mobile.device.manifest import (
    choose_artifact,
    find_tier_entry,
    pte_artifact,
    read_verified_artifact,
)
from harmony_mobile.logs import native_stderr_to_log_file


class FrontEndProgram:
    """One tier's .pte, loaded with the ExecuTorch runtime: image (1, C, H, W) -> (exit_logits, features)."""

    def __init__(self, program: bytes, description: str = ""):
        self.description = description
        self.size = len(program)
        with native_stderr_to_log_file():  # creating the threadpool, if not yet done, prints cpuinfo lines
            from executorch.runtime import Runtime

            self._program = Runtime.get().load_program(program)  # kept alive with its method
            self.method = self._program.load_method("forward")
        self.batch = int(self.method.metadata.input_tensor_meta(0).sizes()[0])

    def run(self, images: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Outputs for a batch of normalized images, run `self.batch` rows at a time."""
        logits, features = [], []
        for start in range(0, len(images), self.batch):
            chunk = images[start : start + self.batch].contiguous()
            if len(chunk) < self.batch:  # a static-batch program: pad, then drop the padding
                pad = torch.zeros(self.batch - len(chunk), *chunk.shape[1:])
                out = self.method.execute([torch.cat([chunk, pad])])
                out = [o[: len(chunk)] for o in out]
            else:
                out = self.method.execute([chunk])
            logits.append(out[0].clone())
            features.append(out[1].clone())
        return torch.cat(logits), torch.cat(features)


def load_front_end(
    export_dir: str | Path, manifest: dict, tier: str, quantization: str | None = None
) -> FrontEndProgram:
    """The tier's .pte after checking its sha256 and size against the (verified) manifest: the
    given quantization, or by default the variant `choose_artifact` prefers (a passing one first)."""
    entry = find_tier_entry(manifest, tier)
    artifact = choose_artifact(entry) if quantization is None else pte_artifact(entry, quantization)
    return FrontEndProgram(read_verified_artifact(export_dir, artifact), artifact["path"])
