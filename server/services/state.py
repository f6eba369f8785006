"""The per-app state object: the settings and services one app runs with (the request dependencies
in server/routes/deps.py hand its parts to endpoints).

Everything lives on `app.state.harmony` (built by `create_app`), never in module globals, so a
test can build many apps side by side, each with its own data dir and metrics registry.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from cryptography.hazmat.primitives.asymmetric.x25519 import X25519PrivateKey
from harmony_mobile.server.core.settings import Settings
from harmony_mobile.server.services.served_files import ServedFile, served_artifacts
from harmony_mobile.server.services.served_tiers import ServedManifest, served_manifest
from harmony_mobile.server.services.store import Store

if TYPE_CHECKING:
    from harmony_mobile.server.core.metrics import ServerMetrics
    from harmony_mobile.server.core.security import RateLimiter, TokenCache
    from harmony_mobile.server.services.alignment import AlignmentWorker
    from harmony_mobile.server.services.inference import MicroBatcher
    from harmony_mobile.server.services.registry import ModelRegistry


@dataclass
class ServerState:
    settings: Settings
    admin_token: str
    store: Store
    server_key: X25519PrivateKey
    registry: ModelRegistry
    batcher: MicroBatcher
    alignment: AlignmentWorker
    metrics: ServerMetrics
    rate_limiter: RateLimiter
    token_cache: TokenCache
    manifest_text: str | None
    manifest_signature: str | None
    manifest_p256_signature: str | None
    known_tiers: frozenset[str]
    tier_families: dict[str, str | None]  # tier -> the front-end family it runs (None: not stated)
    manifest_version: str | None
    # the manifest's tiers (family, split depth) and label epoch: what uploads are checked against
    served: ServedManifest = field(init=False)
    # manifest path -> digest and size of each file phones may download (GET /v1/artifacts/...)
    artifacts: dict[str, ServedFile] = field(init=False)

    def __post_init__(self) -> None:
        self.served = served_manifest(self.manifest_text)
        self.artifacts = served_artifacts(self.manifest_text)
