"""Server configuration: one pydantic-settings object, passed to `create_app` (env prefix HARMONY_)."""

from __future__ import annotations

from pathlib import Path
from typing import Literal

from pydantic import Field, SecretStr, field_validator
from pydantic_settings import BaseSettings, SettingsConfigDict

from harmony_mobile.protocol.wire import MAX_UPLOAD_ROWS

MODEL_NAME = "harmony-backend"


def database_scheme(url: str) -> str:
    """The database a store URL names, "sqlite" or "postgresql" (postgres:// is taken as postgresql://);
    ValueError for any other, whose message never holds the URL (nor so its password)."""
    scheme = url.partition("://")[0].partition("+")[0]
    scheme = "postgresql" if scheme == "postgres" else scheme
    if scheme not in ("sqlite", "postgresql"):
        named = repr(scheme) if scheme else "without a scheme"
        raise ValueError(f"unsupported database {named}: use sqlite:// or postgresql://user:pass@host/db")
    return scheme


class Settings(BaseSettings):
    """Everything the app needs; every limit is documented in docs/PROTOCOL.md and sent at enrolment."""

    model_config = SettingsConfigDict(env_prefix="HARMONY_", extra="forbid")

    data_dir: Path = Field(description="SQLite store, server key, content-addressed back-end versions")
    model_dir: Path | None = Field(
        default=None,
        description="export directory: backend/backend.pt (imported on start), manifest.json (+ .sig) served",
    )
    admin_token: SecretStr | None = Field(
        default=None, description="admin bearer token; None = read or create <data-dir>/admin_token (0600)"
    )
    database_url: SecretStr | None = Field(
        default=None,
        description="postgresql://user:pass@host/db to share the store between replicas;"
        " None = SQLite in <data-dir>/harmony.sqlite3",
    )
    run_alignment: bool = Field(
        default=True,
        description="this process accepts and runs alignment rounds (off: 409; keeps training off a"
        " serving replica)",
    )
    round_lease_seconds: float = Field(
        default=30.0,
        gt=0,
        description="an alignment round's lease, renewed every third of it by the process running it;"
        " a round whose lease expired (its process died) is marked interrupted by any process",
    )
    auth_cache_seconds: float = Field(
        default=2.0,
        ge=0,
        description="how long a device token lookup is reused; a revocation reaches other replicas within this",
    )
    default_refresh_seconds: float = Field(
        default=2.0, gt=0, description="how often the default version is re-read from the (shared) store"
    )
    model_name: str = MODEL_NAME

    @field_validator("data_dir")
    @classmethod
    def _a_directory(cls, value: Path) -> Path:
        if value.exists() and not value.is_dir():
            raise ValueError(f"{value} exists and is not a directory")
        return value

    @field_validator("database_url")
    @classmethod
    def _a_known_database(cls, value: SecretStr | None) -> SecretStr | None:
        if value is not None:
            database_scheme(value.get_secret_value())
        return value

    max_body_bytes: int = Field(default=8 * 1024 * 1024, ge=1024, description="413 above this")
    max_request_rows: int = Field(default=64, ge=1, description="feature rows per infer request")
    max_upload_rows: int = Field(default=MAX_UPLOAD_ROWS, ge=1, description="feature rows per sealed upload")

    max_batch: int = Field(default=32, ge=1, description="rows per micro-batch; 1 turns batching off")
    max_wait_ms: float = Field(default=2.0, ge=0, description="how long a micro-batch waits to fill")
    queue_size: int = Field(default=256, ge=1, description="queued infer requests before 503")
    retry_after_seconds: int = Field(default=1, ge=1, description="Retry-After on 503 and 429")

    rate_limit_per_second: float = Field(default=50.0, gt=0, description="per-device token bucket refill")
    rate_limit_burst: int = Field(default=100, ge=1, description="per-device token bucket size")

    header_timeout_seconds: float = Field(
        default=10.0, gt=0, description="a request's headers must arrive within this (408 and close)"
    )
    body_timeout_seconds: float = Field(
        default=30.0,
        gt=0,
        description="a request's whole body must arrive within this after its headers (408)",
    )
    max_connections: int = Field(default=1000, ge=1, description="open connections per process; more get 503")

    runtime: Literal["auto", "torch", "onnx"] = Field(
        default="auto",
        description="what runs the back-end: torch (backend.pt; needed for alignment rounds), onnx"
        " (backend.onnx through ONNX Runtime; a replica installed without torch), auto = torch if installed",
    )
    torch_threads: int | None = Field(default=None, ge=1, description="torch.set_num_threads on start")
    onnx_threads: int | None = Field(
        default=None, ge=1, description="ONNX Runtime intra-op threads per back-end (None: one per core)"
    )
    status_sample_seconds: float = Field(
        default=10.0,
        gt=0,
        description="how often the status page's history samples the server's counters (its plots over time)",
    )
