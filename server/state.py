"""The per-app state object and the FastAPI dependencies that hand its parts to endpoints.

Everything lives on `app.state.harmony` (built by `create_app`), never in module globals, so a
test can build many apps side by side, each with its own data dir and metrics registry.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Annotated

from cryptography.hazmat.primitives.asymmetric.x25519 import X25519PrivateKey
from fastapi import Depends, Request
from harmony_mobile.server.served_files import ServedFile, served_artifacts
from harmony_mobile.server.served_tiers import ServedManifest, served_manifest
from harmony_mobile.server.settings import Settings
from harmony_mobile.server.store import Store

if TYPE_CHECKING:
    from harmony_mobile.server.alignment import AlignmentWorker
    from harmony_mobile.server.auth import RateLimiter, TokenCache
    from harmony_mobile.server.inference import MicroBatcher
    from harmony_mobile.server.metrics import ServerMetrics
    from harmony_mobile.server.registry import ModelRegistry


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


async def get_state(request: Request) -> ServerState:
    # async: a plain `def` dependency would cost a thread-pool hop on every request
    return request.app.state.harmony


StateDep = Annotated[ServerState, Depends(get_state)]


async def get_settings(state: StateDep) -> Settings:
    return state.settings


async def get_store(state: StateDep) -> Store:
    return state.store


SettingsDep = Annotated[Settings, Depends(get_settings)]
StoreDep = Annotated[Store, Depends(get_store)]
