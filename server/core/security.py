"""Token helpers, the per-device rate limit and the device-token cache: plain objects with no
FastAPI in them (server/routes/deps.py turns them into the request dependencies)."""

from __future__ import annotations

import hashlib
import secrets
import threading
import time

from harmony_mobile.server.core.records import DeviceRecord


def new_device_token() -> str:
    return secrets.token_urlsafe(32)


def hash_token(token: str) -> str:
    """Device tokens are 256-bit random strings, so a plain SHA-256 is enough (no password stretching)."""
    return hashlib.sha256(token.encode("utf-8")).hexdigest()


class RateLimiter:
    """A token bucket per device: `rate` requests per second sustained, `burst` at once."""

    def __init__(self, rate: float, burst: int):
        self.rate, self.burst = rate, burst
        self._buckets: dict[str, tuple[float, float]] = {}
        self._lock = threading.Lock()

    def acquire(self, key: str) -> float:
        """0 if allowed, else the seconds until one request would be."""
        now = time.monotonic()
        with self._lock:
            tokens, last = self._buckets.get(key, (float(self.burst), now))
            tokens = min(float(self.burst), tokens + (now - last) * self.rate)
            if tokens >= 1.0:
                self._buckets[key] = (tokens - 1.0, now)
                return 0.0
            self._buckets[key] = (tokens, now)
            return (1.0 - tokens) / self.rate


class TokenCache:
    """Device look-ups by token hash, reused for `ttl` seconds: most requests then skip the store and
    the thread-pool hop. Revocation in this process forgets the device at once; other replicas
    see it when their entry expires (README: replicas)."""

    def __init__(self, ttl: float):
        self.ttl = ttl
        self._entries: dict[str, tuple[DeviceRecord, float]] = {}

    def get(self, token_hash: str) -> DeviceRecord | None:
        entry = self._entries.get(token_hash)
        if entry is None or entry[1] < time.monotonic():
            return None
        return entry[0]

    def put(self, token_hash: str, device: DeviceRecord) -> None:
        if self.ttl > 0:
            if len(self._entries) > 100_000:  # bounded: drop everything rather than grow forever
                self._entries.clear()
            self._entries[token_hash] = (device, time.monotonic() + self.ttl)

    def forget_device(self, device_id: str) -> None:
        for token_hash in [h for h, (d, _) in self._entries.items() if d.id == device_id]:
            self._entries.pop(token_hash, None)
