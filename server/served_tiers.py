"""What an upload is checked against besides the registry: the served manifest's tiers (family and
split depth of each) and its label epoch, else the built-in tier table (docs/PROTOCOL.md 4.5).

A phone copies `family` and `split_depth` from its manifest tier into every upload, so a row whose
depth is not its tier's was extracted by a front-end the server does not know: refusing it names
the client bug instead of storing rows no round can use.
"""

from __future__ import annotations

import json
from dataclasses import dataclass

from harmony_mobile.models import load_tiers


@dataclass(frozen=True)
class ServedTier:
    family: str | None  # None: the manifest does not say (then any known family is accepted)
    split_depth: int | None  # None: the manifest does not say (then any depth >= 1 is accepted)


@dataclass(frozen=True)
class ServedManifest:
    tiers: dict[str, ServedTier]
    label_epoch: str | None  # of the manifest's model_version (its lineage)


def _tier(entry: dict) -> ServedTier:
    family, depth = entry.get("family"), entry.get("split_depth")
    return ServedTier(
        family if isinstance(family, str) else None,
        depth if type(depth) is int and depth >= 1 else None,
    )


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
            return ServedManifest(tiers, epoch if isinstance(epoch, str) else None)
    return ServedManifest({t.name: ServedTier(t.family, t.split_depth) for t in load_tiers().tiers}, None)
