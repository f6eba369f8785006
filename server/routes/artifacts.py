"""GET /v1/artifacts/{path}: the served manifest's artifacts, for phones that install it
(docs/PROTOCOL.md 2.3). What is served, and why nothing else can be: server/services/served_files.py."""

from __future__ import annotations

import hashlib
import logging
from pathlib import Path

from fastapi import APIRouter, HTTPException, Request, Response
from harmony_mobile.server.core.schemas import ErrorBody
from harmony_mobile.server.routes.deps import AnyPrincipalDep, StateDep

log = logging.getLogger("harmony_mobile.server")
router = APIRouter(prefix="/v1", tags=["devices"])
ERRORS = {code: {"model": ErrorBody} for code in (401, 403, 404, 503)}


@router.get(
    "/artifacts/{path:path}",
    responses={
        **ERRORS,
        200: {"content": {"application/octet-stream": {}}, "description": "the file, byte for byte"},
        304: {"description": "If-None-Match named this file's digest"},
    },
)
def artifact(path: str, request: Request, state: StateDep, _: AnyPrincipalDep) -> Response:
    """A file of the served manifest a phone loads (a tier artifact, an .mlpackage's file, a
    personalization program), byte for byte; its ETag is its sha256 from the manifest."""
    served = state.artifacts.get(path)
    if served is None:
        raise HTTPException(404, f"{path!r} is not an artifact of the served manifest")
    etag = f'"{served.sha256}"'
    if etag in [tag.strip() for tag in request.headers.get("if-none-match", "").split(",")]:
        return Response(status_code=304, headers={"ETag": etag})
    retry = {"Retry-After": str(state.settings.retry_after_seconds)}
    data = _read(Path(state.settings.model_dir), path, retry)
    if len(data) != served.size or hashlib.sha256(data).hexdigest() != served.sha256:
        # never serve bytes under a digest they do not have (the phone would refuse them); 503, not
        # 500: the model dir changed under a running server, which a restart or a redeploy fixes
        log.error("%s in the model dir no longer matches the served manifest", path)
        raise HTTPException(503, f"{path} on the server does not match the served manifest", retry)
    return Response(data, media_type="application/octet-stream", headers={"ETag": etag})


def _read(model_dir: Path, path: str, retry: dict[str, str]) -> bytes:
    try:
        return (model_dir / path).read_bytes()  # `path` is a key of the manifest's table, not user input
    except OSError as error:
        log.error("cannot read %s of the served manifest: %s", path, error)
        raise HTTPException(503, f"{path} of the served manifest is missing on the server", retry) from None
