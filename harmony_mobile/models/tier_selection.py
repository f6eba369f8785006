"""Which exported tier a phone runs: the reference of the rule harmony-core (Java `TierSelector`,
`DeviceClass`) and HarmonyKit (Swift `TierSelector`) implement; tests/vectors/tier_selection.json
holds its answers so all three stay the same.

Device classes, from what a phone reports:

* entry: a low-RAM device, at most 3 GiB - 1 MiB of RAM, no big core, or Android API <= 28;
* flagship: at least 6 GiB - 512 MiB of RAM ("6 GB" phones report a little less), at least two big
  cores, and an NPU;
* mid: everything in between.

A class affords tiers up to a relative cost (split depth x width^2: stages times channels squared):
entry 1.5, mid 4, flagship any. The phone runs the most expensive affordable tier that has an
artifact for a backend of its platform (Android: XNNPACK; iOS: XNNPACK or Core ML); if none is
affordable, the cheapest runnable one. Ties in cost prefer (1) tiers whose backends all run on the
platform, (2) on iOS with a Neural Engine, tiers with a Core ML artifact, (3) the smaller name.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

ENTRY_MAX_RAM_MB = 3 * 1024 - 1
FLAGSHIP_MIN_RAM_MB = 6 * 1024 - 512
ENTRY_MAX_ANDROID_API = 28
MAX_RELATIVE_COST = {"entry": 1.5, "mid": 4.0, "flagship": math.inf}
PLATFORM_BACKENDS = {"android": frozenset({"xnnpack"}), "ios": frozenset({"xnnpack", "coreml"})}


class NoRunnableTier(ValueError):
    """No tier has an artifact for a backend of the phone's platform."""


@dataclass(frozen=True)
class DeviceCapabilities:
    platform: str  # "android" | "ios"
    total_ram_mb: int
    big_cores: int
    has_npu: bool
    os_version: int  # Android API level, or the iOS major version
    low_ram_device: bool = False

    def __post_init__(self) -> None:
        if self.platform not in PLATFORM_BACKENDS:
            raise ValueError(f"platform must be android or ios, got {self.platform!r}")
        if self.total_ram_mb <= 0 or self.big_cores < 0:
            raise ValueError("RAM must be positive and big cores non-negative")


@dataclass(frozen=True)
class TierOption:
    name: str
    split_depth: int
    width: float
    backends: tuple[str, ...]  # the tier's declared backends
    artifact_backends: tuple[str, ...]  # the backends it has an artifact for

    @property
    def relative_cost(self) -> float:
        return self.split_depth * self.width * self.width


def device_class(device: DeviceCapabilities) -> str:
    old_android = device.platform == "android" and device.os_version <= ENTRY_MAX_ANDROID_API
    if (
        device.low_ram_device
        or device.total_ram_mb <= ENTRY_MAX_RAM_MB
        or device.big_cores == 0
        or old_android
    ):
        return "entry"
    if device.total_ram_mb >= FLAGSHIP_MIN_RAM_MB and device.big_cores >= 2 and device.has_npu:
        return "flagship"
    return "mid"


def select_tier(tiers: list[TierOption], device: DeviceCapabilities) -> TierOption:
    runnable = PLATFORM_BACKENDS[device.platform]
    candidates = [t for t in tiers if runnable & set(t.artifact_backends)]
    if not candidates:
        raise NoRunnableTier(f"no tier has an artifact for backends {sorted(runnable)} of {device.platform}")
    prefer_coreml = device.platform == "ios" and device.has_npu

    def preference(tier: TierOption) -> tuple:
        return (
            tier.relative_cost,
            set(tier.backends) <= runnable,
            prefer_coreml and "coreml" in tier.backends,
        )

    budget = MAX_RELATIVE_COST[device_class(device)]
    affordable = [t for t in candidates if t.relative_cost <= budget]
    if not affordable:
        cheapest = min(t.relative_cost for t in candidates)
        affordable = [t for t in candidates if t.relative_cost == cheapest]
    # max() keeps the first of equal keys: iterate by name so the smaller name wins a full tie.
    return max(sorted(affordable, key=lambda t: t.name), key=preference)
