"""Run the server under uvicorn: one process, or `workers` processes sharing the port.

Settings come from the command line *only where the user gave a flag*; everything else is read from
the environment (HARMONY_*), then from the defaults in server/core/settings.py. With several workers
each process builds its own app from the environment (`app_from_environment`), so the flags given
are exported to it first, and their metrics go to a shared folder (prometheus-client's multiprocess
mode) so that `/metrics` and the status page count the whole server, not the worker that answered.
"""

from __future__ import annotations

import gc
import os
import shutil
import socket
from pathlib import Path
from typing import TYPE_CHECKING, Any

import uvicorn
from fastapi import FastAPI
from harmony_mobile.server.app import create_app
from harmony_mobile.server.core.metrics import MULTIPROCESS_ENV, process_is_running
from harmony_mobile.server.core.settings import Settings
from harmony_mobile.server.services.store import Store
from sqlalchemy.exc import SQLAlchemyError

from harmony_mobile.files import private_dir

if TYPE_CHECKING:
    from harmony_mobile.server.services.runtimes import Runtime

DEFAULT_DATA_DIR = "serve-data"
# By import path, not the class: uvicorn pickles its config into each worker process, and unpickling
# the class would import the whole server (torch included) before the worker starts answering the
# supervisor's health pings.
GUARDED_PROTOCOL = "harmony_mobile.server.core.http_guards:GuardedHttpToolsProtocol"
# uvicorn kills and replaces a worker that does not answer a health ping within this (its default, 5 s,
# is shorter than a worker's start on a busy machine: importing torch and loading the back-end).
WORKER_HEALTHCHECK_SECONDS = 60
ENV_PREFIX = "HARMONY_"
METRICS_DIR = "prometheus-multiproc"  # under the data dir: one folder per running `harmony serve`


class ModelDirError(ValueError):
    """The --model-dir (HARMONY_MODEL_DIR) export cannot be served; the message is one line."""


def check_model_dir(model_dir: Path | None, runtime: Runtime) -> None:
    """Refuse, before any process starts, an export the server cannot use: a missing directory, a
    back-end the runtime cannot serve (backend.pt for torch; for onnx, the backend.onnx converted
    from it), or a manifest or signature that is not UTF-8 text. An export without
    backend/backend.pt is served without inference (infer answers 503)."""
    if model_dir is None:
        return
    from harmony_mobile.server.app import MANIFEST_FILE, P256_SIGNATURE_FILE, SIGNATURE_FILE
    from harmony_mobile.server.services.backend_files import BackendFileError
    from harmony_mobile.server.services.registry import BACKEND_IN_MODEL_DIR, ONNX_IN_MODEL_DIR, sha256_file

    if not model_dir.is_dir():
        raise ModelDirError(
            f"model dir {model_dir} is not a directory (give the folder `harmony export` wrote)"
        )
    if (model_dir / "run.json").is_file() and not (model_dir / MANIFEST_FILE).is_file():
        raise ModelDirError(
            f"{model_dir} is a training run, not an export: serve the folder "
            f"`harmony export {model_dir} --out DIR` writes"
        )
    for name in (MANIFEST_FILE, SIGNATURE_FILE, P256_SIGNATURE_FILE):
        path = model_dir / name
        if path.is_file():
            try:
                path.read_bytes().decode("utf-8")
            except UnicodeDecodeError as error:
                raise ModelDirError(
                    f"{path} is not UTF-8 text ({error.reason} at byte {error.start})"
                ) from None
    source = model_dir / BACKEND_IN_MODEL_DIR
    if source.exists():
        sha = sha256_file(source) if source.is_file() else ""  # not a file: the runtime says so
        try:
            runtime.check_import(source, model_dir / ONNX_IN_MODEL_DIR, sha)
        except BackendFileError as error:
            raise ModelDirError(str(error)) from None


class LaunchError(ValueError):
    """The server cannot start as asked: the address is taken, the data dir or the store unusable."""


def check_can_start(settings: Settings, host: str, port: int) -> None:
    """Before anything is written or forked: the address is free, the data dir is (or can be made)
    owner-only and writable, and the store opens (a PostgreSQL server must be reachable)."""
    if port:
        _check_address_free(host, port)
    try:
        data_dir = private_dir(Path(settings.data_dir))
    except OSError as error:
        raise LaunchError(f"cannot use data dir {settings.data_dir}: {error.strerror or error}") from None
    if not os.access(data_dir, os.W_OK | os.X_OK):
        raise LaunchError(f"cannot write to data dir {data_dir}")
    url = settings.database_url.get_secret_value() if settings.database_url else None
    try:
        Store(data_dir, url).close()
    except (SQLAlchemyError, OSError) as error:
        reason = getattr(error, "orig", None) or error
        first_line = str(reason).strip().splitlines()[0] if str(reason).strip() else type(reason).__name__
        where = "PostgreSQL" if url is not None else f"SQLite in {data_dir}"
        raise LaunchError(f"cannot open the store ({where}): {first_line}") from None


def _check_address_free(host: str, port: int) -> None:
    try:
        family, kind, proto, _, address = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)[0]
        with socket.socket(family, kind, proto) as probe:
            probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # as uvicorn binds
            probe.bind(address)
    except OSError as error:
        raise LaunchError(f"cannot listen on {host}:{port}: {error.strerror or error}") from None


def resolve_settings(explicit: dict[str, Any]) -> Settings:
    """Settings from the flags the user set (None = not set), the environment, then the defaults."""
    given = {name: value for name, value in explicit.items() if value is not None}
    if "data_dir" not in given and f"{ENV_PREFIX}DATA_DIR" not in os.environ:
        given["data_dir"] = DEFAULT_DATA_DIR
    return Settings(**given)


def export_to_environment(settings: Settings, explicit: dict[str, Any]) -> None:
    """Worker processes read their settings from the environment: hand them the flags given here."""
    for name in settings.model_fields_set | {n for n, v in explicit.items() if v is not None}:
        value = getattr(settings, name)
        if value is None:
            continue
        if hasattr(value, "get_secret_value"):
            value = value.get_secret_value()
        os.environ[f"{ENV_PREFIX}{name.upper()}"] = (
            str(value).lower() if isinstance(value, bool) else str(value)
        )


def frozen(app: FastAPI) -> FastAPI:
    """The app, with what this server process has loaded so far frozen out of garbage collection: it
    lives as long as the process, and a full collection that walked it took 25-40 ms (over 200 ms
    with torch loaded), stalling every request in flight. Done here, where the process is the
    server's own, not in the app, which tests and other hosts run inside their processes."""
    gc.collect()  # start-up's own garbage is freed, not frozen with the rest
    gc.freeze()
    return app


def app_from_environment() -> FastAPI:
    """uvicorn factory for worker processes."""
    return frozen(create_app(Settings()))


def prepare_multiprocess_dir(data_dir: Path) -> Path:
    """An empty folder for this server's metric files, named by this (supervisor) process's id, so
    two servers sharing a data dir never sum or delete each other's; folders of servers no longer
    running are removed. Counts start at zero with each start, like a single process's."""
    root = Path(data_dir).resolve() / METRICS_DIR
    root.mkdir(parents=True, exist_ok=True)
    for folder in root.iterdir():
        if folder.name.isdigit() and not process_is_running(int(folder.name)):
            shutil.rmtree(folder, ignore_errors=True)
    path = root / str(os.getpid())
    shutil.rmtree(path, ignore_errors=True)
    path.mkdir()
    return path


def run(
    settings: Settings, explicit: dict[str, Any], host: str, port: int, workers: int, log_level: str
) -> None:
    common = dict(
        host=host,
        port=port,
        log_level=log_level,
        http=GUARDED_PROTOCOL,
        timeout_keep_alive=5,
        # uvicorn's own limit answers in plain text; ours (server/core/http_guards.py) answers JSON
        # and counts first
        limit_concurrency=None,
        access_log=False,
        # nothing reads the client address (no access log; rate limits are per device token), and
        # uvicorn's X-Forwarded-For handling parses it into an IP address on every request
        proxy_headers=False,
    )
    if workers == 1:
        uvicorn.run(frozen(create_app(settings)), workers=1, **common)
        return
    export_to_environment(settings, explicit)
    # read by prometheus_client when each worker imports it (workers are fresh interpreters)
    os.environ[MULTIPROCESS_ENV] = str(prepare_multiprocess_dir(settings.data_dir))
    uvicorn.run(
        "harmony_mobile.server.launch:app_from_environment",
        factory=True,
        workers=workers,
        timeout_worker_healthcheck=WORKER_HEALTHCHECK_SECONDS,
        **common,
    )
