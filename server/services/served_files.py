"""The served manifest's artifacts, for phones that install it (docs/PROTOCOL.md 2.3).

`GET /v1/artifacts/{path}` answers a file the served manifest names for phones to load: each tier
artifact (an .mlpackage file by file, as the manifest's `files` list it), each tier's
personalization programs and the slot prototypes slot_margin tiers gate by. Nothing else in the
model dir is served (not the back-end's weights, not the reports). The request path is only ever a key into that table, built from the manifest at
start; it is never joined onto the filesystem, so no path of a request can reach another file.
"""

from __future__ import annotations

import json
import logging
from dataclasses import dataclass

log = logging.getLogger("harmony_mobile.server")
PERSONALIZATION_PROGRAMS = ("frozen_program", "training_program", "head_program")


@dataclass(frozen=True)
class ServedFile:
    sha256: str
    size: int


def _phone_paths(manifest: dict) -> tuple[set[str], set[str]]:
    """(file paths, directory artifact paths) of what phones load: tier artifacts, personalization,
    the slot prototypes a slot_margin tier gates by."""
    files: set[str] = set()
    if manifest.get("slot_prototypes"):
        files.add(manifest["slot_prototypes"]["path"])
    for tier in manifest.get("tiers", []):
        for artifact in tier.get("artifacts", []):
            files.add(artifact["path"])
        personalization = tier.get("personalization") or {}
        files.update(
            personalization[key]["path"] for key in PERSONALIZATION_PROGRAMS if key in personalization
        )
    return files, {path + "/" for path in files}


def served_artifacts(manifest_text: str | None) -> dict[str, ServedFile]:
    """Manifest path -> its `files` entry, for every file a phone loads; {} without a usable manifest.
    A directory artifact (.mlpackage) is served as the files the manifest lists under it."""
    try:
        manifest = json.loads(manifest_text) if manifest_text is not None else {}
        wanted, directories = _phone_paths(manifest)
        table = {
            entry["path"]: ServedFile(entry["sha256"], entry["size"])
            for entry in manifest.get("files", [])
            if entry["path"] in wanted or entry["path"].startswith(tuple(directories))
        }
    except (json.JSONDecodeError, AttributeError, KeyError, TypeError):
        log.warning("manifest.json does not list its artifacts as an export does; serving none")
        return {}
    # defence in depth: the manifest is signed by the operator, but a path outside the model dir
    # must never be served even so
    return {path: file for path, file in table.items() if _contained(path)}


def _contained(path: str) -> bool:
    parts = path.split("/")
    return (
        bool(path) and not path.startswith("/") and "\\" not in path and ".." not in parts and "" not in parts
    )
