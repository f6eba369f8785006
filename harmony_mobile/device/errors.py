"""The one error the device runtime raises when it cannot trust or use what it was given.

Counterparts: harmony-core splits this per Java package (`manifest.ManifestException`,
`server.ServerException`, `engine.InferenceException`); HarmonyKit uses `HarmonyFormatError`
(Util/Bytes.swift) and `ServerError` (Net/HarmonyHTTPClient.swift).
"""

from __future__ import annotations


class DeviceError(RuntimeError):
    """The device cannot trust or load what it was given (bad signature, hash mismatch, unknown tier)."""
