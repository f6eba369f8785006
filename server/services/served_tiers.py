"""What an upload is checked against besides the registry: the served manifest's tiers (family and
split depth of each), its label epoch and the upload protections its `run` turns on, else the
built-in tier table (docs/PROTOCOL.md 4.5).

A phone copies `family` and `split_depth` from its manifest tier into every upload, so a row whose
depth is not its tier's was extracted by a front-end the server does not know: refusing it names
the client bug instead of storing rows no round can use.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass, field

from harmony_mobile.models import load_tiers


@dataclass(frozen=True)
class ServedTier:
    family: str | None  # None: the manifest does not say (then any known family is accepted)
    split_depth: int | None  # None: the manifest does not say (then any depth >= 1 is accepted)


@dataclass(frozen=True)
class ServedManifest:
    tiers: dict[str, ServedTier]
    label_epoch: str | None  # of the manifest's model_version (its lineage)
    # upload metadata key -> the value the manifest's `run` applies to every upload of the lineage
    protections: dict[str, float] = field(default_factory=dict)


# upload metadata key -> the manifest `run` key that turns that protection on (PROTOCOL.md 4.4)
RUN_PROTECTIONS = {
    "label_dp_epsilon": "label_dp_epsilon",
    "clip_norm": "feature_clip",
    "noise_multiplier": "noise_multiplier",
}


def _tier(entry: dict) -> ServedTier:
    family, depth = entry.get("family"), entry.get("split_depth")
    return ServedTier(
        family if isinstance(family, str) else None,
        depth if type(depth) is int and depth >= 1 else None,
    )


def _run_protections(run: object) -> dict[str, float]:
    """The protections `run` turns on (a JSON number; absent or null = off)."""
    if not isinstance(run, dict):
        return {}
    return {
        key: float(run[run_key])
        for key, run_key in RUN_PROTECTIONS.items()
        if type(run.get(run_key)) in (int, float) and math.isfinite(run[run_key])
    }


def served_manifest(manifest_text: str | None) -> ServedManifest:
    """The manifest's tiers and label epoch; without a usable manifest, the built-in tier table."""
    try:
        manifest = json.loads(manifest_text) if manifest_text is not None else None
    except json.JSONDecodeError:
        manifest = None
    if isinstance(manifest, dict) and isinstance(manifest.get("tiers"), list):
        tiers = {
            entry["name"]: _tier(entry)
            for entry in manifest["tiers"]
            if isinstance(entry, dict) and isinstance(entry.get("name"), str)
        }
        epoch = manifest.get("label_epoch")
        if tiers:
            epoch = epoch if isinstance(epoch, str) else None
            return ServedManifest(tiers, epoch, _run_protections(manifest.get("run")))
    return ServedManifest({t.name: ServedTier(t.family, t.split_depth) for t in load_tiers().tiers}, None)
