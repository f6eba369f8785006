"""Manifest pieces shared by the export tests (tests/export_fixtures.py) and the golden vector
generator (tests/vectors/generate.py): stand-in artifact files and a tier entry describing them."""

from __future__ import annotations

from pathlib import Path

from harmony_mobile.export.manifest import Normalization, TensorSpec, TierEntry, artifact_entry

# (backend, quantization, path relative to the export directory)
Artifact = tuple[str, str, str]


def write_files(directory: Path, files: dict[str, bytes]) -> None:
    """Write stand-in artifacts (relative path -> bytes) below `directory`."""
    for relpath, data in files.items():
        (directory / relpath).parent.mkdir(parents=True, exist_ok=True)
        (directory / relpath).write_bytes(data)


def digits_tier_entry(
    directory: Path,
    name: str,
    artifacts: list[Artifact],
    *,
    family: str,
    split_depth: int,
    width: float,
    threshold: float,
    normalization: Normalization,
    client_id: int,
    parameters: int,
    latency_budget_ms: float,
) -> TierEntry:
    """A manifest tier of a 1x28x28, 10-class model with a 64x8x8 interface, listing `artifacts`
    (which must exist below `directory`: their digests go into the entry)."""
    return TierEntry(
        name=name,
        family=family,
        split_depth=split_depth,
        width=width,
        client_id=client_id,
        parameters=parameters,
        input=TensorSpec(name="image", shape=[1, 1, 28, 28]),
        normalization=normalization,
        outputs=[
            TensorSpec(name="exit_logits", shape=[1, 10]),
            TensorSpec(name="features", shape=[1, 64, 8, 8]),
        ],
        class_names=[str(i) for i in range(10)],
        interface_shape=[64, 8, 8],
        threshold=threshold,
        threshold_source="calibrated",
        quantization=[q for _, q, _ in artifacts],
        backends=sorted({b for b, _, _ in artifacts}),
        latency_budget_ms=latency_budget_ms,
        artifacts=[artifact_entry(directory, p, backend=b, quantization=q) for b, q, p in artifacts],
    )
