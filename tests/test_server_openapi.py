"""server/openapi.json is the committed contract: it must be what the app generates today."""

import json
from pathlib import Path

from harmony_mobile.server.openapi import openapi_document

COMMITTED = Path(__file__).resolve().parents[1] / "server" / "openapi.json"


def test_committed_openapi_is_current():
    current = openapi_document()
    assert COMMITTED.read_text() == current, (
        "server/openapi.json is stale: run `python -m harmony_mobile.server.openapi > server/openapi.json`"
    )


def test_openapi_documents_every_endpoint_and_the_binary_body():
    schema = json.loads(COMMITTED.read_text())
    paths = schema["paths"]
    for path in (
        "/v2/health/live",
        "/v2/health/ready",
        "/v2/models/{name}",
        "/v2/models/{name}/versions/{version}",
        "/v2/models/{name}/versions/{version}/infer",
        "/v1/devices",
        "/v1/devices/{device_id}",
        "/v1/uploads",
        "/v1/alignment/rounds",
        "/v1/alignment/rounds/{round_id}",
        "/v1/registry/versions",
        "/v1/registry/default",
        "/v1/registry/rollback",
    ):
        assert path in paths, path
    infer_body = paths["/v2/models/{name}/versions/{version}/infer"]["post"]["requestBody"]["content"]
    assert set(infer_body) == {"application/json", "application/octet-stream"}
    assert "HTTPBearer" in schema["components"]["securitySchemes"]
    assert {"401", "404", "413", "422", "503"} <= set(paths["/v2/models/{name}/infer"]["post"]["responses"])
