"""The manifest's `personalization` object (export/manifest.py `Personalization`) as harmony-core's
PersonalizationSpec and HarmonyKit's PersonalizationSpec read it: every key they read exists in the
schema, and HarmonyKit decodes every field (no Swift toolchain here, so the sources are read)."""

from __future__ import annotations

import re
from pathlib import Path

from harmony_mobile.export.manifest import Personalization, ProgramFile

ROOT = Path(__file__).resolve().parents[1]
SWIFT = ROOT / "ios_demo/HarmonyKit/Sources/HarmonyKit/Personalization/Personalization.swift"
JAVA = (
    ROOT
    / "android_demo/harmony-core/src/main/java/org/harmonymobile/core/personalization/PersonalizationSpec.java"
)


def swift_coding_keys(text: str) -> set[str]:
    block = re.search(r"enum CodingKeys: String, CodingKey \{(.*?)\n    \}", text, re.S).group(1)
    keys = set()
    for line in block.strip().splitlines():
        line = line.strip().removeprefix("case ").strip()
        if "=" in line:
            keys.add(line.split("=")[1].strip().strip('"'))
        else:
            keys.update(name.strip() for name in line.split(","))
    return keys


def test_harmonykit_decodes_every_personalization_field():
    assert swift_coding_keys(SWIFT.read_text()) == set(Personalization.model_fields)
    program = re.search(r"struct PersonalizationProgram[^{]*\{(.*?)\n\}", SWIFT.read_text(), re.S).group(1)
    assert set(re.findall(r"public let (\w+):", program)) == set(ProgramFile.model_fields)


def test_harmony_core_reads_only_keys_of_the_schema():
    read = set(re.findall(r'json\.\w+\("(\w+)"\)', JAVA.read_text()))
    assert read - {"path", "sha256", "size"} <= set(Personalization.model_fields)
    assert {"path", "sha256", "size"} == set(ProgramFile.model_fields)
    assert {"labels", "batch", "hidden", "parameter_names", "training_program"} <= read


def test_swift_coding_key_parser_sees_a_missing_field():
    text = SWIFT.read_text().replace('        case calibrationTarget = "calibration_target"\n', "")
    assert "calibration_target" not in swift_coding_keys(text)
