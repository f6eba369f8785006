"""The app factory: `create_app(settings)` wires store, keys, registry, batcher, alignment worker,
metrics and routers into one FastAPI app whose state lives on `app.state.harmony`."""

from __future__ import annotations

import asyncio
import json
import logging
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path

from fastapi import FastAPI
from fastapi.concurrency import run_in_threadpool
from fastapi.responses import Response
from harmony_mobile.server.core.errors import FailureRun, install_error_handlers
from harmony_mobile.server.core.http_guards import GuardedHttpToolsProtocol
from harmony_mobile.server.core.infer_dispatch import INFER_PATHS, InferDispatch
from harmony_mobile.server.core.keys import load_or_create_admin_token, load_or_create_server_key
from harmony_mobile.server.core.limits import BodySizeLimitMiddleware
from harmony_mobile.server.core.metrics import MetricsMiddleware, ServerMetrics
from harmony_mobile.server.core.security import RateLimiter, TokenCache
from harmony_mobile.server.core.settings import Settings
from harmony_mobile.server.core.spec import install_openapi
from harmony_mobile.server.core.status_history import sample_of
from harmony_mobile.server.routes import admin, artifacts, devices, status, uploads, v2, v2_infer
from harmony_mobile.server.services.inference import MicroBatcher
from harmony_mobile.server.services.registry import BACKEND_IN_MODEL_DIR, ModelRegistry
from harmony_mobile.server.services.rounds import AlignmentWorker
from harmony_mobile.server.services.runtimes import make_runtime
from harmony_mobile.server.services.state import ServerState
from harmony_mobile.server.services.store import Store
from prometheus_client import CONTENT_TYPE_LATEST

from harmony_mobile.files import private_dir
from harmony_mobile.models import load_tiers

log = logging.getLogger("harmony_mobile.server")

MANIFEST_FILE = "manifest.json"
SIGNATURE_FILE = "manifest.sig"
P256_SIGNATURE_FILE = "manifest.p256.sig"

DESCRIPTION = """The harmony-mobile fallback server: KServe V2 inference on the aligned back-end,
device enrolment, sealed label-private feature uploads, alignment rounds and the model registry.
The wire protocol is specified in docs/PROTOCOL.md."""


def _read_manifest(model_dir: Path | None) -> tuple[str | None, str | None]:
    if model_dir is None or not (model_dir / MANIFEST_FILE).is_file():
        return None, None
    text = (model_dir / MANIFEST_FILE).read_bytes().decode("utf-8")
    signature_file = model_dir / SIGNATURE_FILE
    return text, signature_file.read_text() if signature_file.is_file() else None


def _manifest_fields(manifest_text: str | None) -> tuple[dict[str, str | None], str | None]:
    """The manifest's tier -> family table and model version, else the built-in tiers and None.
    The tier names are also the metric labels; a tier without a family entry maps to None."""
    if manifest_text is not None:
        try:
            manifest = json.loads(manifest_text)
            tiers = manifest.get("tiers", [])
            table = {
                t["name"]: t.get("family") if isinstance(t.get("family"), str) else None
                for t in tiers
                if isinstance(t, dict) and isinstance(t.get("name"), str)
            }
            version = manifest.get("model_version")
            if table:
                return table, version if isinstance(version, str) else None
        except (json.JSONDecodeError, AttributeError):
            log.warning("manifest.json is not a JSON object with tiers; using the default tier names")
    return {t.name: t.family for t in load_tiers().tiers}, None


def build_state(settings: Settings, metrics: ServerMetrics) -> ServerState:
    runtime = make_runtime(settings)  # first: a runtime that cannot run here stops before any file is made
    data_dir = private_dir(Path(settings.data_dir))  # the store holds uploads and token hashes
    url = settings.database_url.get_secret_value() if settings.database_url else None
    store = Store(data_dir, url)
    server_key = load_or_create_server_key(data_dir)
    registry = ModelRegistry(store, data_dir, runtime)
    if settings.model_dir is not None:
        imported = registry.import_backend(Path(settings.model_dir))
        if imported is None:
            log.warning("no back-end at %s", Path(settings.model_dir) / BACKEND_IN_MODEL_DIR)
    registry.load_default()
    manifest_text, manifest_signature = _read_manifest(settings.model_dir)
    tier_families, manifest_version = _manifest_fields(manifest_text)
    p256_signature_file = Path(settings.model_dir or ".") / P256_SIGNATURE_FILE
    manifest_p256_signature = (
        p256_signature_file.read_text()
        if manifest_text is not None and p256_signature_file.is_file()
        else None
    )
    admin_token = (
        settings.admin_token.get_secret_value()
        if settings.admin_token
        else load_or_create_admin_token(data_dir)
    )
    return ServerState(
        settings=settings,
        admin_token=admin_token,
        store=store,
        server_key=server_key,
        registry=registry,
        batcher=MicroBatcher(settings.max_batch, settings.max_wait_ms, settings.queue_size, metrics),
        alignment=AlignmentWorker(store, registry, server_key, metrics, settings.round_lease_seconds),
        metrics=metrics,
        rate_limiter=RateLimiter(settings.rate_limit_per_second, settings.rate_limit_burst),
        token_cache=TokenCache(settings.auth_cache_seconds),
        manifest_text=manifest_text,
        manifest_signature=manifest_signature,
        manifest_p256_signature=manifest_p256_signature,
        known_tiers=frozenset(tier_families),
        tier_families=tier_families,
        manifest_version=manifest_version,
    )


async def _check_default_version(state: ServerState) -> None:
    registry = state.registry
    current = registry.default()
    stored = await run_in_threadpool(state.store.default_version)
    if stored is not None and (current is None or current.version != stored):
        await run_in_threadpool(registry.load_default)
        log.info("now serving %s by default (changed in the shared store)", stored)


async def _follow_default_version(state: ServerState) -> None:
    """Replicas (and workers) share the store: serve the default version another process published
    or an operator set there, within `default_refresh_seconds`."""
    failures = FailureRun(log, "checking the default version in the store")
    while True:
        await asyncio.sleep(state.settings.default_refresh_seconds)
        try:
            await _check_default_version(state)
        except Exception as error:  # a store outage must not end the loop; the next tick retries
            failures.failed(error)
        else:
            failures.succeeded()


async def _sample_history(state: ServerState) -> None:
    """The status page's history: the whole server's counters every status_sample_seconds (read in
    the thread pool: with several workers that reads every worker's metric files)."""
    metrics = state.metrics
    while True:
        try:
            snapshot = await run_in_threadpool(metrics.snapshot)
            metrics.history.add(sample_of(snapshot))
        except Exception:  # a plot missing a point is better than a page without plots
            log.exception("sampling the status page's history failed")
        await asyncio.sleep(state.settings.status_sample_seconds)


def create_app(settings: Settings) -> FastAPI:
    metrics = ServerMetrics()
    state = build_state(settings, metrics)
    metrics.default_version.current = lambda: getattr(state.registry.default(), "version", None)

    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        state.registry.runtime.start()
        state.batcher.start()
        # every process sweeps expired round leases, also one that runs no rounds itself
        state.alignment.start()
        follower = asyncio.create_task(_follow_default_version(state))
        sampler = asyncio.create_task(_sample_history(state))
        try:
            yield
        finally:
            follower.cancel()
            sampler.cancel()
            state.batcher.stop()
            state.alignment.stop()
            state.store.close()

    app = FastAPI(
        title="harmony-mobile fallback server",
        version="1",
        description=DESCRIPTION,
        lifespan=lifespan,
        redirect_slashes=False,  # a path with a stray slash is 404, not a redirect clients must follow
    )
    app.state.harmony = state

    install_error_handlers(app)
    install_openapi(app)

    @app.api_route("/metrics", methods=["GET", "HEAD"], include_in_schema=False)
    def prometheus_metrics() -> Response:
        return Response(metrics.render(), media_type=CONTENT_TYPE_LATEST)

    # v2_infer first: its /v2/models/stats must win over /v2/models/{name}
    for module in (v2_infer, v2, devices, artifacts, uploads, admin, status):
        app.include_router(module.router)
    # Added first = innermost: the infer routes skip the router, behind the same limits and metrics.
    routes = {route.path: route for route in v2_infer.router.routes if route.path in INFER_PATHS}
    app.add_middleware(
        InferDispatch, handle=v2_infer.infer, routes=routes, exception_handlers=app.exception_handlers
    )
    # Added last = outermost: the metrics middleware also counts requests the body limit refuses.
    app.add_middleware(
        BodySizeLimitMiddleware,
        max_body_bytes=settings.max_body_bytes,
        body_timeout=settings.body_timeout_seconds,
    )
    GuardedHttpToolsProtocol.configure(
        settings.header_timeout_seconds, settings.max_connections, settings.retry_after_seconds
    )
    app.add_middleware(MetricsMiddleware, metrics=metrics)
    return app
